"""`mass guard SPEC --gen G --task T`: deterministic guard verdicts of the collected episodes.

Writes gen-<g>/guard/<task>.json (per episode: eligible, passed, reasons) and prints a summary line.
Needs no model.

On the cluster, around agent pods (the check commands run code the model wrote, so never in this
step's pod): `--phase prepare --outputs DIR` writes a checks job per eligible episode and
DIR/rollouts (the agent fan-out); `--phase ingest --rollout KEY [--agent-status PHASE]` stores
one pod's results; `--phase finish` judges with the stored results.
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import add_common, add_rollout_phases, agent_ended, open_run, run_guarded
from mass_jobs.episodes import rollouts
from mass_jobs.steps import guard


def add_arguments(parser) -> None:
    add_common(parser)
    add_rollout_phases(
        parser,
        phase="prepare the checks jobs, ingest one (--rollout), or finish: the check commands "
        "ran in agent pods, judge with their stored results, never run one here",
        outputs="DIR/rollouts",
        lost="stores the checks as lost (they fail)",
    )


def main(args) -> int:
    import sys

    if args.phase == "ingest" and not args.rollout:
        print("--phase ingest needs --rollout (a key the prepare phase listed)", file=sys.stderr)
        return 2

    def go() -> int:

        ctx = open_run(args.spec, args.task)
        if args.phase in ("prepare", "ingest"):
            out = (
                {"rollouts": guard.prepare_checks(ctx, args.gen, args.task)}
                if args.phase == "prepare"
                else guard.ingest_checks(ctx, args.gen, args.task, args.rollout, agent_ended(args))
            )
            rollouts.write_phase_outputs(args.outputs, args.phase, out)
            print(json.dumps(out, sort_keys=True))
            return 0
        report = guard.run_guard(ctx, args.gen, args.task, agent_pods=args.phase == "finish")
        print(
            json.dumps(
                {
                    "task": report.task,
                    "skipped": report.skipped,
                    "usable": report.usable,
                    "vetoed": {e: report.episodes[e].reasons for e in report.vetoed},
                },
                sort_keys=True,
            )
        )
        return 0

    return run_guarded(go)
