"""`mass run SPEC`: run generations L0 -> L_N locally, end to end, resuming whatever is stored
(see mass_jobs.runner). Kill it anywhere and run it again; `mass status SPEC` shows progress."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a path or an s3:// URI")
    parser.add_argument("--work-dir", default=".mass-work", help="local scratch: model cache, logs, checkpoints")
    parser.add_argument("--no-progress", action="store_true", help="plain output instead of a live display")


def main(args) -> int:
    from mass_jobs.runner import RunError, run  # noqa: F401 (RunError is a RuntimeError)
    from mass_jobs.spec import SpecError

    try:
        manifest = run(args.spec, work_dir=args.work_dir, progress=not args.no_progress)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    except (RunError, RuntimeError, OSError, ValueError) as err:
        print(f"run failed: {err}", file=sys.stderr)
        return 1
    from mass_jobs.spec import load_spec
    from mass_jobs.store import open_store

    spec = load_spec(args.spec)
    where = f"{open_store(spec.store).uri.rstrip('/')}/{spec.name}/report"
    print(f"report: {where}/report.md (JSON: {where}/report.json; {len(manifest['outputs'])} files)")
    return 0
