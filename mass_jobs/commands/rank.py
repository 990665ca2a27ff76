"""`mass rank SPEC --gen G --task T`: self-judged pairs -> Bradley–Terry -> train/val manifest.

Writes gen-<g>/rank/<task>.json (verdicts, scores, train episode ids, the validation episode id).
Exit 1 with the reason when there are too few usable episodes (see ranking.fallback).
"""

from __future__ import annotations

import json

from mass_jobs.commands.common import add_common, add_model, model_endpoint, open_run, run_guarded
from mass_jobs.serving.roles import client_for
from mass_jobs.steps.rank import run_rank


def add_arguments(parser) -> None:
    add_common(parser)
    add_model(parser)


def main(args) -> int:
    def go() -> int:

        ctx = open_run(args.spec, args.task)
        spec = ctx.spec
        if ctx.store.exists(ctx.guard(args.gen, args.task)) and ctx.store.get_json(ctx.guard(args.gen, args.task)).get(
            "skipped"
        ):
            result = run_rank(ctx, args.gen, args.task, None)  # a skipped task needs no model
        else:
            with model_endpoint(args, ctx) as endpoint:
                result = run_rank(ctx, args.gen, args.task, client_for(spec, endpoint))
        print(
            json.dumps(
                {
                    "task": result.task,
                    "skipped": result.skipped,
                    "train": result.train,
                    "val": result.val,
                    "invalid_verdicts": result.invalid_verdicts,
                },
                sort_keys=True,
            )
        )
        return 0

    return run_guarded(go)
