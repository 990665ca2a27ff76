"""Changes to a spec given beside it on the command line, applied to its document before validation.

    mass run examples/paper.yaml --set sft.parallel=fsdp --set collection.episodes=2
    mass plan examples/paper.yaml --overlay cluster-a100.yaml

`--overlay FILE` merges a YAML mapping into the spec (mappings key by key, any other value
replaces), in the order given; then each `--set PATH=VALUE` sets one value: PATH is dotted keys
(a number indexes a list: `tasks.0.prompt`), VALUE is read as YAML (`2`, `true`, `fsdp`, `[a, b]`).
Since they change the document itself, the input hashes, the run's claimed spec and every manifest
see them; a command has no flag of its own that changes what a step computes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mass_jobs.spec.bounds import parse_document, read_bounded
from mass_jobs.spec.issues import SpecError, SpecIssue


@dataclass(frozen=True)
class SpecSource:
    """A spec's location with the overrides given beside it; `load_spec` applies them, and
    `spec_flags` hands them on to a step the runner starts as a subprocess. Not a str, so no path
    operation or f-string drops the overrides: str() is the whole command-line form (`words`), and
    a use as a file path fails loudly (use `.location`)."""

    location: str
    overlays: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "location", str(self.location))
        object.__setattr__(self, "overlays", tuple(self.overlays))
        object.__setattr__(self, "sets", tuple(self.sets))

    def argv(self) -> list[str]:
        return [*(a for f in self.overlays for a in ("--overlay", f)), *(a for s in self.sets for a in ("--set", s))]

    def words(self) -> str:
        """The location and its overrides as a shell would take them."""
        import shlex

        return shlex.join([self.location, *self.argv()])

    def __str__(self) -> str:
        return self.words()


def spec_location(spec: str | Path | SpecSource) -> str:
    """Where the spec's document is (a path or an s3:// URI), without its overrides."""
    return spec.location if isinstance(spec, SpecSource) else str(spec)


def spec_words(spec: str | Path | SpecSource) -> str:
    """The location and its overrides as a shell would take them: what a hint must repeat, or the
    command it names opens another run (the spec file's own `name`, not the --set one)."""
    import shlex

    return spec.words() if isinstance(spec, SpecSource) else shlex.join([str(spec)])


def spec_flags(spec: str | Path | SpecSource) -> list[str]:
    """`--spec LOCATION` and the override flags a step started as a subprocess needs (none for a
    plain path or an Argo placeholder)."""
    return ["--spec", spec_location(spec), *(spec.argv() if isinstance(spec, SpecSource) else [])]


def merge(base: Any, overlay: Any) -> Any:
    """`overlay` onto `base`: mappings key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for k, v in overlay.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(overlay)


def set_value(document: Any, assignment: str, source: str) -> Any:
    """`document` with PATH=VALUE applied; SpecError naming the --set and what was expected."""
    path, eq, text = assignment.partition("=")
    keys = path.split(".") if path else []
    if not eq or not keys or any(not k for k in keys):
        raise SpecError(
            source,
            [SpecIssue("--set", f"expected PATH=VALUE with a dotted PATH (sft.parallel=fsdp), found {assignment!r}")],
            what="arguments",
        )
    value = parse_document(text or '""', f"--set {path}")
    out = copy.deepcopy(document) if isinstance(document, (dict, list)) else {}
    node = out
    for i, key in enumerate(keys):
        last, where = i == len(keys) - 1, ".".join(keys[: i + 1])
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise SpecError(
                    source,
                    [SpecIssue(f"--set {path}", f"expected an index below {len(node)} at {where}, found {key!r}")],
                    what="arguments",
                )
            key = int(key)
        elif not isinstance(node, dict):
            raise SpecError(
                source,
                [
                    SpecIssue(
                        f"--set {path}",
                        f"expected a mapping or a list at "
                        f"{'.'.join(keys[:i]) or 'the top'}, found "
                        f"{type(node).__name__}",
                    )
                ],
                what="arguments",
            )
        if last:
            node[key] = value
        else:
            if isinstance(node, dict) and node.get(key) is None:  # a section the spec leaves out
                node[key] = {}
            node = node[key]
    return out


def apply_overrides(document: Any, location: str) -> Any:
    """The spec document with the overlays and sets `location` carries (unchanged for a plain path)."""
    if not isinstance(location, SpecSource):
        return document
    for f in location.overlays:
        if not Path(f).is_file():
            raise SpecError(
                f, [SpecIssue("--overlay", f"expected a YAML file, found nothing at {f!r}")], what="arguments"
            )
        overlay = parse_document(read_bounded(Path(f), f), f)
        if not isinstance(overlay, dict):
            raise SpecError(
                f, [SpecIssue("--overlay", f"expected a mapping, found {type(overlay).__name__}")], what="arguments"
            )
        document = merge(document, overlay)
    for assignment in location.sets:
        document = set_value(document, assignment, str(location))
    return document
