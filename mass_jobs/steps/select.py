"""Checkpoint selection: the saved step > 0 with the lowest finite validation loss (MASS step 5).

Ties go to the earlier step. External judges never take part. The selection also fixes the token
accounting of the generation: stored supervised tokens (the rendered windows) and processed
supervised tokens up to the selected step and to the end of training.

Run: `mass select --spec SPEC --gen G` (writes `<run>/gen-<g>/select.json`).
"""

from __future__ import annotations

import json
import math

from mass_jobs.errors import StepFailed


class SelectError(StepFailed, ValueError):
    """No saved checkpoint has a finite validation loss."""


def select_checkpoint(log: list[dict], saved_steps: list[int]) -> dict:
    """Pick the checkpoint from train/log.jsonl records and the saved step numbers."""
    val = {r["step"]: r["val_loss"] for r in log if r.get("kind") == "val"}
    candidates = {s: val.get(s) for s in sorted(saved_steps) if s > 0}
    finite = [(loss, s) for s, loss in candidates.items() if isinstance(loss, (int, float)) and math.isfinite(loss)]
    if not finite:
        raise SelectError(f"no saved step > 0 has a finite validation loss (saved: {sorted(saved_steps)}, "
                          f"val losses: {candidates})")
    loss, step = min(finite)  # (loss, step) order: equal losses pick the earlier step
    processed = {r["step"]: r["processed_tokens"] for r in log if r.get("kind") == "train"}
    return {
        "step": step,
        "val_loss": loss,
        "candidates": {str(s): v for s, v in candidates.items()},
        "processed_supervised_tokens": processed.get(step, 0),
        "processed_supervised_tokens_total": processed[max(processed)] if processed else 0,
    }


def select_step(ctx, gen: int):
    """Selection's Step: the stored training outputs (log and checkpoints)."""
    from mass_jobs.store import Step, read_manifest

    train = read_manifest(ctx.store, ctx.train(gen))
    if train is None:
        raise SelectError(f"generation {gen}: training has no manifest at {ctx.train(gen)!r} (run mass train first)")
    return Step(ctx.store, ctx.select_step(gen), inputs={"train": train["outputs"]})


def run_select(ctx, gen: int) -> dict:
    """Read the train step's log and checkpoints; write select.json and the step manifest."""
    from mass_jobs.store import read_manifest

    train = read_manifest(ctx.store, ctx.train(gen))
    sft = read_manifest(ctx.store, ctx.sft(gen)) or {}
    step = select_step(ctx, gen)
    if step.done:
        return ctx.store.get_json(ctx.select(gen))
    step.start()
    lines = ctx.store.get_bytes(ctx.train_log(gen)).decode("utf-8").splitlines()
    chosen = select_checkpoint([json.loads(x) for x in lines if x.strip()], train["extra"]["checkpoints"])
    chosen["checkpoint"] = ctx.checkpoint(gen, chosen["step"])
    chosen["stored_supervised_tokens"] = (sft.get("extra") or {}).get("stored_supervised_tokens")
    ctx.store.put_json(ctx.select(gen), chosen)
    step.finish([ctx.select(gen)], extra={k: chosen[k] for k in (
        "step", "val_loss", "stored_supervised_tokens", "processed_supervised_tokens",
        "processed_supervised_tokens_total")})
    return chosen
