"""The train/test split, checked where training starts: in the train core, so the local runner's
torchrun and the cluster's PyTorchJob both refuse to train on a test task's data.

Test tasks never reach search, collection, ranking, rendering or selection (the steps get only
the spec's train tasks); this catches what slipped through anyway: a test task's rank or guard
file, a collection of it, or an SFT window naming it (or naming no task at all).
"""

from __future__ import annotations

import json

from mass_jobs.config.errors import StepFailed
from mass_jobs.run.context import RunContext


class SplitLeak(StepFailed):
    """A test task reached a training input (never allowed)."""


def check_no_test_leak(ctx: RunContext, gen: int) -> dict:
    """Raise SplitLeak when a test task appears in a rank file, a collection or an SFT window."""
    test_ids = {t.id for t in ctx.spec.resolved_tasks() if t.split == "test"}
    store = ctx.store
    found = []
    for t in sorted(test_ids):
        for key in (ctx.rank(gen, t), ctx.guard(gen, t)):
            if store.exists(key):
                found.append(key)
        if store.list(ctx.collect(gen, t) + "/"):
            found.append(ctx.collect(gen, t) + "/")
    windows = 0
    for split in ("train", "val"):
        key = ctx.sft_file(gen, split)
        if not store.exists(key):
            continue
        for n, line in enumerate(store.get_bytes(key).decode("utf-8").splitlines()):
            if not line.strip():
                continue
            windows += 1
            task = json.loads(line).get("task")
            if task in test_ids or task is None:
                found.append(f"{key} line {n + 1}: task {task!r}")
    if found:
        raise SplitLeak(f"generation {gen}: test tasks reached training inputs: {found[:10]}")
    return {"windows_checked": windows, "test_tasks": sorted(test_ids)}
