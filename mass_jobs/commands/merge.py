"""`mass merge --spec S --gen G`: merge the selected adapter into L_g, giving the model of L_{g+1}."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", required=True, help="run spec: local path or s3:// URI")
    parser.add_argument("--gen", type=int, required=True, help="generation g whose selected adapter is merged")
    parser.add_argument("--work-dir", default=os.environ.get("MASS_WORK_DIR", ".mass-work"),
                        help="local dir for the adapter, the parent and the merged model")


def main(args: argparse.Namespace) -> int:
    from mass_jobs.context import RunContext
    from mass_jobs.spec import SpecError, load_spec
    from mass_jobs.steps.merge import MergeError, run_merge
    from mass_jobs.store import open_store

    try:
        spec = load_spec(args.spec)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        extra = run_merge(RunContext(spec, open_store(spec.store)), args.gen,
                          Path(args.work_dir) / spec.name / f"gen-{args.gen}" / "merge")
    except MergeError as err:
        print(f"merge: {err}", file=sys.stderr)
        return 1
    print(json.dumps(extra))
    return 0
