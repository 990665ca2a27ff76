"""Numbers a deliverable states that its task's metrics file contradicts.

A metric guard bounds the value in the metrics file; the report the judges read may state another
("error 0.02" over a metrics.json holding 0.4). Prose cannot be parsed for sure, so a contradiction
flags the episode for review (listed in the run's report) rather than vetoing it: a stated value is
`KEY` followed by a number (`error 0.02`, `error: 2%`, `error = 0.02`), compared at the precision
it was written with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = (".md", ".txt", ".rst")
TEXT_BYTES = 256 * 1024


def stated(text: str, key: str) -> list[str]:
    """Each number written right after the metric's name (its last dotted part) in `text`."""
    name = re.escape(key.rsplit(".", 1)[-1])
    found = re.findall(rf"(?<![\w.]){name}(?![\w])\s*(?:[:=]|is|of|was)?\s*\**\s*(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?%?)",
                       text, flags=re.I)
    return found


def agrees(written: str, value: float) -> bool:
    """`written` is `value` at the precision it was written with (a percentage as a fraction too)."""
    percent = written.endswith("%")
    number = written.rstrip("%")
    decimals = len(number.split(".", 1)[1]) if "." in number and "e" not in number.lower() else None
    candidates = [value * 100, value] if percent else [value]
    for v in candidates:
        if decimals is None:
            if abs(float(number) - v) <= 1e-9 * max(1.0, abs(v)) or (float(number) == round(v) and "e" not in number.lower()):
                return True
        elif abs(float(number) - round(v, decimals)) <= 0.5 * 10 ** -decimals + 1e-12:
            return True
    return False


def _text(path: Path) -> str:
    """A deliverable's text: a regular file (no link) read to TEXT_BYTES, else nothing."""
    try:
        if not path.is_file() or path.is_symlink():
            return ""
        with open(path, "rb") as f:
            return f.read(TEXT_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def contradictions(guards: Any, workspace: Path, metric: Callable[[Any, Path], Any]) -> list[str]:
    """`FILE states KEY N, METRICS holds V` for each stated value of a guarded metric that its
    metrics file contradicts, over the task's required outputs that are text. `metric(m, workspace)`
    is the guard's own strict reading of metric `m` (None where it has none)."""
    out = []
    for m in guards.metrics:
        value = metric(m, workspace)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue  # the metric guard itself vetoes a missing or unreadable value
        for rel in guards.required_outputs:
            if not rel.endswith(TEXT_SUFFIXES):
                continue
            for written in stated(_text(workspace / rel), m.key):
                if not agrees(written, float(value)):
                    out.append(f"{rel} states {m.key.rsplit('.', 1)[-1]} {written}, {m.file} holds {value}")
                    break
    return out
