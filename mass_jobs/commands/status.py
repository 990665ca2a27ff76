"""`mass status SPEC`: what is done, running, interrupted, failed or pending, per generation and
step, from the step manifests and the runner's `<run>/run-state.json`."""

from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a path or an s3:// URI")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def main(args) -> int:
    from mass_jobs.commands.common import open_run
    from mass_jobs.runner import RunState, step_status

    ctx = open_run(args.spec)
    spec = ctx.spec
    rows = step_status(ctx)
    state = RunState(ctx).load()
    if args.json:
        print(json.dumps({"run": spec.name, "steps": rows, "failed": state.get("failed")}, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    colors = {"done": "green", "running": "cyan", "failed": "red", "interrupted": "yellow", "pending": "dim"}
    table = Table(title=f"run {spec.name}")
    for col in ("gen", "step", "status", "detail"):
        table.add_column(col)
    for r in rows:
        table.add_row(f"L{r['gen']}", r["step"], f"[{colors[r['status']]}]{r['status']}", r["detail"])
    console = Console()
    console.print(table)
    if state.get("failed"):
        f = state["failed"]
        console.print(f"[red]failed: L{f['gen']} {f['step']}: {f['error']}")
    return 0
