"""The one validated entry point of a run spec: `load.load_spec(path_or_uri) -> RunSpec` and its
stages (`issues`, `bounds`, `rules`, `locations`); workflows as data and prompt text (`workflow`) and
the paper's task format (`upstream_format`, `upstream_tasks`). Above serving and store, whose tables it
checks a spec against."""
