"""`mass report SPEC`: rebuild `<run>/report/` (report.json, report.md, plots) from stored
artifacts alone and print where it is."""

from __future__ import annotations

from mass_jobs.commands.common import add_spec, never_ran, open_run
from mass_jobs.steps.report import write_report


def add_arguments(parser) -> None:
    add_spec(parser)  # the information proxies' embedder is the spec's evaluation.embedder


def main(args) -> int:

    import sys

    ctx = open_run(args.spec)
    if why := never_ran(ctx):
        print(f"mass report: {why}", file=sys.stderr)
        return 1
    doc = write_report(ctx)
    print(
        f"report: {ctx.store.uri.rstrip('/')}/{ctx.report()}/report.md ({len(doc['win_share'])} win-share rows, "
        f"{doc['verdicts']['panel']['invalid']} invalid panel verdicts)"
    )
    return 0
