"""`mass demo SPEC` (what `make demo` runs with examples/tiny.yaml): build the WARM tiny model when
the spec's `model.base` directory is missing (a random one gives a report of dashes: no valid
verdict, proposal or delegation), run L0 -> L_N, and print where the report is."""

from __future__ import annotations



def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec whose model.base is a local directory")
    parser.add_argument("--work-dir", default=".mass-work", help="local scratch: model cache, logs, checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="plain output instead of a live display")


def main(args) -> int:
    import time
    from pathlib import Path

    from mass_jobs.commands.common import open_run
    from mass_jobs.commands.run import run_reporting_failures

    ctx = open_run(args.spec)
    base = Path(ctx.spec.model.base)
    if not (base / "config.json").exists():
        from mass_jobs.tiny import build_tiny_model

        print(f"building the warm tiny model at {base} (about a minute)")
        build_tiny_model(base, seed=0, warm=True)
    started = time.monotonic()
    if run_reporting_failures(args, "demo") is None:
        return 1
    where = f"{ctx.store.uri.rstrip('/')}/{ctx.report()}"
    print(f"done in {time.monotonic() - started:.0f}s; report: {where}/report.md (JSON: {where}/report.json)")
    return 0
