"""`mass demo SPEC` (what `make demo` runs with examples/tiny.yaml): build the WARM tiny model when
the spec's `model.base` directory is missing or was built by another version of the builder (the
build is cached in that directory, keyed by seed and builder version: `mass_jobs.tiny.warm.warm_key`;
the repository ships it built in models/tiny-warm), run L0 -> L_N, and print where the report is
and how long the build and the run took."""

from __future__ import annotations

from mass_jobs.commands.common import open_run, report_lines
from mass_jobs.commands.run import run_reporting_failures
from mass_jobs.spec.bounds import parse_document
from mass_jobs.spec.locations import absolute_paths
from mass_jobs.spec.overrides import spec_location


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec whose model.base is a local directory")
    parser.add_argument("--work-dir", default=".mass-work", help="local scratch: model cache, logs, checkpoints")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="plain lines instead of a live display: each step's start and end with an ETA, and its progress "
        "notes (the default without a terminal)",
    )


def main(args) -> int:
    import time
    from pathlib import Path

    spec_path = Path(spec_location(args.spec))
    if spec_path.is_file():  # build before validating: a missing model dir is an error there
        doc = absolute_paths(parse_document(spec_path.read_text(), args.spec), spec_path.parent.resolve())
        model = doc.get("model") if isinstance(doc, dict) else None
        base = Path(str(model.get("base", ""))) if isinstance(model, dict) else Path()
        from mass_jobs.tiny.warm import cached_build, is_tiny_build

        if base.is_absolute() and (not (base / "config.json").exists() or is_tiny_build(base)):
            from mass_jobs.pipeline.progress import clock, warm_printer

            _, seconds = cached_build(
                base, seed=0, on_step=warm_printer(every=100), say=lambda text: print(text, flush=True)
            )
            if seconds is not None:
                print(f"warm tiny model built in {clock(seconds)}", flush=True)
    ctx = open_run(args.spec, check_spec=False)
    started = time.monotonic()
    if run_reporting_failures(args, "demo", ctx) is None:
        return 1

    print("\n".join(report_lines(ctx, f"done in {time.monotonic() - started:.0f}s; ")))
    return 0
