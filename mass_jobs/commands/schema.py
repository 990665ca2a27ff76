"""`mass schema --write schemas/`: regenerate the JSON Schemas of the run spec, task and workflow.

They are generated from mass_jobs/config/run_spec.py and checked in; tests/test_spec.py fails when they drift.
"""

from __future__ import annotations

from pathlib import Path

from mass_jobs.spec.issues import write_schemas


def add_arguments(parser) -> None:
    parser.add_argument("--write", metavar="DIR", default="schemas", help="output directory (default: schemas)")


def main(args) -> int:

    for path in write_schemas(Path(args.write)):
        print(path)
    return 0
