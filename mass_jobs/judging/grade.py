"""Deterministic task score of one workspace: do the deliverables exist, and are they correct?

One check per deliverable (the file exists) and one per `task.expect` entry (its content equals the
expected content: JSON files as parsed values, other files as whitespace-separated tokens, so a
trailing newline or a space-joined list still counts). The score is passed checks / checks; a task
without deliverables has no score (None). No model is asked: the same workspace always gets the
same score, beside the judged win share that a tiny judge makes noisy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mass_jobs.config.task_spec import Task


@dataclass(frozen=True)
class Grade:
    checks: int
    passed: int
    missing: tuple[str, ...]  # deliverables not in the workspace
    wrong: tuple[str, ...]  # expected files whose content differs

    @property
    def score(self) -> float | None:
        return self.passed / self.checks if self.checks else None

    @property
    def solved(self) -> bool:
        return bool(self.checks) and self.passed == self.checks


def same_content(path: str, found: str, expected: str) -> bool:
    if path.endswith(".json"):
        try:
            return json.loads(found) == json.loads(expected)
        except ValueError:
            return False
    return found.split() == expected.split()


def grade_workspace(task: Task, workspace: Path) -> Grade:
    missing, wrong = [], []
    for rel in task.deliverables:
        if not (workspace / rel).is_file():
            missing.append(rel)
    for rel, expected in task.expect.items():
        f = workspace / rel
        try:
            found = f.read_text(encoding="utf-8") if f.is_file() else None
        except (OSError, UnicodeDecodeError):
            found = None
        if found is None or not same_content(rel, found, expected):
            wrong.append(rel)
    checks = len(task.deliverables) + len(task.expect)
    return Grade(checks, checks - len(missing) - len(wrong), tuple(missing), tuple(wrong))
