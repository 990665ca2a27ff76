"""Numbers a deliverable states that its task's metrics file contradicts.

A metric guard bounds the value in the metrics file; the report the judges read may state another
("error 0.02" over a metrics.json holding 0.4). Prose cannot be parsed for sure, so a contradiction
flags the episode for review rather than vetoing it (a flagged episode is left out of ranking and SFT
unless the task's guards.train_flagged keeps it; the run's report lists and counts them). Every
number of a metrics file a guard names is compared, guarded or not, under the name prose gives it:
`success_rate` is stated as `success rate 1.00`, `success-rate: 100%` or `successRate = 1`, a
number right after the name, compared at the precision it was written with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = (".md", ".txt", ".rst")
TEXT_BYTES = 256 * 1024


def name_pattern(key: str) -> str:
    """The regex of a metric's name (its last dotted part) as prose writes it: its words apart
    (`success_rate`, `success-rate`, `successRate`) joined by spaces, underscores or hyphens."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key.rsplit(".", 1)[-1])
    words = [w for w in re.split(r"[\s_\-]+", name) if w]
    return r"[\s_\-]*".join(re.escape(w) for w in words)


def stated(text: str, key: str) -> list[str]:
    """Each number written right after the metric's name (name_pattern) in `text`."""
    found = re.findall(
        rf"(?<![\w.]){name_pattern(key)}(?![\w])\**\s*(?:[:=]|is|of|was)?\s*\**\s*"
        r"(-?\d+(?:\.\d+)?(?:[eE]-?\d+)?%?)",
        text,
        flags=re.I,
    )
    return found


def numeric_leaves(doc: Any, prefix: str = "") -> dict[str, float]:
    """Dotted key -> value of every finite number in a parsed metrics file (booleans are no numbers)."""
    out: dict[str, float] = {}
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, (dict, list)):
            out.update(numeric_leaves(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


def agrees(written: str, value: float) -> bool:
    """`written` is `value` at the precision it was written with (a percentage as a fraction too)."""
    percent = written.endswith("%")
    number = written.rstrip("%")
    decimals = len(number.split(".", 1)[1]) if "." in number and "e" not in number.lower() else None
    candidates = [value * 100, value] if percent else [value]
    for v in candidates:
        if decimals is None:
            if abs(float(number) - v) <= 1e-9 * max(1.0, abs(v)) or (
                float(number) == round(v) and "e" not in number.lower()
            ):
                return True
        elif abs(float(number) - round(v, decimals)) <= 0.5 * 10**-decimals + 1e-12:
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


def contradictions(guards: Any, workspace: Path, read: Callable[[str, Path], Any]) -> list[str]:
    """`FILE states NAME N, METRICS holds V` for each number of a metrics file named by the task's
    metric guards that a text deliverable (a required output) states otherwise. `read(file,
    workspace)` is the guard's own strict reading of a metrics file (None where it has none)."""
    out = []
    for file in dict.fromkeys(m.file for m in guards.metrics):
        values = numeric_leaves(read(file, workspace))
        guarded = [m.key for m in guards.metrics if m.file == file and m.key in values]
        for key in [*guarded, *sorted(k for k in values if k not in guarded and not k.rsplit(".", 1)[-1].isdigit())]:
            for rel in guards.required_outputs:
                if not rel.endswith(TEXT_SUFFIXES):
                    continue
                for written in stated(_text(workspace / rel), key):
                    if not agrees(written, values[key]):
                        number = int(values[key]) if values[key].is_integer() else values[key]
                        out.append(f"{rel} states {key.rsplit('.', 1)[-1]} {written}, {file} holds {number}")
                        break
    return out
