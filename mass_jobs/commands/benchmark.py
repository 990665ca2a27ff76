"""`mass benchmark SPEC --bench DIR --gen G [--gen G2 ...] [--replicates R]`: bare-prompt rollouts of
each generation on an external benchmark directory, graded by its grader command, and the score table
(see mass_jobs.tools.benchmark). Models are served here by the embedded server. Prints the table."""

from __future__ import annotations

from mass_jobs.commands.common import add_spec, open_run
from mass_jobs.run.generation_model import generation_servers
from mass_jobs.spec.load import SpecError, SpecIssue
from mass_jobs.tools.benchmark import load_benchmark, render_table, run_benchmark


def add_arguments(parser) -> None:
    add_spec(parser)
    parser.add_argument("--bench", required=True, help="benchmark directory (benchmark.yaml, tasks/<id>/prompt.md)")
    parser.add_argument(
        "--gen", type=int, action="append", required=True, help="a generation to score (repeat: --gen 0 --gen 2)"
    )
    parser.add_argument("--replicates", type=int, help="rollouts per task (default: the benchmark's)")
    parser.add_argument("--work-dir", default=".mass-work", help="local cache for model dirs and server logs")


def main(args) -> int:

    ctx = open_run(args.spec)
    bad = [g for g in args.gen if not 0 <= g <= ctx.spec.generations]
    if bad:
        raise SpecError(
            args.spec, [SpecIssue("--gen", f"expected 0..{ctx.spec.generations}, found {bad}")], what="arguments"
        )
    if args.replicates is not None and args.replicates < 1:
        raise SpecError(
            args.spec, [SpecIssue("--replicates", f"expected >= 1, found {args.replicates}")], what="arguments"
        )
    bench = load_benchmark(args.bench)
    work = ctx.work_dir(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    serve_model, _ = generation_servers(ctx, cache_root=work / "models", log_dir=work)
    table = run_benchmark(ctx, bench, sorted(set(args.gen)), serve_model, args.replicates)
    print(render_table(table), end="")
    return 0
