"""Learning rate: linear warmup, then cosine decay to lr * min_lr_ratio at the last step."""

from __future__ import annotations

import math

from mass_jobs.config.run_spec import OptimizerSpec


def lr_at(step: int, total_steps: int, opt: OptimizerSpec) -> float:
    """LR of optimizer step `step` (1-based): warmup reaches the peak at step `warmup_steps`."""
    if step <= opt.warmup_steps:
        return opt.lr * step / opt.warmup_steps
    span = max(1, total_steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / span)
    floor = opt.min_lr_ratio
    return opt.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
