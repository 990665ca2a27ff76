"""`mass search SPEC --gen G --task T [--iteration K]`: the workflow search of one task.

Without --iteration the whole loop runs (resuming what is stored); with it exactly iteration K runs
and one JSON line {"continue": bool, "next": K+1|null, ...} is printed for Argo's bounded recursion.
The model is the one at --endpoint (e.g. the generation's InferenceService), or, without it, the
generation's model served here by the embedded server; rollouts run here, sandboxed. On the cluster
they run only in agent pods: `--phase prepare` writes their inputs (and W_K's proposal, asked of
the optimizer) and lists them in `--outputs DIR/rollouts`; `--phase ingest --rollout KEY` stores
one pod's output; `--phase finish` then judges and saves the iteration, refusing a rollout that is
not stored.
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import add_common, add_model, add_rollout_phases, model_endpoint, open_run, run_guarded
from mass_jobs.episodes.rollouts import episode_runner, write_phase_outputs
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.roles import client_for
from mass_jobs.steps.search import run_search


def add_arguments(parser) -> None:
    add_common(parser)
    add_model(parser)
    parser.add_argument("--iteration", type=int, help="run only this iteration (0..search.iterations)")
    add_rollout_phases(
        parser,
        phase="prepare an iteration's rollouts (needs --iteration, --endpoint; --outputs DIR "
        "gets DIR/rollouts), ingest one (--rollout), or finish: the rollouts ran in agent pods, "
        "judge and save the iteration (needs --endpoint), never run one here",
        outputs="DIR/rollouts (JSON list)",
        lost="stores an infra_error rollout",
    )


def main(args) -> int:
    def go() -> int:
        ctx = open_run(args.spec, args.task)
        spec = ctx.spec
        if args.phase:  # the cluster: rollouts run in agent pods, never here
            if args.phase == "finish" and not args.endpoint:
                raise ValueError("--phase finish needs --endpoint (the model the optimizer and evaluator call)")
            endpoint = Endpoint(args.endpoint, args.served_model, args.api_key_env) if args.endpoint else None
            out = run_search(
                ctx,
                args.gen,
                args.task,
                client_for(spec, endpoint) if endpoint else None,
                None,
                iteration=args.iteration,
                phase=args.phase,
                endpoint=endpoint,
                rollout_key=args.rollout,
                agent_status=args.agent_status,
            )
            write_phase_outputs(args.outputs, args.phase, out)
        else:
            with model_endpoint(args, ctx) as endpoint:
                out = run_search(
                    ctx,
                    args.gen,
                    args.task,
                    client_for(spec, endpoint),
                    episode_runner(spec, endpoint),
                    iteration=args.iteration,
                )
        print(json.dumps(out, sort_keys=True))
        return 0

    return run_guarded(go)
