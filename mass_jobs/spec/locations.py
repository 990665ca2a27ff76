"""Model locations and local paths in a run spec: relative ones made absolute against the spec's
folder, local model and chat-template locations checked, hub ids and S3 paths noted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.serving.model_dirs import looks_like_hub_id
from mass_jobs.spec.issues import SpecIssue, json_path

# ---------------------------------------------------------------- model locations and local paths


def model_locations(document: Any) -> list[tuple[list, str]]:
    """(JSON path parts, value) of every model location a spec names: model.base, model.tokenizer,
    sft.fp8_reference and the models of judges served here (endpoint 'local')."""
    if not isinstance(document, dict):
        return []
    out: list[tuple[list, str]] = []
    model = document.get("model")
    if isinstance(model, dict):
        out += [(["model", k], model[k]) for k in ("base", "tokenizer", "serve") if isinstance(model.get(k), str)]
    sft = document.get("sft")
    if isinstance(sft, dict) and isinstance(sft.get("fp8_reference"), str):
        out.append((["sft", "fp8_reference"], sft["fp8_reference"]))
    judges = document.get("judges")
    for i, j in enumerate(judges if isinstance(judges, list) else []):
        if isinstance(j, dict) and j.get("endpoint") == "local" and isinstance(j.get("model"), str):
            out.append((["judges", i, "model"], j["model"]))
    return out


def _is_local_path(value: str) -> bool:
    return not value.startswith(("s3://", "file://")) and bool(value)


def absolute_paths(document: Any, base: Path) -> Any:
    """A copy of `document` with relative model locations resolved against `base` (the spec's
    folder) where they exist there or look like paths ('./x', '../x'); see also `store_in_folder`.
    A relative value that does not exist there and looks like 'org/name' stays: a hub id."""
    import copy

    if not isinstance(document, dict):
        return document
    doc = copy.deepcopy(document)
    for parts, value in model_locations(doc):
        if value.startswith("file://"):
            value = value[len("file://") :]
        path = Path(value).expanduser()
        if not _is_local_path(value) or path.is_absolute():
            continue
        candidate = (base / path).resolve()
        if candidate.exists() or not looks_like_hub_id(value):
            _set(doc, parts, str(candidate))
    evaluation = doc.get("evaluation")
    embedder = evaluation.get("embedder") if isinstance(evaluation, dict) else None
    if (
        isinstance(embedder, str)
        and embedder not in ("hash", "minilm")
        and not Path(embedder).expanduser().is_absolute()
    ):
        evaluation["embedder"] = str((base / Path(embedder).expanduser()).resolve())
    model = doc.get("model")
    template = model.get("chat_template") if isinstance(model, dict) else None
    if isinstance(template, str) and template and not Path(template).expanduser().is_absolute():
        model["chat_template"] = str((base / Path(template).expanduser()).resolve())
    return doc


def store_in_folder(spec: RunSpec, base: Path) -> RunSpec:
    """A relative `file://` store resolved against `base` (the spec's folder), after validation so
    messages quote the URI as written."""
    root = spec.store.uri[len("file://") :] if spec.store.uri.startswith("file://") else None
    if not root or Path(root).expanduser().is_absolute():
        return spec
    return spec.model_copy(update={"store": spec.store.model_copy(update={"uri": f"file://{(base / root).resolve()}"})})


def _set(doc: Any, parts: list, value: Any) -> None:
    for p in parts[:-1]:
        doc = doc[p]
    doc[parts[-1]] = value


def model_location_issues(document: Any, base: Path | None) -> list[SpecIssue]:
    """A model location must be an existing directory, an s3:// URI or a hub id 'org/name[@rev]'.
    A hub-id-shaped value whose first part is a folder next to the spec is a mistyped path.
    `base` None (a spec read from s3://): local directories cannot be checked from here."""

    out: list[SpecIssue] = []
    for parts, value in model_locations(document):
        where = json_path(parts)
        if value.startswith("s3://"):
            bucket, _, key = value[len("s3://") :].partition("/")
            if not bucket or not key.strip("/"):
                out.append(SpecIssue(where, f"expected s3://bucket/key, found {value!r}"))
            continue
        if base is None or not Path(value).parts:  # "" (or "."): the schema's minLength names it
            continue
        path = Path(value[len("file://") :] if value.startswith("file://") else value).expanduser()
        if path.is_absolute():
            if path.is_dir():
                continue
            found = "a file" if path.exists() else "nothing"
            out.append(
                SpecIssue(
                    where,
                    f"expected a model directory, an s3:// URI or a hub id 'org/name', found {found} at {str(path)!r}",
                )
            )
            continue
        first = base / Path(value).parts[0]
        if looks_like_hub_id(value) and first.is_dir():
            out.append(
                SpecIssue(
                    where,
                    f"expected a model directory, found none at {str((base / value).resolve())!r} "
                    f"({str(first.resolve())!r} exists, so this is a path, not a hub id)",
                )
            )
        elif not looks_like_hub_id(value):
            out.append(
                SpecIssue(where, f"expected a model directory, an s3:// URI or a hub id 'org/name', found {value!r}")
            )
    return out


MAX_TEMPLATE_BYTES = 1 << 20


def read_template(path: str) -> str:
    """The template file's text: a regular file of at most 1 MiB of UTF-8 (ValueError otherwise)."""
    p = Path(path)
    if not p.is_file():
        found = "a directory" if p.is_dir() else "a special file" if p.exists() else "nothing"
        raise ValueError(f"expected a Jinja template file, found {found} at {str(p)!r}")
    if p.stat().st_size > MAX_TEMPLATE_BYTES:
        raise ValueError(f"{p}: expected at most {MAX_TEMPLATE_BYTES} bytes, found {p.stat().st_size}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{p}: expected UTF-8 text ({err.reason} at byte {err.start})") from None


def chat_template_issues(document: Any, base: Path | None) -> list[SpecIssue]:
    """model.chat_template: a regular, readable file of at most 1 MiB (its content is never quoted)."""
    model = document.get("model") if isinstance(document, dict) else None
    template = model.get("chat_template") if isinstance(model, dict) else None
    if base is None or not isinstance(template, str) or not template:
        return []
    try:
        read_template(template)
    except (ValueError, OSError) as err:
        return [SpecIssue("$.model.chat_template", str(err))]
    return []


def model_location_notes(spec: RunSpec) -> list[SpecIssue]:
    """What `mass validate` says of valid locations that are not local: where they come from."""
    notes = []
    for parts, value in model_locations(spec.model_dump(mode="json")):
        if value.startswith("s3://"):
            notes.append(SpecIssue(json_path(parts), f"{value}: fetched from S3 (not checked here)"))
        elif not Path(value).is_absolute():
            notes.append(SpecIssue(json_path(parts), f"{value!r} is not a directory; would be fetched from the Hub"))
    return notes
