"""`mass train SPEC --gen G [--resume]`: LoRA SFT; run it under torchrun for data parallelism.

    torchrun --nproc_per_node 2 -m mass_jobs.commands.cli train examples/tiny.yaml --gen 0
The process group uses gloo on CPU and nccl on GPUs. `sft.parallel: fsdp` (or `--set sft.parallel=fsdp`)
shards the model over the ranks (one FSDP unit per decoder layer) for models whose training state does
not fit one GPU; it computes the same losses as DDP and writes the same full adapter. Each rank still
reads the whole parent into host memory before sharding it, and a resume must use the checkpoint's mode.
"""

from __future__ import annotations

import argparse
import os
import sys

from mass_jobs.commands.common import add_spec, open_run, work_dir_default
from mass_jobs.steps.train import run_train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec(parser, gen="generation g whose model is trained")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument(
        "--work-dir",
        default=work_dir_default(),
        help="local dir for inputs and checkpoints before they reach the store",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-step console lines (log.jsonl is kept)")


def main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    ctx = open_run(args.spec)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        work = ctx.work_dir(args.work_dir) / f"gen-{args.gen}"
        extra = run_train(ctx, args.gen, work, resume=args.resume, progress=not args.quiet)
        if int(os.environ.get("RANK", "0")) == 0:
            print(
                f"trained {extra['steps']} steps, {extra['processed_supervised_tokens']} supervised tokens; "
                f"checkpoints {extra['checkpoints']}"
            )
        if dist.is_initialized():
            # every rank done before any tears the group down: a gloo peer closing while the other was
            # still in its last collective aborted that rank ("terminate called without an active exception")
            dist.barrier()
    except RuntimeError as err:
        print(f"train: {err}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Everything is stored and every rank passed the barrier. Gloo's worker threads can still hold
        # work objects whose tensors the interpreter frees at shutdown, which aborted a rank after a
        # finished FSDP run ("terminate called without an active exception", exit -6); skip that teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
