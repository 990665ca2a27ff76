"""`mass report --spec S`: rebuild `<run>/report/` (report.json, report.md, plots) from stored
artifacts alone and print where it is."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--spec", required=True, help="run spec: a path or an s3:// URI")


def main(args) -> int:
    from mass_jobs.context import RunContext
    from mass_jobs.spec import SpecError, load_spec
    from mass_jobs.steps.report import write_report
    from mass_jobs.store import open_store

    try:
        spec = load_spec(args.spec)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    store = open_store(spec.store)
    ctx = RunContext(spec, store)
    doc = write_report(ctx)
    print(f"report: {store.uri.rstrip('/')}/{ctx.report()}/report.md ({len(doc['win_share'])} win-share rows, "
          f"{doc['verdicts']['panel']['invalid']} invalid panel verdicts)")
    return 0
