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

import json
import os
import math
import re
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
    """Input failed validation; `issues` holds every problem found, not just the first. `what` names
    the input in the heading (a run spec unless said: command-line arguments, a task directory)."""

    def __init__(self, source: str, issues: list[SpecIssue], what: str = "run spec"):
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {i}" for i in issues)
        super().__init__(f"{source}: invalid {what}, {len(issues)} error(s):\n{lines}")


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
    for p in parts:  # a lone surrogate in a key is shown escaped, so the error can always be printed
        out += f"[{p}]" if isinstance(p, int) else f".{str(p).encode('utf-8', 'backslashreplace').decode()}"
    return out


def _found(value: Any) -> str:
    text = json.dumps(value, default=str)
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "integer" if isinstance(value, int) else "number"
    )
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


def _yaml_number_hint(expected: str, value: Any) -> str:
    """YAML 1.1 reads an exponent without a dot and a signed exponent (`4e-3`, `1.0e3`) as a string:
    say so where a number was expected."""
    if "number" not in expected and "integer" not in expected or not isinstance(value, str):
        return ""
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
        return ""
    return f" (YAML reads {value} as a string: write the number with a dot and a signed exponent, e.g. {float(value)!r})"


def _fit(branch: dict, instance: dict, root: dict | None) -> float:
    """How well one union branch's object schema fits an object: the keys it knows, plus half a point
    for each unknown key close to one of its keys (a typo of it); -1 when it is no object schema."""
    import difflib

    ref = branch.get("$ref", "") if isinstance(branch, dict) else ""
    if ref.startswith("#/") and root is not None:
        branch = root
        for part in ref[2:].split("/"):
            branch = branch.get(part, {}) if isinstance(branch, dict) else {}
    props = list(branch.get("properties", {})) if isinstance(branch, dict) else []
    if not props:
        return -1
    typos = [k for k in instance if k not in props and difflib.get_close_matches(str(k), props, n=1, cutoff=0.75)]
    return sum(k in props for k in instance) + 0.5 * len(typos)


def _issues_from_error(err: ValidationError, prefix: list, root: dict | None = None) -> list[SpecIssue]:
    path = prefix + list(err.absolute_path)
    v = err.validator
    if v in ("anyOf", "oneOf") and err.context:
        # An object is reported against the branch that knows most of its keys (an inline task with
        # a typo is a task, not a task file); otherwise against the branch that got furthest into it.
        by_branch: dict = {}
        for e in err.context:
            by_branch.setdefault(e.relative_schema_path[0], []).append(e)
        if isinstance(err.instance, dict) and len(by_branch) > 1:
            fit = {i: _fit(err.validator_value[i], err.instance, root) for i in by_branch}
            ranked = sorted(fit, key=fit.get, reverse=True)
            if fit[ranked[0]] > fit[ranked[1]]:
                return [i for e in by_branch[ranked[0]] for i in _issues_from_error(e, prefix, root)]
        # a value given for a nullable field is reported against its non-null branch
        context = [e for e in err.context if not (e.validator == "type" and e.validator_value == "null")]
        context = context if err.instance is not None and context else list(err.context)
        best = max(context, key=lambda e: (len(e.absolute_path), -len(str(e.message))))
        deepest = len(best.absolute_path)
        branch = [e for e in context if len(e.absolute_path) == deepest and e.relative_schema_path[0] == best.relative_schema_path[0]]
        if deepest > 0 or all(e.validator not in ("type",) for e in branch):
            out: list[SpecIssue] = []
            for e in branch:
                out.extend(_issues_from_error(e, prefix, root))
            return out
        expected = " or ".join(sorted({str(s.get("type", s.get("$ref", "?")).split("/")[-1]) for s in err.validator_value}))
        return [SpecIssue(json_path(path), f"expected {expected}, found {_found(err.instance)}"
                                           f"{_yaml_number_hint(expected, err.instance)}")]
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
        return [SpecIssue(json_path(path), f"expected {err.validator_value}, found {_found(err.instance)}"
                                           f"{_yaml_number_hint(str(err.validator_value), err.instance)}")]
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
    validator = schema_validator(name)
    for err in validator.iter_errors(document):
        issues.extend(_issues_from_error(err, list(prefix or []), validator.schema))
    unique = {(i.path, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.path, i.message))


# ---------------------------------------------------------------- parsing and task files


def parse_document(text: str, source: str) -> Any:
    """YAML or JSON (YAML is a superset: one parser for both) within the input bounds below."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecIssue("$", f"expected a document of at most {MAX_SPEC_BYTES} bytes, "
                                                f"found {len(text.encode('utf-8', 'surrogatepass'))}")])
    try:
        document = _bounded_load(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(source, [SpecIssue("$", f"expected valid YAML or JSON{where}: {getattr(exc, 'problem', exc)}")])
    issues = _value_issues(document)
    if issues:
        raise SpecError(source, issues)
    return document


# ---------------------------------------------------------------- hostile input: bounds before any work
# A spec (or task file) is parsed within fixed bounds, so every input ends in a listed error within
# seconds: no alias bomb expands, no nesting overflows the stack, no integer takes seconds to parse.

MAX_SPEC_BYTES = 4 << 20  # one spec or task file; the paper's whole task set is far smaller
MAX_DEPTH = 32  # nested mappings/sequences (a spec needs about 8)
MAX_ALIASES = 64  # YAML alias references (*name)
MAX_NODES = 200_000  # values after expanding aliases
MAX_INT_DIGITS = 30


class _Limit(Exception):
    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path, self.message = path, message


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that bounds nesting and aliases while composing, before anything is built."""

    def __init__(self, text: str):
        super().__init__(text)
        self._path: list = []
        self._aliases = 0

    def compose_node(self, parent, index):
        key = index.value if isinstance(index, yaml.ScalarNode) else index
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Limit(json_path(self._path + [key] if parent is not None else self._path),
                             f"expected at most {MAX_ALIASES} YAML aliases, found more")
            return super().compose_node(parent, index)
        if parent is not None:
            self._path.append(key)
        try:
            if len(self._path) > MAX_DEPTH:
                raise _Limit(json_path(self._path[:MAX_DEPTH]), f"expected nesting at most {MAX_DEPTH} levels deep, found deeper")
            return super().compose_node(parent, index)
        finally:
            if parent is not None:
                self._path.pop()


# Dates stay text (a spec has no timestamps; `name: 2026-01-01` is a string).
_SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


def _node_issues(root: yaml.Node) -> list[SpecIssue]:
    """Duplicate or non-string keys and overlong integers, by path; aliases expanded up to MAX_NODES."""
    issues: list[SpecIssue] = []
    stack, seen = [(root, [])], 0
    while stack:
        node, path = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return issues + [SpecIssue(json_path(path), f"expected at most {MAX_NODES} values after expanding "
                                                        "YAML aliases, found more (an alias bomb)")]
        if len(path) > MAX_DEPTH:  # nesting reached through aliases (or an alias cycle)
            return issues + [SpecIssue(json_path(path[:MAX_DEPTH]), f"expected nesting at most {MAX_DEPTH} levels "
                                                                    "deep after expanding YAML aliases, found deeper")]
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for key, value in node.value:
                if key.tag == "tag:yaml.org,2002:merge":
                    stack.append((value, path))
                    continue
                if not (isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:str"):
                    shown = key.value if isinstance(key, yaml.ScalarNode) else key.id
                    issues.append(SpecIssue(json_path(path), f"expected string keys, found {shown!r} ({key.tag.rsplit(':', 1)[-1]})"))
                    continue
                if key.value in keys:
                    issues.append(SpecIssue(json_path(path + [key.value]), f"expected each key once, found it again at "
                                                                           f"line {key.start_mark.line + 1} (first at line {keys[key.value]})"))
                keys.setdefault(key.value, key.start_mark.line + 1)
                stack.append((value, path + [key.value]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path + [i]) for i, item in enumerate(node.value))
        elif node.tag == "tag:yaml.org,2002:int" and len(node.value.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
            digits = len(node.value.lstrip("+-").replace("_", ""))  # 0x / 0b / 0o prefixes count too
            issues.append(SpecIssue(json_path(path), f"expected an integer of at most {MAX_INT_DIGITS} digits, found {digits} digits"))
    return sorted(issues, key=lambda i: i.path)


def _bounded_load(text: str, source: str) -> Any:
    loader = _SpecLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except _Limit as exc:
            raise SpecError(source, [SpecIssue(exc.path, exc.message)]) from None
        if node is None:
            return None
        issues = _node_issues(node)
        if issues:
            raise SpecError(source, issues)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _value_issues(document: Any, path: list | None = None) -> list[SpecIssue]:
    """Non-finite numbers (.nan, .inf, 1e400) and lone surrogates ("\\ud800") anywhere: no field takes one."""
    issues, stack = [], [(document, path or [])]
    while stack:
        value, where = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            issues.append(SpecIssue(json_path(where), f"expected a finite number, found {value}"))
        elif isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
            issues.append(SpecIssue(json_path(where), "expected valid Unicode text, found a lone surrogate"))
        elif isinstance(value, dict):
            stack.extend((v, where + [k]) for k, v in value.items())
            stack.extend((k, where + [k]) for k in value if isinstance(k, str))
        elif isinstance(value, list):
            stack.extend((v, where + [i]) for i, v in enumerate(value))
    return sorted(issues, key=lambda i: i.path)


def read_bounded(path: Path, source: str) -> str:
    """A spec or task file as text: at most MAX_SPEC_BYTES, UTF-8 (the offending byte named otherwise)."""
    with open(path, "rb") as f:
        data = f.read(MAX_SPEC_BYTES + 1)
    return decode_bounded(data, source)


def decode_bounded(data: bytes, source: str) -> str:
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecIssue("$", f"expected a document of at most {MAX_SPEC_BYTES} bytes, found more")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(source, [SpecIssue("$", f"expected UTF-8 text, found byte 0x{data[exc.start]:02x} "
                                                f"at offset {exc.start}")]) from None


def get_bounded(store, key: str, source: str) -> str:
    """A spec or task file from a store: its size is checked (one HEAD) before it is read."""
    if store.stat(key)[0] > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecIssue("$", f"expected a document of at most {MAX_SPEC_BYTES} bytes, found more")])
    return decode_bounded(store.get_bytes(key), source)


def model_issues(model, document: Any) -> list[SpecIssue]:
    """What pydantic rejects that the schema let through, as issues (never a traceback)."""
    from pydantic import ValidationError

    try:
        model.model_validate(document)
    except ValidationError as err:
        return [SpecIssue(json_path([p for p in e["loc"] if p not in ("Task", "TaskFile")]),
                          f"{e['msg']}, found {_found(e.get('input'))}") for e in err.errors()]
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
            raise TaskFileRefused(f"expected a task file inside the spec's folder, found {ref!r} ({how}): copy it "
                                  "there, or set outside_spec_folder: true next to `file:`")
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
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                    "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a special file")
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
        return None, [SpecIssue(where, f"expected a readable task file, found {ref.file!r}{at} ({exc.__class__.__name__})")]
    except SpecError as exc:  # too large or not UTF-8
        return None, [SpecIssue(where, f"{ref.file}: {i.message}") for i in exc.issues]
    if ref.format == "upstream":
        from mass_jobs.upstream_format import import_upstream

        try:
            prompt, workflow = import_upstream(text)
        except ValueError as exc:
            return None, [SpecIssue(where, f"expected an upstream MASS task ({exc})")]
        missing = [key for key in ("id", "split") if getattr(ref, key) is None]
        if missing:
            return None, [SpecIssue(f"$.tasks[{index}].{key}", "required next to `format: upstream` (an upstream "
                                    "task file has no id or split of its own)") for key in missing]
        doc: Any = {"prompt": prompt, "workflow": workflow.model_dump(mode="json")}
    else:
        try:
            doc = parse_document(text, ref.file)
        except SpecError as exc:
            return None, [SpecIssue(where, f"{ref.file}: {i.message}{_upstream_hint(ref, text)}") for i in exc.issues]
        if not isinstance(doc, dict) and _upstream_hint(ref, text):
            return None, [SpecIssue(where, f"{ref.file}: expected a task document (YAML/JSON object), found "
                                    f"{_found(doc)}{_upstream_hint(ref, text)}")]
    if isinstance(doc, dict):
        doc = {**doc, **task_overrides(ref)}
    issues = [SpecIssue(f"{where} ({ref.file}) {i.path}", i.message) for i in schema_issues("task", doc) or model_issues(Task, doc)]
    return (None if issues else Task.model_validate(doc)), issues


def task_overrides(ref: TaskFile) -> dict[str, Any]:
    """The keys set next to `file:` (id, split, deliverables, guards, files): they replace the file's."""
    keys = ("id", "split", "deliverables", "guards", "files")
    return {k: v for k, v in ref.model_dump(mode="json", include=set(keys)).items() if v is not None}


def _upstream_hint(ref: TaskFile, text: str) -> str:
    """For a native task file that is really upstream MASS text: say how to load it."""
    from mass_jobs.upstream_format import UPSTREAM_MARKER

    if ref.format == "mass" and (ref.file.endswith(".txt") or UPSTREAM_MARKER in text):
        return ("; an upstream MASS task (text, then an agent list) needs `format: upstream` (with `id` and "
                "`split`) next to `file:`, or convert it: `mass import upstream DIR`")
    return ""


# ---------------------------------------------------------------- cross-field rules


def cross_field_issues(spec: RunSpec) -> list[SpecIssue]:
    out: list[SpecIssue] = []
    embedder = spec.evaluation.embedder
    try:
        model_dir = embedder in ("hash", "minilm") or (Path(embedder) / "config.json").is_file()
    except OSError:  # a name too long for a path: no model dir
        model_dir = False
    if not model_dir:
        out.append(SpecIssue("$.evaluation.embedder", f"expected 'hash', 'minilm' or a model dir with config.json, "
                                                     f"found {_found(embedder)}"))
    c = spec.collection
    if c.validation_rank != c.train_ranks + 1:
        out.append(SpecIssue("$.collection.validation_rank", f"expected train_ranks + 1 = {c.train_ranks + 1}, found {c.validation_rank}"))
    if c.episodes < c.validation_rank:
        out.append(SpecIssue("$.collection.episodes", f"expected >= validation_rank ({c.validation_rank}), found {c.episodes}"))
    if c.teacher == "single" and spec.execution.harness != "builtin":
        out.append(SpecIssue("$.collection.teacher", f"expected 'team' with harness {spec.execution.harness!r} "
                             "('single' runs on the builtin harness), found 'single'"))
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
    for i, t in enumerate(tasks):
        out.extend(workspace_path_issues(t, f"$.tasks[{i}]"))

    s = spec.sft
    if s.context >= s.window:
        out.append(SpecIssue("$.sft.context", f"expected < window ({s.window}), found {s.context}"))
    out.extend(composition_issues(spec))
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
    return out + serving_issues(spec)


def serving_issues(spec: RunSpec) -> list[SpecIssue]:
    """execution.serving needs what it serves with: vLLM installed here (local runs only: Argo runs
    serve with KServe), or for `external` an endpoint for every role."""
    from mass_jobs.roles import ROLES

    ex, out = spec.execution, []
    if ex.serving == "vllm" and ex.mode == "local":
        from mass_jobs.backends import vllm_missing_reason

        if reason := vllm_missing_reason():
            out.append(SpecIssue("$.execution.serving", reason))
    if ex.serving == "external":
        for role in ROLES:
            if getattr(spec.roles, role) is None:
                out.append(SpecIssue(f"$.roles.{role}", "expected an endpoint (roles.<role>: endpoint, model) "
                                                        "when execution.serving is 'external', found none"))
    if ex.continuous_batching and ex.serving != "embedded":
        out.append(SpecIssue("$.execution.continuous_batching", f"expected false unless execution.serving is "
                                                                f"'embedded', found true with {ex.serving!r}"))
    if ex.vllm.max_model_len is not None and spec.model.sampling.context_length > ex.vllm.max_model_len:
        out.append(SpecIssue("$.model.sampling.context_length", f"expected at most execution.vllm.max_model_len "
                                                                f"({ex.vllm.max_model_len}), found {spec.model.sampling.context_length}"))
    return out


def composition_issues(spec: RunSpec) -> list[SpecIssue]:
    """A preset fixes the share and the selection; panel selection needs judges and held-out tasks."""
    from mass_jobs.composition import composition_of

    out: list[SpecIssue] = []
    s = spec.sft
    if s.preset is not None:
        defaults = type(s)()
        for name in ("orchestrator_share", "checkpoint_selection"):
            if getattr(s, name) != getattr(defaults, name):  # by value: a dumped spec lists defaults too
                out.append(SpecIssue(f"$.sft.{name}", f"expected no {name} with sft.preset {s.preset!r} (the preset "
                                     f"fixes it), found {getattr(s, name)!r}"))
    if composition_of(s).checkpoint != "panel":
        return out
    why = f"sft.preset {s.preset!r}" if s.preset else "checkpoint_selection 'panel'"
    if s.panel is None:
        out.append(SpecIssue("$.sft.panel", f"expected panel settings (tasks, rollouts, checkpoints) with {why}, found none"))
    if not spec.judges:
        out.append(SpecIssue("$.judges", f"expected at least one judge with {why}, found none"))
    splits = {t.id: t.split for t in spec.resolved_tasks()}
    for i, t in enumerate(s.panel.tasks if s.panel else []):
        if splits.get(t) != "test":
            found = f"a {splits[t]!r} task" if t in splits else "no such task"
            out.append(SpecIssue(f"$.sft.panel.tasks[{i}]", f"expected the id of a held-out task (split 'test'), found "
                                 f"{t!r} ({found})"))
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


# ---------------------------------------------------------------- model locations and local paths


def model_locations(document: Any) -> list[tuple[list, str]]:
    """(JSON path parts, value) of every model location a spec names: model.base, model.tokenizer
    and the models of judges served here (endpoint 'local')."""
    if not isinstance(document, dict):
        return []
    out: list[tuple[list, str]] = []
    model = document.get("model")
    if isinstance(model, dict):
        out += [(["model", k], model[k]) for k in ("base", "tokenizer") if isinstance(model.get(k), str)]
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

    from mass_jobs.modelio import looks_like_hub_id

    if not isinstance(document, dict):
        return document
    doc = copy.deepcopy(document)
    for parts, value in model_locations(doc):
        if value.startswith("file://"):
            value = value[len("file://"):]
        path = Path(value).expanduser()
        if not _is_local_path(value) or path.is_absolute():
            continue
        candidate = (base / path).resolve()
        if candidate.exists() or not looks_like_hub_id(value):
            _set(doc, parts, str(candidate))
    evaluation = doc.get("evaluation")
    embedder = evaluation.get("embedder") if isinstance(evaluation, dict) else None
    if isinstance(embedder, str) and embedder not in ("hash", "minilm") and not Path(embedder).expanduser().is_absolute():
        evaluation["embedder"] = str((base / Path(embedder).expanduser()).resolve())
    model = doc.get("model")
    template = model.get("chat_template") if isinstance(model, dict) else None
    if isinstance(template, str) and template and not Path(template).expanduser().is_absolute():
        model["chat_template"] = str((base / Path(template).expanduser()).resolve())
    return doc


def store_in_folder(spec: RunSpec, base: Path) -> RunSpec:
    """A relative `file://` store resolved against `base` (the spec's folder), after validation so
    messages quote the URI as written."""
    root = spec.store.uri[len("file://"):] if spec.store.uri.startswith("file://") else None
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
    from mass_jobs.modelio import looks_like_hub_id

    out: list[SpecIssue] = []
    for parts, value in model_locations(document):
        where = json_path(parts)
        if value.startswith("s3://"):
            bucket, _, key = value[len("s3://"):].partition("/")
            if not bucket or not key.strip("/"):
                out.append(SpecIssue(where, f"expected s3://bucket/key, found {value!r}"))
            continue
        if base is None or not Path(value).parts:  # "" (or "."): the schema's minLength names it
            continue
        path = Path(value[len("file://"):] if value.startswith("file://") else value).expanduser()
        if path.is_absolute():
            if path.is_dir():
                continue
            found = "a file" if path.exists() else "nothing"
            out.append(SpecIssue(where, f"expected a model directory, an s3:// URI or a hub id 'org/name', "
                                        f"found {found} at {str(path)!r}"))
            continue
        first = base / Path(value).parts[0]
        if looks_like_hub_id(value) and first.is_dir():
            out.append(SpecIssue(where, f"expected a model directory, found none at {str((base / value).resolve())!r} "
                                        f"({str(first.resolve())!r} exists, so this is a path, not a hub id)"))
        elif not looks_like_hub_id(value):
            out.append(SpecIssue(where, f"expected a model directory, an s3:// URI or a hub id 'org/name', "
                                        f"found {value!r}"))
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


MAX_PATH_BYTES = 1024


def _workspace_path_problem(path: str) -> str | None:
    if not path or "\x00" in path:
        return "expected a workspace-relative path, found an empty one or a NUL byte"
    if path.startswith(("/", "~")) or ".." in path.replace("\\", "/").split("/"):
        return f"expected a path inside the workspace (relative, no '..'), found {path!r}"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"expected a path of at most {MAX_PATH_BYTES} bytes, found {len(path.encode('utf-8', 'surrogatepass'))}"
    return None


def workspace_path_issues(task: Task, where: str) -> list[SpecIssue]:
    """Seed files, deliverables and guarded paths must stay inside the workspace: harness, guards and
    the sandbox join them onto it, so `..` or an absolute path would reach (or seed) the host."""
    g = task.guards
    named = [(f"{where}.files.{p}", p) for p in task.files]
    named += [(f"{where}.deliverables[{k}]", p) for k, p in enumerate(task.deliverables)]
    named += [(f"{where}.expect.{p}", p) for p in task.expect]
    named += [(f"{where}.guards.required_outputs[{k}]", p) for k, p in enumerate(g.required_outputs)]
    named += [(f"{where}.guards.protected_paths[{k}]", p) for k, p in enumerate(g.protected_paths)]
    named += [(f"{where}.guards.metrics[{k}].file", m.file) for k, m in enumerate(g.metrics)]
    issues = [SpecIssue(at, problem) for at, p in named if (problem := _workspace_path_problem(p))]
    issues += [SpecIssue(f"{where}.expect.{p}", f"expected one of the task's deliverables {task.deliverables}, found {p!r}")
               for p in task.expect if p not in task.deliverables]
    return issues


# ---------------------------------------------------------------- entry points


def validate_document(document: Any, source: str = "<spec>", read: Callable[..., str] | None = None,
                      base: Path | None = None) -> RunSpec:
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
                issues.append(SpecIssue(f"$.tasks[{i}].file", "expected inline tasks (no base location to read task files from)"))
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
    """Load a spec from a local path or an s3:// URI (task files resolved next to it)."""
    location = str(location)
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
                raise TaskFileRefused(f"expected a task file relative to the spec's S3 folder {parent + '/'!r} "
                                      f"(or an s3:// URI), found the local path {ref!r}")
            return get_bounded(store, ref, ref)

    else:
        path = Path(location)
        if not path.is_file():
            raise SpecError(location, [SpecIssue("$", f"expected a spec file, found nothing at {location!r}")])
        text = read_bounded(path, location)
        read = _read_local(path.parent)
        folder = path.parent.resolve()
        spec = validate_document(absolute_paths(parse_document(text, location), folder), location, read, folder)
        return store_in_folder(spec, folder)
    return validate_document(parse_document(text, location), location, read)
