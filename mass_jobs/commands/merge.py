"""`mass merge SPEC --gen G`: merge the selected adapter into L_g, giving the model of L_{g+1}."""

from __future__ import annotations

import argparse
import json

from mass_jobs.commands.common import add_spec, open_run, work_dir_default
from mass_jobs.steps.merge import run_merge


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_spec(parser, gen="generation g whose selected adapter is merged")
    parser.add_argument(
        "--work-dir", default=work_dir_default(), help="local dir for the adapter, the parent and the merged model"
    )


def main(args: argparse.Namespace) -> int:

    ctx = open_run(args.spec)
    extra = run_merge(ctx, args.gen, ctx.work_dir(args.work_dir) / f"gen-{args.gen}" / "merge")
    print(json.dumps(extra))
    return 0
