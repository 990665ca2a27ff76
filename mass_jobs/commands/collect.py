"""`mass collect SPEC --gen G --task T [--episode I [--phase prepare|ingest]] [--phase finish]`: teacher episodes.

Without --episode every missing episode runs here (execution.concurrency at once) and the task's
summary is written. `--episode I` runs one episode here; with `--phase prepare` it only writes the
agent pod's input (needs --endpoint: the model the pod will call) and, with `--outputs DIR`, writes
`DIR/agent` = true|false (whether an agent pod must run: false for a skipped task or a stored
episode) and `DIR/rollout` (the episode's dir relative to the run, where the pod's artifacts live);
with `--phase ingest` it checks and stores the pod's output (none after `--agent-status
Failed|Error`: an infra_error episode). `--phase finish` (no --episode) only writes the task's summary, refusing while an
episode is missing. Prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json

from mass_jobs.commands.common import add_common, add_model, add_rollout_phases, model_endpoint, open_run, run_guarded
from mass_jobs.episodes.rollouts import episode_runner, write_phase_outputs
from mass_jobs.serving.llm import Endpoint
from mass_jobs.steps.collect import run_collect


def add_arguments(parser) -> None:
    add_common(parser)
    add_model(parser)
    parser.add_argument("--episode", type=int, help="only this episode index (0..collection.episodes-1)")
    add_rollout_phases(
        parser,
        phase="prepare/ingest around an agent pod (need --episode); finish: the task's "
        "summary, once every episode is stored",
        outputs="DIR/agent (true|false) and DIR/rollout",
        lost="records an infra_error episode",
        rollout=False,
    )


def main(args) -> int:
    def go() -> int:

        if args.phase in ("prepare", "ingest") and args.episode is None:
            raise ValueError(f"--phase {args.phase} needs --episode")
        ctx = open_run(args.spec, args.task)
        spec = ctx.spec
        if args.phase:
            endpoint = Endpoint(args.endpoint, args.served_model, args.api_key_env) if args.endpoint else None
            out = run_collect(
                ctx,
                args.gen,
                args.task,
                None,
                episode=args.episode,
                phase=args.phase,
                endpoint=endpoint,
                agent_status=args.agent_status,
            )
            write_phase_outputs(args.outputs, args.phase, out)
        else:
            with contextlib.ExitStack() as stack:
                endpoint = stack.enter_context(model_endpoint(args, ctx))
                out = run_collect(ctx, args.gen, args.task, episode_runner(spec, endpoint), episode=args.episode)
        print(json.dumps(out, sort_keys=True, default=str))
        return 0

    return run_guarded(go)
