"""`mass demo SPEC` (what `make demo` runs with examples/tiny.yaml): build the tiny model when the
spec's `model.base` directory is missing, run L0 -> L_N, and print where the report is."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec whose model.base is a local directory")
    parser.add_argument("--work-dir", default=".mass-work", help="local scratch: model cache, logs, checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="plain output instead of a live display")


def main(args) -> int:
    import time
    from pathlib import Path

    from mass_jobs.runner import RunError, run
    from mass_jobs.spec import SpecError, load_spec
    from mass_jobs.store import open_store

    try:
        spec = load_spec(args.spec)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    base = Path(spec.model.base)
    if not (base / "config.json").exists():
        from mass_jobs.tiny import build_tiny_model

        print(f"building the tiny model at {base}")
        build_tiny_model(base, seed=0)
    started = time.monotonic()
    try:
        run(args.spec, work_dir=args.work_dir, progress=not args.no_progress)
    except (RunError, RuntimeError, OSError, ValueError) as err:  # as `mass run`: a message, not a traceback
        print(f"demo failed: {err}\n(`mass status {args.spec}` shows where; rerun to resume)", file=sys.stderr)
        return 1
    store = open_store(spec.store)
    where = f"{store.uri.rstrip('/')}/{spec.name}/report"
    print(f"done in {time.monotonic() - started:.0f}s; report: {where}/report.md (JSON: {where}/report.json)")
    return 0
