"""`mass rollouts --step module:NAME --spec SPEC --gen G --task T`: an agent step declared outside the
package (`episodes.agent_step.AgentStep`), for one task.

Without --phase every missing rollout runs here (sandboxed), calling the model at --endpoint or the
generation's model served here, then the task's result is stored. On the cluster, around agent pods:
`--phase prepare --endpoint URL --outputs DIR` writes their inputs and DIR/rollouts; `--phase ingest
--rollout KEY [--agent-status PHASE]` stores one pod's output; `--phase finish` stores the result,
refusing while a rollout is missing. Prints one JSON line.
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import (
    add_common,
    add_model,
    add_rollout_phases,
    agent_ended,
    model_endpoint,
    open_run,
    run_guarded,
)
from mass_jobs.episodes.agent_step import declared
from mass_jobs.episodes.rollouts import episode_runner, write_phase_outputs
from mass_jobs.serving.llm import Endpoint
from mass_jobs.spec.load import SpecError, SpecIssue


def add_arguments(parser) -> None:
    parser.add_argument(
        "--step",
        required=True,
        metavar="MODULE:NAME",
        help="the AgentStep to run: an importable module and the name it has there",
    )
    add_common(parser)
    add_model(parser)
    add_rollout_phases(
        parser,
        phase="prepare the task's rollouts (needs --endpoint), ingest one (--rollout), or "
        "finish: store the result of the rollouts the agent pods ran",
        outputs="DIR/rollouts (JSON list)",
        lost="stores an infra_error rollout",
    )


def main(args) -> int:
    try:
        step = declared(args.step)
    except ValueError as err:  # bad input: exit 2 naming the flag
        raise SpecError("mass rollouts", [SpecIssue("--step", str(err))], what="arguments") from None

    def go() -> int:
        ctx = open_run(args.spec, args.task)
        if args.phase:
            endpoint = Endpoint(args.endpoint, args.served_model, args.api_key_env) if args.endpoint else None
            out = step.run(
                ctx,
                args.gen,
                args.task,
                phase=args.phase,
                endpoint=endpoint,
                rollout=args.rollout,
                agent_ended=agent_ended(args),
            )
            write_phase_outputs(args.outputs, args.phase, out)
        else:
            with model_endpoint(args, ctx) as endpoint:
                out = step.run(ctx, args.gen, args.task, episode_runner(ctx.spec, endpoint))
        print(json.dumps(out, sort_keys=True, default=str))
        return 0

    return run_guarded(go)
