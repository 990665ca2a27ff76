"""Store keys of one run: the single place that spells the layout of docs/architecture.md.

Steps never format keys themselves; they ask a `RunContext`, so a layout change is one edit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mass_jobs.models import RunSpec


@dataclass(frozen=True)
class RunContext:
    spec: RunSpec
    store: Any  # mass_jobs.store.Store (file:// or s3://)

    @property
    def run(self) -> str:
        return self.spec.name

    def spec_key(self) -> str:
        return f"{self.run}/spec.json"

    def gen(self, g: int) -> str:
        if g < 0:
            raise ValueError(f"generation must be >= 0, got {g}")
        return f"{self.run}/gen-{g}"

    def model(self, g: int) -> str:
        return f"{self.gen(g)}/model"

    # ------------------------------------------------------------ search
    def search(self, g: int, task: str) -> str:
        return f"{self.gen(g)}/search/{task}"

    def search_reference(self, g: int, task: str) -> str:
        """The bare-prompt reference run (no workflow) that `beats_reference` is judged against."""
        return f"{self.search(g, task)}/reference"

    def search_iter(self, g: int, task: str, k: int) -> str:
        return f"{self.search(g, task)}/iter-{k}"

    def search_state(self, g: int, task: str) -> str:
        return f"{self.search(g, task)}/state.json"

    # ------------------------------------------------------------ collect / guard / rank
    def collect(self, g: int, task: str) -> str:
        return f"{self.gen(g)}/collect/{task}"

    def collect_episode(self, g: int, task: str, i: int) -> str:
        return f"{self.collect(g, task)}/ep-{i}"

    def collect_summary(self, g: int, task: str) -> str:
        return f"{self.collect(g, task)}/summary.json"

    def guard(self, g: int, task: str) -> str:
        return f"{self.gen(g)}/guard/{task}.json"

    def rank(self, g: int, task: str) -> str:
        return f"{self.gen(g)}/rank/{task}.json"

    def rank_verdicts(self, g: int, task: str) -> str:
        """Per-comparison verdict cache, so a killed ranking resumes without asking again."""
        return f"{self.gen(g)}/rank/{task}/verdicts"

    # ------------------------------------------------------------ later steps
    def sft(self, g: int) -> str:
        return f"{self.gen(g)}/sft"

    def train(self, g: int) -> str:
        return f"{self.gen(g)}/train"

    def select(self, g: int) -> str:
        return f"{self.gen(g)}/select.json"

    def eval(self, g: int) -> str:
        return f"{self.run}/eval/gen-{g}"

    def report(self) -> str:
        return f"{self.run}/report"
