"""Loading and validating run specs: the one entry point from user input to typed models.

    mass validate examples/tiny.yaml

Order: parse (YAML or JSON) -> relative model locations made absolute against the spec's folder
-> JSON Schema (every error at once, each naming its JSON path, what was expected and what was
found) -> model locations checked -> task files resolved and validated -> pydantic models
(defaults applied) -> cross-field rules -> a relative `file://` store made absolute against the
spec's folder. Every stage runs even when an earlier one found errors (on the document with the
invalid values left out), so one list holds them all. Nothing downstream re-validates; nothing
downstream builds a RunSpec from raw input any other way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.config.task_spec import Task, TaskFile
from mass_jobs.spec.bounds import MAX_SPEC_BYTES, decode_bounded, get_bounded, parse_document, read_bounded
from mass_jobs.spec.issues import SpecError, SpecIssue, found_text, json_path, schema_issues, schema_validator
from mass_jobs.spec.locations import absolute_paths, chat_template_issues, model_location_issues, store_in_folder
from mass_jobs.spec.overrides import SpecSource, apply_overrides, spec_location
from mass_jobs.spec.rules import cross_field_issues
from mass_jobs.spec.upstream_format import UPSTREAM_MARKER

# the entry points, and the error types every caller catches (the stages' helpers are their modules')
__all__ = ["SpecError", "SpecIssue", "load_spec", "validate_document"]


def model_issues(model, document: Any) -> list[SpecIssue]:
    """What pydantic rejects that the schema let through, as issues (never a traceback)."""
    from pydantic import ValidationError

    try:
        model.model_validate(document)
    except ValidationError as err:
        return [
            SpecIssue(
                json_path([p for p in e["loc"] if p not in ("Task", "TaskFile")]),
                f"{e['msg']}, found {found_text(e.get('input'))}",
            )
            for e in err.errors()
        ]
    return []


class TaskFileRefused(ValueError):
    """A task file reference that is never read (outside the spec's folder, a special file): its
    message names the reference, never the file's content."""


def _read_local(base: Path) -> Callable[..., str]:
    root = Path(os.path.realpath(base))

    def read(ref: str, outside: bool = False) -> str:
        path = Path(ref).expanduser()
        path = path if path.is_absolute() else base / path
        real = Path(os.path.realpath(path))
        if not outside and not real.is_relative_to(root):
            how = "a link out of it" if Path(os.path.abspath(path)).is_relative_to(root) else "a path outside it"
            raise TaskFileRefused(
                f"expected a task file inside the spec's folder, found {ref!r} ({how}): copy it "
                "there, or set outside_spec_folder: true next to `file:`"
            )
        return read_regular(real, ref)

    return read


def read_regular(path: Path, ref: str) -> str:
    """A task file's text, read only when it is a regular file: a FIFO would block the read, a
    device never end it."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a special file"
            )
            raise TaskFileRefused(f"expected a regular task file, found {ref!r}: {kind}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_SPEC_BYTES + 1)
    finally:
        os.close(fd)
    return decode_bounded(data, ref)


def _load_task_file(ref: TaskFile, index: int, read: Callable[..., str]) -> tuple[Task | None, list[SpecIssue]]:
    where = f"$.tasks[{index}].file"
    try:
        text = read(ref.file, outside=True) if ref.outside_spec_folder else read(ref.file)
    except TaskFileRefused as exc:
        return None, [SpecIssue(where, str(exc))]
    except (OSError, LookupError) as exc:  # LookupError: the store's MissingKey (a task file not uploaded)
        at = f" at {exc.filename!r}" if isinstance(exc, OSError) and exc.filename else ""
        return None, [
            SpecIssue(where, f"expected a readable task file, found {ref.file!r}{at} ({exc.__class__.__name__})")
        ]
    except SpecError as exc:  # too large or not UTF-8
        return None, [SpecIssue(where, f"{ref.file}: {i.message}") for i in exc.issues]
    if ref.format == "upstream":
        from mass_jobs.spec.upstream_format import import_upstream

        try:
            prompt, workflow = import_upstream(text)
        except ValueError as exc:
            return None, [SpecIssue(where, f"expected an upstream MASS task ({exc})")]
        missing = [key for key in ("id", "split") if getattr(ref, key) is None]
        if missing:
            return None, [
                SpecIssue(
                    f"$.tasks[{index}].{key}",
                    "required next to `format: upstream` (an upstream task file has no id or split of its own)",
                )
                for key in missing
            ]
        doc: Any = {"prompt": prompt, "workflow": workflow.model_dump(mode="json"), "upstream_text": text}
    else:
        try:
            doc = parse_document(text, ref.file)
        except SpecError as exc:
            return None, [SpecIssue(where, f"{ref.file}: {i.message}{_upstream_hint(ref, text)}") for i in exc.issues]
        if not isinstance(doc, dict) and _upstream_hint(ref, text):
            return None, [
                SpecIssue(
                    where,
                    f"{ref.file}: expected a task document (YAML/JSON object), found "
                    f"{found_text(doc)}{_upstream_hint(ref, text)}",
                )
            ]
    if isinstance(doc, dict):
        doc = {**doc, **task_overrides(ref)}
    issues = [
        SpecIssue(f"{where} ({ref.file}) {i.path}", i.message)
        for i in schema_issues("task", doc) or model_issues(Task, doc)
    ]
    return (None if issues else Task.model_validate(doc)), issues


def task_overrides(ref: TaskFile) -> dict[str, Any]:
    """The keys set next to `file:` (id, split, deliverables, guards, files): they replace the file's."""
    keys = ("id", "split", "deliverables", "guards", "files")
    return {k: v for k, v in ref.model_dump(mode="json", include=set(keys)).items() if v is not None}


def _upstream_hint(ref: TaskFile, text: str) -> str:
    """For a native task file that is really upstream MASS text: say how to load it."""

    if ref.format == "mass" and (ref.file.endswith(".txt") or UPSTREAM_MARKER in text):
        return (
            "; an upstream MASS task (text, then an agent list) needs `format: upstream` (with `id` and "
            "`split`) next to `file:`, or convert it: `mass import upstream DIR`"
        )
    return ""


# ---------------------------------------------------------------- every stage, one list


def _without_invalid(name: str, document: Any) -> tuple[Any, list[list]] | None:
    """`document` with every value the schema rejects left out (defaults take their place) and the
    paths of the objects that lost them; None when that cannot give a valid document (a required
    value or a list item is wrong), so later stages run only on what they can trust."""
    import copy

    doc = copy.deepcopy(document)
    touched: list[list] = []
    for err in schema_validator(name).iter_errors(document):
        path = list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            node = doc
            for p in path:
                node = node[p]
            for key in set(err.instance) - set(err.schema.get("properties", {})):
                node.pop(key, None)  # an unknown key changes nothing else: the object is not touched
        elif path and isinstance(path[-1], str):
            node = doc
            for p in path[:-1]:
                node = node[p]
            node.pop(path[-1], None)
            touched.append(path[:-1])
        else:
            return None
    if any(True for _ in schema_validator(name).iter_errors(doc)):
        return None
    return doc, touched


def later_stage_issues(document: Any, read: Callable[..., str] | None) -> list[SpecIssue]:
    """Task-file and cross-field issues of a document that failed the schema, found on the same
    document without its invalid values; issues about a sibling of a value that was left out are
    dropped (its default there would make them up)."""
    pruned = _without_invalid("run-spec", document)
    if pruned is None:
        return []
    doc, touched = pruned
    if model_issues(RunSpec, doc):
        return []
    objects = {json_path(p) for p in touched}
    _spec, issues = _typed_stages(doc, read)
    return [i for i in issues if _parent(i.path) not in objects]


def _parent(path: str) -> str:
    """'$.collection.episodes' -> '$.collection'; '$.tasks[0]' -> '$.tasks'; '$.x' -> '$'."""
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else "$"


# ---------------------------------------------------------------- entry points


def validate_document(
    document: Any, source: str = "<spec>", read: Callable[..., str] | None = None, base: Path | None = None
) -> RunSpec:
    """Validate a parsed spec; raise SpecError listing every issue of every stage. `read` loads task
    files by reference; `base` (the spec's folder) is where local model directories are checked."""
    schema = schema_issues("run-spec", document)
    early = schema + model_location_issues(document, base) + chat_template_issues(document, base)
    if schema:
        raise SpecError(source, _in_order(early + later_stage_issues(document, read)))
    typed = model_issues(RunSpec, document)  # what the schema passes but the models refuse (NaN, huge ints)
    if typed:
        raise SpecError(source, _in_order(early + typed))
    spec, later = _typed_stages(document, read)
    if early or later:
        raise SpecError(source, _in_order(early + later))
    return spec


def _in_order(issues: list[SpecIssue]) -> list[SpecIssue]:
    unique = {(i.path, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: i.path)


def _typed_stages(document: Any, read: Callable[..., str] | None) -> tuple[RunSpec, list[SpecIssue]]:
    """The stages after the schema: typed models, task files, cross-field rules (the task rules
    only when every task file loaded: with one missing they would misreport)."""
    spec = RunSpec.model_validate(document)
    issues: list[SpecIssue] = []
    resolved: list[Task] = []
    for i, entry in enumerate(spec.tasks):
        if isinstance(entry, TaskFile):
            if read is None:
                issues.append(
                    SpecIssue(f"$.tasks[{i}].file", "expected inline tasks (no base location to read task files from)")
                )
                continue
            task, task_issues = _load_task_file(entry, i, read)
            issues.extend(task_issues)
            if task:
                resolved.append(task)
        else:
            resolved.append(entry)
    spec = spec.model_copy(update={"tasks": resolved})
    cross = cross_field_issues(spec)
    if issues:
        cross = [i for i in cross if not i.path.startswith("$.tasks")]
    return spec, issues + cross


def load_spec(location: str | Path) -> RunSpec:
    """Load a spec from a local path or an s3:// URI (task files resolved next to it), with the
    overrides a SpecSource carries (spec/overrides.py) applied before anything is validated."""
    source = location if isinstance(location, SpecSource) else str(location)
    location = spec_location(location)
    if location.startswith("s3://"):
        from mass_jobs.store import open_store

        parent, _, name = location.rpartition("/")
        store = open_store(parent)
        text = get_bounded(store, name, location)

        def read(ref: str, outside: bool = False) -> str:
            if ref.startswith("s3://"):
                p, _, n = ref.rpartition("/")
                return get_bounded(open_store(p), n, ref)
            if Path(ref).is_absolute() or ".." in Path(ref).parts:
                raise TaskFileRefused(
                    f"expected a task file relative to the spec's S3 folder {parent + '/'!r} "
                    f"(or an s3:// URI), found the local path {ref!r}"
                )
            return get_bounded(store, ref, ref)

    else:
        path = Path(location)
        if not path.is_file():
            raise SpecError(location, [SpecIssue("$", f"expected a spec file, found nothing at {location!r}")])
        text = read_bounded(path, location)
        read = _read_local(path.parent)
        folder = path.parent.resolve()
        document = apply_overrides(parse_document(text, source), source)
        spec = validate_document(absolute_paths(document, folder), location, read, folder)
        return store_in_folder(spec, folder)
    return validate_document(apply_overrides(parse_document(text, location), source), location, read)
