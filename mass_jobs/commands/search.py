"""`mass search SPEC --gen G --task T [--iteration K]`: the workflow search of one task.

Without --iteration the whole loop runs (resuming what is stored); with it exactly iteration K runs
and one JSON line {"continue": bool, "next": K+1|null, ...} is printed for Argo's bounded recursion.
The model is the one at --endpoint (e.g. the generation's InferenceService), or, without it, the
generation's model served here by the embedded server.
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import add_common, add_model, client_for, model_endpoint, open_run, run_guarded


def add_arguments(parser) -> None:
    add_common(parser)
    add_model(parser)
    parser.add_argument("--iteration", type=int, help="run only this iteration (0..search.iterations)")


def main(args) -> int:
    def go() -> int:
        from mass_jobs.steps.search import episode_executor, run_search

        ctx = open_run(args.spec, args.task)
        spec = ctx.spec
        with model_endpoint(args, ctx) as endpoint:
            out = run_search(ctx, args.gen, args.task, client_for(spec, endpoint), episode_executor(spec, endpoint),
                             iteration=args.iteration)
        print(json.dumps(out, sort_keys=True))
        return 0

    return run_guarded(go)
