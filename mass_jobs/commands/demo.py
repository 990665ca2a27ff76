"""`mass demo SPEC` (what `make demo` runs with examples/tiny.yaml): build the WARM tiny model when
the spec's `model.base` directory is missing (a random one gives a report of dashes: no valid
verdict, proposal or delegation), run L0 -> L_N, and print where the report is."""

from __future__ import annotations



def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec whose model.base is a local directory")
    parser.add_argument("--work-dir", default=".mass-work", help="local scratch: model cache, logs, checkpoints")
    parser.add_argument("--no-progress", action="store_true",
                        help="plain lines instead of a live display: each step's start and end with an ETA, and its progress notes")


def main(args) -> int:
    import time
    from pathlib import Path

    from mass_jobs.commands.common import open_run
    from mass_jobs.commands.run import run_reporting_failures
    from mass_jobs.spec import absolute_paths, parse_document

    spec_path = Path(args.spec)
    if spec_path.is_file():  # build before validating: a missing model dir is an error there
        doc = absolute_paths(parse_document(spec_path.read_text(), args.spec), spec_path.parent.resolve())
        model = doc.get("model") if isinstance(doc, dict) else None
        base = Path(str(model.get("base", ""))) if isinstance(model, dict) else Path()
        if base.is_absolute() and not (base / "config.json").exists():
            from mass_jobs.progress import warm_printer
            from mass_jobs.tiny import build_tiny_model

            print(f"building the warm tiny model at {base} (about 3 minutes on 2 CPU cores)", flush=True)
            build_tiny_model(base, seed=0, warm=True, on_step=warm_printer(every=100))
    ctx = open_run(args.spec)
    started = time.monotonic()
    if run_reporting_failures(args, "demo") is None:
        return 1
    where = f"{ctx.store.uri.rstrip('/')}/{ctx.report()}"
    print(f"done in {time.monotonic() - started:.0f}s; report: {where}/report.md (JSON: {where}/report.json)")
    return 0
