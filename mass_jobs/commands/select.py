"""`mass select --spec S --gen G`: pick the checkpoint with the lowest validation loss."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="run spec: local path or s3:// URI")
    parser.add_argument("--gen", type=int, required=True, help="generation whose training is selected from")


def main(args: argparse.Namespace) -> int:
    from mass_jobs.context import RunContext
    from mass_jobs.spec import SpecError, load_spec
    from mass_jobs.steps.select import SelectError, run_select
    from mass_jobs.store import open_store

    try:
        spec = load_spec(args.spec)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        chosen = run_select(RunContext(spec, open_store(spec.store)), args.gen)
    except SelectError as err:
        print(f"select: {err}", file=sys.stderr)
        return 1
    print(json.dumps({k: chosen[k] for k in ("step", "val_loss", "processed_supervised_tokens")}))
    return 0
