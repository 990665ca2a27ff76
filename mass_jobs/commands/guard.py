"""`mass guard SPEC --gen G --task T`: deterministic guard verdicts of the collected episodes.

Writes gen-<g>/guard/<task>.json (per episode: eligible, passed, reasons) and prints a summary line.
Needs no model.
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import add_common, open_run, run_guarded


def add_arguments(parser) -> None:
    add_common(parser)


def main(args) -> int:
    def go() -> int:
        from mass_jobs.steps.guard import run_guard

        ctx = open_run(args.spec, args.task)
        report = run_guard(ctx, args.gen, args.task)
        print(json.dumps({"task": report.task, "skipped": report.skipped, "usable": report.usable,
                          "vetoed": {e: report.episodes[e].reasons for e in report.vetoed}}, sort_keys=True))
        return 0

    return run_guarded(go)
