"""`mass status SPEC`: what is done, running, interrupted, failed or pending, per generation and
step of the pipeline table (`mass_jobs.pipeline.table`).

Done / pending come from the store alone (each step's own done-check), so a run executed by Argo,
by the local runner or by hand shows the same table; the local runner's `<run>/run-state.json`
adds running / interrupted / failed. A spec that differs from the run's stored one is named, the
table is the stored run's, and the exit code is 2, as `mass run` and `mass validate` refuse it.
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import open_run
from mass_jobs.pipeline.progress import clock
from mass_jobs.pipeline.runner import RunState, progress_summary, step_status
from mass_jobs.run.context import RunContext


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a path or an s3:// URI")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def eta_words(summary: dict) -> str:
    if summary["done"] == summary["total"]:
        return "all done"
    if summary["eta_s"] is None:
        return f"ETA unknown ({summary['untimed_left']} of the steps left have not run in this run yet)"
    if summary["overrun"]:
        return f"ETA at least ~{clock(summary['eta_s'])} (the running step is past its measured time)"
    return f"ETA ~{clock(summary['eta_s'])} (each step left at its measured mean)"


def main(args) -> int:

    ctx = open_run(args.spec, check_spec=False)
    # the decision `mass run` and `mass validate` take too: a changed spec is refused, so the steps
    # shown are the stored run's (what its store was computed from), not a mix of both specs
    changed = [str(i) for i in ctx.spec_differences()]
    if changed:
        ctx = RunContext(ctx.stored_spec(), ctx.store)
    spec = ctx.spec
    rows = step_status(ctx)
    state = RunState(ctx).load()
    summary = progress_summary(rows, state)
    if args.json:
        print(
            json.dumps(
                {
                    "run": spec.name,
                    "steps": rows,
                    "failed": state.get("failed"),
                    "spec_changes": changed,
                    "progress": summary,
                },
                sort_keys=True,
            )
        )
        return 2 if changed else 0
    from rich.console import Console
    from rich.table import Table

    colors = {"done": "green", "running": "cyan", "failed": "red", "interrupted": "yellow", "pending": "dim"}
    table = Table(title=f"run {spec.name}")
    for col in ("#", "gen", "step", "status", "time", "detail"):
        table.add_column(col)
    for n, r in enumerate(rows, 1):
        took = clock(r["seconds"]) if r["seconds"] is not None else ""
        table.add_row(
            f"{n}/{len(rows)}", f"L{r['gen']}", r["step"], f"[{colors[r['status']]}]{r['status']}", took, r["detail"]
        )
    console = Console(width=max(100, Console().width))
    console.print(table)
    console.print(f"{summary['done']}/{summary['total']} steps done; {eta_words(summary)}")
    if state.get("failed"):
        f = state["failed"]
        console.print(f"[red]failed: L{f['gen']} {f['step']}: {f['error']}", soft_wrap=True)
        for path in f.get("logs") or []:
            console.print(f"logs: {path}", soft_wrap=True)
    if changed:
        console.print(
            "[red]this spec differs from the stored run, so `mass run` and `mass validate` refuse it; "
            "the table is the stored run's",
            soft_wrap=True,
        )
    for line in changed:
        console.print(f"[red]spec differs from the stored run: {line}", soft_wrap=True)
    return 2 if changed else 0
