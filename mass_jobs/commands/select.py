"""`mass select SPEC --gen G`: pick the checkpoint with the lowest validation loss, or by the judge
panel when the spec asks for it (sft.checkpoint_selection: panel, or a `+` preset)."""

from __future__ import annotations

import argparse
import json

from mass_jobs.commands.common import add_spec, open_run
from mass_jobs.steps.select import run_select


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec(parser, gen="generation whose training is selected from")


def main(args: argparse.Namespace) -> int:

    chosen = run_select(open_run(args.spec), args.gen)
    print(json.dumps({k: chosen.get(k) for k in ("step", "by", "val_loss", "processed_supervised_tokens")}))
    return 0
