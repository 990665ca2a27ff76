"""Checkpoint selection: the saved step > 0 with the lowest finite validation loss (MASS step 5).

Ties go to the earlier step. External judges take no part, unless the spec asks for the panel
control (`sft.checkpoint_selection: panel` or a `+` preset; mass_jobs.steps.select_panel), whose
choice, candidates, win shares and budget select.json records. The selection also fixes the token
accounting of the generation: stored supervised tokens (the rendered windows) and processed
supervised tokens up to the selected step and to the end of training.

Run: `mass select --spec SPEC --gen G` (writes `<run>/gen-<g>/select.json`).
"""

from __future__ import annotations

import json
import math

from mass_jobs.config.composition import composition_of
from mass_jobs.config.errors import StepFailed
from mass_jobs.store import Step, Waiting, formed, read_manifest


class SelectError(StepFailed, ValueError):
    """No saved checkpoint has a finite validation loss."""


def select_checkpoint(log: list[dict], saved_steps: list[int]) -> dict:
    """Pick the checkpoint from train/log.jsonl records and the saved step numbers."""
    val = {r["step"]: r["val_loss"] for r in log if r.get("kind") == "val"}
    candidates = {s: val.get(s) for s in sorted(saved_steps) if s > 0}
    finite = [(loss, s) for s, loss in candidates.items() if isinstance(loss, (int, float)) and math.isfinite(loss)]
    if not finite:
        raise SelectError(
            f"no saved step > 0 has a finite validation loss (saved: {sorted(saved_steps)}, val losses: {candidates})"
        )
    loss, step = min(finite)  # (loss, step) order: equal losses pick the earlier step
    processed = {r["step"]: r["processed_tokens"] for r in log if r.get("kind") == "train"}
    return {
        "step": step,
        "val_loss": loss,
        "candidates": {str(s): v for s, v in candidates.items()},
        "processed_supervised_tokens": processed.get(step, 0),
        "processed_supervised_tokens_total": processed[max(processed)] if processed else 0,
    }


def by_panel(ctx) -> bool:

    return composition_of(ctx.spec.sft).checkpoint == "panel"


def select_step(ctx, gen: int):
    """Selection's Step: the stored training outputs (log and checkpoints), plus the panel's settings
    when the panel selects."""

    train = read_manifest(ctx.store, ctx.train(gen))
    if train is None:
        return Waiting(f"generation {gen}: training has no manifest at {ctx.train(gen)!r} (run mass train first)")
    inputs = {"train": train["outputs"]}
    if by_panel(ctx):
        from mass_jobs.steps.select_panel import panel_inputs

        inputs["panel"] = panel_inputs(ctx, gen)
    return Step(ctx.store, ctx.select_step(gen), inputs=inputs)


def run_select(ctx, gen: int, servers=None) -> dict:
    """Read the train step's log and checkpoints; write select.json and the step manifest.

    `servers`: (serve_parent, serve_checkpoint, serve_judge) for panel selection; the embedded
    server's by default."""

    train = read_manifest(ctx.store, ctx.train(gen))
    sft = read_manifest(ctx.store, ctx.sft(gen)) or {}
    step = formed(select_step(ctx, gen), SelectError)
    if step.done:
        return ctx.store.get_json(ctx.select(gen))
    step.start()
    lines = ctx.store.get_bytes(ctx.train_log(gen)).decode("utf-8").splitlines()
    log = [json.loads(x) for x in lines if x.strip()]
    chosen = {**select_checkpoint(log, train["extra"]["checkpoints"]), "by": "val_loss"}
    if by_panel(ctx):
        from mass_jobs.steps import select_panel

        val = {int(s): v for s, v in chosen["candidates"].items() if isinstance(v, (int, float)) and math.isfinite(v)}
        panel = select_panel.select_by_panel(ctx, gen, val, *(servers or select_panel.default_servers(ctx, gen)))
        processed = {r["step"]: r["processed_tokens"] for r in log if r.get("kind") == "train"}
        chosen.update(
            panel, val_loss_choice=chosen["step"], processed_supervised_tokens=processed.get(panel["step"], 0)
        )
    chosen["checkpoint"] = ctx.checkpoint(gen, chosen["step"])
    chosen["stored_supervised_tokens"] = (sft.get("extra") or {}).get("stored_supervised_tokens")
    ctx.store.put_json(ctx.select(gen), chosen)
    step.finish(
        [ctx.select(gen)],
        extra={
            k: chosen[k]
            for k in (
                "step",
                "by",
                "val_loss",
                "stored_supervised_tokens",
                "processed_supervised_tokens",
                "processed_supervised_tokens_total",
            )
        },
    )
    return chosen
