"""Hostile input, bounded before any work: a spec or task file is parsed (YAML or JSON) within
fixed limits of size, depth, aliases, nodes and integer digits, so every input ends in a listed
error within seconds."""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from mass_jobs.spec.issues import SpecError, SpecIssue, json_path


def parse_document(text: str, source: str) -> Any:
    """YAML or JSON (YAML is a superset: one parser for both) within the input bounds below."""
    # A spec's task files are parsed again each time the spec is loaded (a step loads it more than
    # once); PyYAML's pure-Python parser takes 5 ms for one of the paper's. A small text's document
    # is kept and handed out as a copy; a refused text is parsed again, to name its source.
    if len(text) <= _KEPT_TEXT:
        return copy.deepcopy(_parse_kept(text, source))
    return _parse(text, source)


_KEPT_TEXT = 64 << 10


@lru_cache(maxsize=32)
def _parse_kept(text: str, source: str) -> Any:
    return _parse(text, source)


def _parse(text: str, source: str) -> Any:
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(
            source,
            [
                SpecIssue(
                    "$",
                    f"expected a document of at most {MAX_SPEC_BYTES} bytes, "
                    f"found {len(text.encode('utf-8', 'surrogatepass'))}",
                )
            ],
        )
    try:
        document = _bounded_load(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(
            source, [SpecIssue("$", f"expected valid YAML or JSON{where}: {getattr(exc, 'problem', exc)}")]
        ) from None
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
                raise _Limit(
                    json_path(self._path + [key] if parent is not None else self._path),
                    f"expected at most {MAX_ALIASES} YAML aliases, found more",
                )
            return super().compose_node(parent, index)
        if parent is not None:
            self._path.append(key)
        try:
            if len(self._path) > MAX_DEPTH:
                raise _Limit(
                    json_path(self._path[:MAX_DEPTH]), f"expected nesting at most {MAX_DEPTH} levels deep, found deeper"
                )
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
            return issues + [
                SpecIssue(
                    json_path(path),
                    f"expected at most {MAX_NODES} values after expanding YAML aliases, found more (an alias bomb)",
                )
            ]
        if len(path) > MAX_DEPTH:  # nesting reached through aliases (or an alias cycle)
            return issues + [
                SpecIssue(
                    json_path(path[:MAX_DEPTH]),
                    f"expected nesting at most {MAX_DEPTH} levels deep after expanding YAML aliases, found deeper",
                )
            ]
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, int] = {}
            for key, value in node.value:
                if key.tag == "tag:yaml.org,2002:merge":
                    stack.append((value, path))
                    continue
                if not (isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:str"):
                    shown = key.value if isinstance(key, yaml.ScalarNode) else key.id
                    issues.append(
                        SpecIssue(
                            json_path(path), f"expected string keys, found {shown!r} ({key.tag.rsplit(':', 1)[-1]})"
                        )
                    )
                    continue
                if key.value in keys:
                    again = f"line {key.start_mark.line + 1} (first at line {keys[key.value]})"
                    issues.append(
                        SpecIssue(json_path(path + [key.value]), f"expected each key once, found it again at {again}")
                    )
                keys.setdefault(key.value, key.start_mark.line + 1)
                stack.append((value, path + [key.value]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path + [i]) for i, item in enumerate(node.value))
        elif node.tag == "tag:yaml.org,2002:int" and len(node.value.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
            digits = len(node.value.lstrip("+-").replace("_", ""))  # 0x / 0b / 0o prefixes count too
            issues.append(
                SpecIssue(
                    json_path(path), f"expected an integer of at most {MAX_INT_DIGITS} digits, found {digits} digits"
                )
            )
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
        raise SpecError(
            source, [SpecIssue("$", f"expected UTF-8 text, found byte 0x{data[exc.start]:02x} at offset {exc.start}")]
        ) from None


def get_bounded(store, key: str, source: str) -> str:
    """A spec or task file from a store: its size is checked (one HEAD) before it is read."""
    if store.stat(key)[0] > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecIssue("$", f"expected a document of at most {MAX_SPEC_BYTES} bytes, found more")])
    return decode_bounded(store.get_bytes(key), source)
