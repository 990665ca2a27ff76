"""A run spec's problems as issues: each names its JSON path, what was expected and what was
found; the generated JSON Schemas the first stage checks against (`mass schema`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from mass_jobs.config.run_spec import SCHEMA_MODELS

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


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


@cache
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


def found_text(value: Any) -> str:
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
    return (
        f" (YAML reads {value} as a string: write the number with a dot and a signed exponent, e.g. {float(value)!r})"
    )


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


def _branch_issues(err: ValidationError, path: list, prefix: list, root: dict | None) -> list[SpecIssue]:
    """An anyOf/oneOf error, told against the branch the value was meant for."""
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
    branch = [
        e
        for e in context
        if len(e.absolute_path) == deepest and e.relative_schema_path[0] == best.relative_schema_path[0]
    ]
    if deepest > 0 or all(e.validator not in ("type",) for e in branch):
        out: list[SpecIssue] = []
        for e in branch:
            out.extend(_issues_from_error(e, prefix, root))
        return out
    expected = " or ".join(sorted({str(s.get("type", s.get("$ref", "?")).split("/")[-1]) for s in err.validator_value}))
    return [
        SpecIssue(
            json_path(path),
            f"expected {expected}, found {found_text(err.instance)}{_yaml_number_hint(expected, err.instance)}",
        )
    ]


def _issues_from_error(err: ValidationError, prefix: list, root: dict | None = None) -> list[SpecIssue]:
    path = prefix + list(err.absolute_path)
    v = err.validator
    if v in ("anyOf", "oneOf") and err.context:
        return _branch_issues(err, path, prefix, root)
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return [SpecIssue(json_path(path + [k]), f"unknown key; expected one of: {', '.join(allowed)}") for k in extra]
    if v == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return [SpecIssue(json_path(path + [k]), "required key is missing") for k in missing]
    if v == "type":
        return [
            SpecIssue(
                json_path(path),
                f"expected {err.validator_value}, found {found_text(err.instance)}"
                f"{_yaml_number_hint(str(err.validator_value), err.instance)}",
            )
        ]
    if v == "enum":
        opts = ", ".join(json.dumps(o) for o in err.validator_value)
        return [SpecIssue(json_path(path), f"expected one of {opts}, found {found_text(err.instance)}")]
    if v == "const":
        return [
            SpecIssue(json_path(path), f"expected {json.dumps(err.validator_value)}, found {found_text(err.instance)}")
        ]
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if v in bounds:
        return [
            SpecIssue(json_path(path), f"expected a number {bounds[v]} {err.validator_value}, found {err.instance}")
        ]
    if v in ("minLength", "maxLength"):
        word = "at least" if v == "minLength" else "at most"
        return [
            SpecIssue(
                json_path(path),
                f"expected a string of {word} {err.validator_value} characters, found {found_text(err.instance)}",
            )
        ]
    if v in ("minItems", "maxItems"):
        word = "at least" if v == "minItems" else "at most"
        return [SpecIssue(json_path(path), f"expected {word} {err.validator_value} item(s), found {len(err.instance)}")]
    if v == "pattern":
        return [
            SpecIssue(
                json_path(path), f"expected a string matching {err.validator_value}, found {found_text(err.instance)}"
            )
        ]
    return [SpecIssue(json_path(path), err.message)]


def schema_issues(name: str, document: Any, prefix: list | None = None) -> list[SpecIssue]:
    """Every schema violation of `document`, sorted by path, each naming expected and found."""
    return validator_issues(schema_validator(name), document, prefix)


def validator_issues(validator, document: Any, prefix: list | None = None) -> list[SpecIssue]:
    """`schema_issues` for any jsonschema validator (the chart's values schema is draft 7)."""
    issues: list[SpecIssue] = []
    for err in validator.iter_errors(document):
        issues.extend(_issues_from_error(err, list(prefix or []), validator.schema))
    unique = {(i.path, i.message): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.path, i.message))
