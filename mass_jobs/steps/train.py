"""LoRA SFT of generation g's model on its rendered windows (MASS outer loop, step 5).

Every rank reads `<run>/gen-<g>/sft/{train,val}.jsonl` and the parent model, trains with the
spec's LoRA and optimizer settings, and rank 0 copies each checkpoint (local dir first) to
`<run>/gen-<g>/train/step-<n>` and the step log to `<run>/gen-<g>/train/log.jsonl`. `--resume`
continues from the newest checkpoint, local or in the store, and logs the same losses an
uninterrupted run would have.

Run: `torchrun --nproc_per_node N -m mass_jobs.commands.cli train --spec SPEC --gen G [--resume]`
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mass_jobs.config.composition import composition_of
from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import local_model_dir
from mass_jobs.store import Step, Waiting, formed, read_manifest
from mass_jobs.training.checkpoint import MANIFEST, latest_checkpoint, read_checkpoint
from mass_jobs.training.dist import Dist
from mass_jobs.training.loop import Trainer


def read_windows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def stored_steps(ctx: RunContext, gen: int) -> list[int]:
    prefix = ctx.train_checkpoints(gen)
    steps = set()
    for key in ctx.store.list(prefix):
        head = key[len(prefix) :].split("/", 1)[0]
        if head.isdigit():
            steps.add(int(head))
    return sorted(steps)


def _fetch_inputs(ctx: RunContext, gen: int, work: Path, resume: bool) -> tuple[Path, Path]:
    inputs = work / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        ctx.store.get_file(ctx.sft_file(gen, split), inputs / f"{split}.jsonl")
    parent = local_model_dir(ctx, gen, work / "models")
    out = work / "train"
    if resume:
        # Every rank resumes from the newest stored checkpoint: a local one the store does not hold
        # (rank 0 saved it, a restart came before its upload) is not durable and no other rank has it,
        # and ranks resuming from different steps would wait on each other's collectives for ever.
        steps = stored_steps(ctx, gen)
        newest = steps[-1] if steps else 0
        for local in Path(out).glob("step-*"):
            if local.name[5:].isdigit() and int(local.name[5:]) > newest:
                shutil.rmtree(local)
        latest = latest_checkpoint(out)
        if steps and (latest is None or latest.name != f"step-{newest}"):
            # a fresh pod, or one whose newest copy is older: bring the stored one and the log up to it
            from mass_jobs.store import MODEL_LIMITS

            shutil.rmtree(out / f"step-{newest}", ignore_errors=True)  # a half-written local copy
            ctx.store.get_dir(ctx.checkpoint(gen, newest), out / f"step-{newest}", MODEL_LIMITS)
            if ctx.store.exists(ctx.train_log(gen)):
                ctx.store.get_file(ctx.train_log(gen), out / "log.jsonl")
    return inputs, parent


def training_settings(sft) -> dict:
    """The sft settings training depends on: not how its checkpoint is selected afterwards, and the
    preset and the parallel mode only when not the defaults (earlier runs keep their hashes)."""

    doc = sft.model_dump(mode="json", exclude={"checkpoint_selection", "panel", "preset", "parallel"})
    if sft.parallel != "ddp":  # DDP runs keep the hashes they had before the field existed
        doc["parallel"] = sft.parallel
    if sft.preset is not None:
        doc["orchestrator_share"] = composition_of(sft).orchestrator_share
        doc["preset"] = sft.preset
    return doc


def train_step(ctx: RunContext, gen: int, world_size: int):
    """Training's Step: the stored SFT windows, the sft settings, the parent model, the world size."""

    sft_manifest = read_manifest(ctx.store, ctx.sft(gen))
    if sft_manifest is None:
        return Waiting(f"generation {gen}: no SFT windows at {ctx.sft(gen)} (run `mass render sft` first)")
    return Step(
        ctx.store,
        ctx.train(gen),
        inputs={
            "sft": sft_manifest.get("outputs"),
            "sft_spec": training_settings(ctx.spec.sft),
            "parent": ctx.spec.model.base if gen == 0 else ctx.model(gen),
            "world_size": world_size,
        },
    )


def stored_train_step(ctx: RunContext, gen: int):
    """The train Step as stored: for the world size that trained it (a local run and a PyTorchJob
    differ in ranks, and either's checkpoints serve select and merge)."""

    manifest = read_manifest(ctx.store, ctx.train(gen))
    return train_step(ctx, gen, (manifest or {}).get("extra", {}).get("world_size", 1))


def run_train(ctx: RunContext, gen: int, work_dir: Path, *, resume: bool = False, progress: bool = True) -> dict:
    """Train (every rank calls this) in the spec's sft.parallel mode; returns the train step's
    manifest `extra` on every rank."""
    parallel = ctx.spec.sft.parallel
    dist = Dist.current()
    work = Path(work_dir)

    step = formed(train_step(ctx, gen, dist.world))
    sft_manifest = read_manifest(ctx.store, ctx.sft(gen))
    if step.done:
        return ctx.store.get_json(step.manifest_key)["extra"]
    if dist.rank == 0:  # before anything trains: a test task's data never does (SplitLeak, the job fails)
        from mass_jobs.steps.split_guard import check_no_test_leak

        check_no_test_leak(ctx, gen)
    inputs, parent = _node_inputs(ctx, gen, dist, work, resume)
    log_key = ctx.train_log(gen)

    def upload(n: int, path: Path) -> None:
        ctx.store.put_dir(ctx.checkpoint(gen, n), path)
        ctx.store.put_file(log_key, path.parent / "log.jsonl")
        _put_timing(ctx, gen, path.parent)

    if dist.rank == 0:
        step.claim() if resume else step.start()  # a resume keeps the stored checkpoints it continues
    windows = read_windows(inputs / "train.jsonl"), read_windows(inputs / "val.jsonl")
    trainer = Trainer(
        parent, *windows, ctx.spec.sft, work / "train", parallel=parallel, on_checkpoint=upload, progress=progress
    )
    trainer.setup()
    result = trainer.train(resume=resume)
    if dist.rank == 0:
        _upload_local_checkpoints(ctx, gen, work / "train", upload)
    dist.barrier()
    extra = {
        "steps": result.steps,
        "checkpoints": stored_steps(ctx, gen),
        "processed_supervised_tokens": result.processed_tokens,
        "stored_supervised_tokens": sft_manifest.get("extra", {}).get("stored_supervised_tokens"),
        "world_size": dist.world,
        "parallel": parallel,
        "param_share": result.param_share,  # of the model's parameters on this rank: 1 (DDP), ~1/world (FSDP)
        "lora": result.lora,  # target kinds, adapted modules, adapted parent and LoRA parameter counts
    }
    if not extra["checkpoints"]:  # a train step is never done without something to select
        raise RuntimeError(
            f"train gen {gen}: no checkpoint was saved or stored after {result.steps} steps "
            f"(local checkpoints under {work / 'train'})"
        )
    if dist.rank == 0:
        ctx.store.put_file(log_key, work / "train" / "log.jsonl")
        _put_timing(ctx, gen, work / "train")
        keys = [log_key] + [ctx.checkpoint(gen, n) for n in extra["checkpoints"]]
        step.finish(keys, extra=extra)
    dist.barrier()
    return extra


def _node_inputs(ctx: RunContext, gen: int, dist: Dist, work: Path, resume: bool) -> tuple[Path, Path]:
    """(the windows' dir, the parent model's dir) on this node: fetched once per node, by its local
    rank 0, while the others wait (every rank calls this)."""
    if dist.local_rank == 0:
        if not resume:
            shutil.rmtree(work / "train", ignore_errors=True)
        inputs, parent = _fetch_inputs(ctx, gen, work, resume)
    dist.barrier()
    if dist.local_rank != 0:
        inputs, parent = work / "inputs", local_model_dir(ctx, gen, work / "models")
    return inputs, parent


def _upload_local_checkpoints(ctx: RunContext, gen: int, train_dir: Path, upload) -> None:
    """Store every complete local checkpoint the store lacks: one saved just before a kill (saved,
    not yet uploaded) or one a resumed run found already there, which the loop does not save again."""
    stored = set(stored_steps(ctx, gen))
    for path in sorted(train_dir.glob("step-*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else -1):
        if path.name[5:].isdigit() and int(path.name[5:]) not in stored and (path / MANIFEST).exists():
            read_checkpoint(path)  # raises on a damaged file: never store a torn checkpoint
            upload(int(path.name[5:]), path)


def _put_timing(ctx, gen: int, train_dir: Path) -> None:
    """Step times for `mass plan --timings`; not a manifest output (they differ on every run)."""
    if (train_dir / "timing.jsonl").exists():
        ctx.store.put_file(ctx.train_timing(gen), train_dir / "timing.jsonl")
