"""`mass evaluate SPEC --gen G`: bare-prompt rollouts of L_G and its baselines, the judge panel
and the self-evaluator (see mass_jobs.steps.evaluate). Models are served here by the embedded
server; judges with `endpoint: local` too. Prints the step manifest's summary as JSON."""

from __future__ import annotations

import json
import sys

from mass_jobs.commands.common import add_spec, open_run, work_dir_default


def add_arguments(parser) -> None:
    add_spec(parser, gen="generation G >= 1 (L_G vs L_0 and L_{G-1})")
    parser.add_argument("--work-dir", default=work_dir_default(), help="(default: $MASS_WORK_DIR or .mass-work) local cache for model dirs and server logs")


def main(args) -> int:
    from pathlib import Path

    from mass_jobs.steps.evaluate import default_servers, evaluate

    ctx = open_run(args.spec)
    spec = ctx.spec
    if not 1 <= args.gen <= spec.generations:
        print(f"--gen: expected 1..{spec.generations} (generations), got {args.gen}", file=sys.stderr)
        return 2
    work = Path(args.work_dir) / spec.name
    work.mkdir(parents=True, exist_ok=True)
    serve_model, serve_judge = default_servers(ctx, cache_root=work / "models", log_dir=work)
    try:
        manifest = evaluate(ctx, args.gen, serve_model, serve_judge)
    except (RuntimeError, FileNotFoundError, ValueError) as err:
        print(f"evaluate: {err}", file=sys.stderr)
        return 1
    print(json.dumps(manifest["extra"], sort_keys=True))
    return 0
