"""Loading and validating run specs: the one entry point from user input to typed models.

    mass validate examples/tiny.yaml

Order: parse (YAML or JSON) -> JSON Schema (every error at once, each naming its JSON path,
what was expected and what was found) -> task files resolved and validated -> pydantic models
(defaults applied) -> cross-field rules. Nothing downstream re-validates; nothing downstream
builds a RunSpec from raw input any other way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from mass_jobs.models import SCHEMA_MODELS, RunSpec, Task, TaskFile, Workflow

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


@dataclass(frozen=True)
class SpecIssue:
    path: str  # JSON path, e.g. "$.collection.episodes"
    message: str  # "expected ..., found ..."

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A spec failed validation; `issues` holds every problem found, not just the first."""

    def __init__(self, source: str, issues: list[SpecIssue]):
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {i}" for i in issues)
        super().__init__(f"{source}: invalid run spec, {len(issues)} error(s):\n{lines}")


# ---------------------------------------------------------------- schemas


def generated_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a model, as checked in under schemas/ (closed, draft 2020-12)."""
    schema = SCHEMA_MODELS[name].model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://mass-jobs.dev/schemas/{name}.schema.json",
        **schema,
    }


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCHEMA_MODELS:
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(generated_schema(name), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


@lru_cache(maxsize=None)
def schema_validator(name: str) -> Draft202012Validator:
    """Validator over the checked-in schema file (the published contract), not the in-memory model."""
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


# ---------------------------------------------------------------- error formatting


def json_path(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _found(value: Any) -> str:
    text = json.dumps(value, default=str)
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "integer" if isinstance(value, int) else "number"
    )
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


def _issues_from_error(err: ValidationError, prefix: list) -> list[SpecIssue]:
    path = prefix + list(err.absolute_path)
    v = err.validator
    if v in ("anyOf", "oneOf") and err.context:
        # Report the branch that got furthest into the instance: that is the one the user meant.
        best = max(err.context, key=lambda e: (len(e.absolute_path), -len(str(e.message))))
        deepest = len(best.absolute_path)
        branch = [e for e in err.context if len(e.absolute_path) == deepest and e.relative_schema_path[0] == best.relative_schema_path[0]]
        if deepest > 0 or all(e.validator not in ("type",) for e in branch):
            out: list[SpecIssue] = []
            for e in branch:
                out.extend(_issues_from_error(e, prefix))
            return out
        expected = " or ".join(sorted({str(s.get("type", s.get("$ref", "?")).split("/")[-1]) for s in err.validator_value}))
        return [SpecIssue(json_path(path), f"expected {expected}, found {_found(err.instance)}")]
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return [
            SpecIssue(json_path(path + [k]), f"unknown key; expected one of: {', '.join(allowed)}") for k in extra
        ]
    if v == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return [SpecIssue(json_path(path + [k]), "required key is missing") for k in missing]
    if v == "type":
        return [SpecIssue(json_path(path), f"expected {err.validator_value}, found {_found(err.instance)}")]
    if v == "enum":
        opts = ", ".join(json.dumps(o) for o in err.validator_value)
        return [SpecIssue(json_path(path), f"expected one of {opts}, found {_found(err.instance)}")]
    if v == "const":
        return [SpecIssue(json_path(path), f"expected {json.dumps(err.validator_value)}, found {_found(err.instance)}")]
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if v in bounds:
        return [SpecIssue(json_path(path), f"expected a number {bounds[v]} {err.validator_value}, found {err.instance}")]
    if v in ("minLength", "maxLength"):
        word = "at least" if v == "minLength" else "at most"
        return [SpecIssue(json_path(path), f"expected a string of {word} {err.validator_value} characters, found {_found(err.instance)}")]
    if v in ("minItems", "maxItems"):
        word = "at least" if v == "minItems" else "at most"
        return [SpecIssue(json_path(path), f"expected {word} {err.validator_value} item(s), found {len(err.instance)}")]
    if v == "pattern":
        return [SpecIssue(json_path(path), f"expected a string matching {err.validator_value}, found {_found(err.instance)}")]
    return [SpecIssue(json_path(path), err.message)]


def schema_issues(name: str, document: Any, prefix: list | None = None) -> list[SpecIssue]:
    """Every schema violation of `document`, sorted by path, each naming expected and found."""
    issues: list[SpecIssue] = []
    for err in schema_validator(name).iter_errors(document):
        issues.extend(_issues_from_error(err, list(prefix or [])))
    unique = {(i.path, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.path, i.message))


# ---------------------------------------------------------------- parsing and task files


def parse_document(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)  # YAML is a superset of JSON: one parser for both
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(source, [SpecIssue("$", f"expected valid YAML or JSON{where}: {getattr(exc, 'problem', exc)}")])


def _read_local(base: Path) -> Callable[[str], str]:
    def read(ref: str) -> str:
        return (base / ref).read_text() if not Path(ref).is_absolute() else Path(ref).read_text()

    return read


def _load_task_file(ref: TaskFile, index: int, read: Callable[[str], str]) -> tuple[Task | None, list[SpecIssue]]:
    where = f"$.tasks[{index}].file"
    try:
        text = read(ref.file)
    except (OSError, KeyError) as exc:
        return None, [SpecIssue(where, f"expected a readable task file, found {ref.file!r} ({exc.__class__.__name__})")]
    if ref.format == "upstream":
        from mass_jobs.workflow import import_upstream

        try:
            prompt, workflow = import_upstream(text)
        except ValueError as exc:
            return None, [SpecIssue(where, f"expected an upstream MASS task ({exc})")]
        if ref.id is None or ref.split is None:
            return None, [SpecIssue(where, "expected `id` and `split` next to an upstream task file")]
        doc: Any = {"id": ref.id, "split": ref.split, "prompt": prompt, "workflow": workflow.model_dump(mode="json")}
    else:
        try:
            doc = parse_document(text, ref.file)
        except SpecError as exc:
            return None, [SpecIssue(where, f"{ref.file}: {i.message}") for i in exc.issues]
        if isinstance(doc, dict):
            doc = {**doc, **({"id": ref.id} if ref.id else {}), **({"split": ref.split} if ref.split else {})}
    issues = [SpecIssue(f"{where} ({ref.file}) {i.path}", i.message) for i in schema_issues("task", doc)]
    return (None if issues else Task.model_validate(doc)), issues


# ---------------------------------------------------------------- cross-field rules


def cross_field_issues(spec: RunSpec) -> list[SpecIssue]:
    out: list[SpecIssue] = []
    c = spec.collection
    if c.validation_rank != c.train_ranks + 1:
        out.append(SpecIssue("$.collection.validation_rank", f"expected train_ranks + 1 = {c.train_ranks + 1}, found {c.validation_rank}"))
    if c.episodes < c.validation_rank:
        out.append(SpecIssue("$.collection.episodes", f"expected >= validation_rank ({c.validation_rank}), found {c.episodes}"))
    r = spec.ranking
    if r.pairing == "reference" and r.comparisons_per_episode > c.episodes - 1:
        out.append(SpecIssue("$.ranking.comparisons_per_episode", f"expected <= episodes - 1 ({c.episodes - 1}), found {r.comparisons_per_episode}"))

    tasks = spec.resolved_tasks()
    seen: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.id in seen:
            out.append(SpecIssue(f"$.tasks[{i}].id", f"expected a unique task id, found {t.id!r} again (first at $.tasks[{seen[t.id]}])"))
        seen.setdefault(t.id, i)
    train_prompts = {t.prompt.strip(): t.id for t in tasks if t.split == "train"}
    for i, t in enumerate(tasks):
        if t.split == "test" and t.prompt.strip() in train_prompts:
            out.append(SpecIssue(f"$.tasks[{i}].prompt", f"expected train/test disjoint, found the same prompt as train task {train_prompts[t.prompt.strip()]!r}"))
    if not any(t.split == "train" for t in tasks):
        out.append(SpecIssue("$.tasks", "expected at least one task with split 'train', found none"))
    for i, t in enumerate(tasks):
        if t.workflow is not None:
            out.extend(workflow_issues(t.workflow, f"$.tasks[{i}].workflow"))

    s = spec.sft
    if s.context >= s.window:
        out.append(SpecIssue("$.sft.context", f"expected < window ({s.window}), found {s.context}"))
    m = spec.model.sampling
    if m.max_output_tokens > m.context_length:
        out.append(SpecIssue("$.model.sampling.max_output_tokens", f"expected <= context_length ({m.context_length}), found {m.max_output_tokens}"))
    if spec.execution.mode == "argo" and not spec.store.uri.startswith("s3://"):
        out.append(SpecIssue("$.store.uri", f"expected an s3:// URI when execution.mode is 'argo', found {spec.store.uri!r}"))
    names: set[str] = set()
    for i, j in enumerate(spec.judges):
        if j.name in names:
            out.append(SpecIssue(f"$.judges[{i}].name", f"expected a unique judge name, found {j.name!r} again"))
        names.add(j.name)
    return out


def workflow_issues(wf: Workflow, where: str) -> list[SpecIssue]:
    out: list[SpecIssue] = []
    ids = [a.id for a in wf.agents]
    for i, a in enumerate(ids):
        if a in ids[:i]:
            out.append(SpecIssue(f"{where}.agents[{i}].id", f"expected a unique agent id, found {a!r} again"))
    for i, h in enumerate(wf.hops):
        for key in ("caller", "callee", "on_failure"):
            value = getattr(h, key)
            if value is not None and value not in ids:
                out.append(SpecIssue(f"{where}.hops[{i}].{key}", f"expected one of the agent ids {ids}, found {value!r}"))
    return out


# ---------------------------------------------------------------- entry points


def validate_document(document: Any, source: str = "<spec>", read: Callable[[str], str] | None = None) -> RunSpec:
    """Validate a parsed spec; raise SpecError listing every issue. `read` loads task files by reference."""
    issues = schema_issues("run-spec", document)
    if issues:
        raise SpecError(source, issues)
    spec = RunSpec.model_validate(document)
    resolved: list[Task] = []
    for i, entry in enumerate(spec.tasks):
        if isinstance(entry, TaskFile):
            if read is None:
                issues.append(SpecIssue(f"$.tasks[{i}].file", "expected inline tasks (no base location to read task files from)"))
                continue
            task, task_issues = _load_task_file(entry, i, read)
            issues.extend(task_issues)
            if task:
                resolved.append(task)
        else:
            resolved.append(entry)
    if issues:
        raise SpecError(source, issues)
    spec = spec.model_copy(update={"tasks": resolved})
    issues = cross_field_issues(spec)
    if issues:
        raise SpecError(source, sorted(issues, key=lambda i: i.path))
    return spec


def load_spec(location: str | Path) -> RunSpec:
    """Load a spec from a local path or an s3:// URI (task files resolved next to it)."""
    location = str(location)
    if location.startswith("s3://"):
        from mass_jobs.store import open_store

        parent, _, name = location.rpartition("/")
        store = open_store(parent)
        text = store.get_bytes(name).decode()

        def read(ref: str) -> str:
            if ref.startswith("s3://"):
                p, _, n = ref.rpartition("/")
                return open_store(p).get_bytes(n).decode()
            return store.get_bytes(ref).decode()

    else:
        path = Path(location)
        if not path.is_file():
            raise SpecError(location, [SpecIssue("$", f"expected a spec file, found nothing at {location!r}")])
        text = path.read_text()
        read = _read_local(path.parent)
    return validate_document(parse_document(text, location), location, read)
