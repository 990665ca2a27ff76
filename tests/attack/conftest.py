"""The attack battery: hostile input and faults, one module per class of attack.

Every test here is one attempt. `make attack` runs only this folder and prints, per class (the
module name without `test_`), how many attempts were tried and how many held (passed). An attempt
that is skipped counts as tried and not held, so a skip can never hide a break.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
_tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.attack)


def _attack_class(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0]
    if "tests/attack/" not in path:
        return None
    return Path(path).stem.removeprefix("test_")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    cls = _attack_class(report.nodeid)
    if cls is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _tally[cls][0] += 1
        if report.when == "call" and report.passed:
            _tally[cls][1] += 1


def pytest_terminal_summary(terminalreporter):
    if not _tally:
        return
    tr = terminalreporter
    tr.section("attack battery: tried / held")
    width = max(len(c) for c in _tally)
    tried = held = 0
    for cls in sorted(_tally):
        t, h = _tally[cls]
        tried, held = tried + t, held + h
        tr.write_line(f"{cls:<{width}}  {h:>4} / {t:<4} held{'' if h == t else '  BROKEN'}")
    tr.write_line(f"{'all':<{width}}  {held:>4} / {tried:<4} held")
