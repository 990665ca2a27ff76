"""`mass run SPEC`: run generations L0 -> L_N locally, end to end, resuming whatever is stored
(see mass_jobs.pipeline.runner). Kill it anywhere and run it again; `mass status SPEC` shows progress."""

from __future__ import annotations

import sys

from mass_jobs.commands.common import open_run, report_lines, work_dir_default
from mass_jobs.pipeline.handlers import HANDLERS
from mass_jobs.pipeline.runner import run
from mass_jobs.spec.overrides import spec_words


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a path or an s3:// URI")
    parser.add_argument(
        "--work-dir",
        default=work_dir_default(),
        help="(default: $MASS_WORK_DIR or .mass-work) local scratch: model cache, logs, checkpoints",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="plain lines instead of a live display: each step's start and end with an ETA, and its progress "
        "notes (the default without a terminal)",
    )
    parser.add_argument(
        "--handler",
        choices=HANDLERS,
        default="in-process",
        help="how each node runs: in-process (cores here, sandboxed episodes; default) or argv (every "
        "node's container command as a subprocess, agent steps in the cluster's phases: prepare, "
        "one `mass episode` per rollout with no store credential, ingest, finish); both store "
        "the same run",
    )
    parser.add_argument(
        "--until",
        metavar="GEN:STEP",
        help="stop once this step of this generation is done, e.g. 0:render to read L0's training "
        "windows before any training; `mass run` without it goes on from there",
    )


def main(args) -> int:

    ctx = open_run(args.spec, check_spec=False)  # a bad spec exits 2 before anything is written
    result = run_reporting_failures(args, "run", ctx)
    if result is None:
        return 1
    if "stopped_after" in result:
        at = result["stopped_after"]
        print(
            f"stopped after L{at['gen']} {at['step']} (--until); `mass run {spec_words(args.spec)}` goes on from there"
        )
        return 0
    print("\n".join(report_lines(ctx, "")))
    return 0


def live_display(no_progress: bool, stream=None) -> bool:
    """The live display needs a terminal: without one (a pipe, a log file, CI) it shows nothing
    until it stops, so the plain lines are printed instead, as with --no-progress."""
    return not no_progress and (stream or sys.stderr).isatty()


def run_reporting_failures(args, what: str, ctx) -> dict | None:
    """Run L0 -> L_N of the opened run `ctx` (its spec claimed by the runner, once); any failure of a
    step is one message and the hint to resume, not a traceback."""

    try:
        return run(
            args.spec,
            work_dir=args.work_dir,
            progress=live_display(args.no_progress),
            handler=getattr(args, "handler", "in-process"),
            until=getattr(args, "until", None),
            ctx=ctx,
        )
    except (RuntimeError, OSError, ValueError) as err:
        from mass_jobs.spec.load import SpecError
        from mass_jobs.store.lease import WriterBusy

        if isinstance(err, (SpecError, WriterBusy)):  # bad input, another writer: exit 2 (mass_jobs.commands.cli)
            raise
        print(f"{what} failed: {err}\n({failure_hint(err, what, args.spec)})", file=sys.stderr)
        return None


def failure_hint(err: BaseException, what: str, spec) -> str:
    """What to do after a failed run, naming this run (its overrides too): rerun to resume, unless
    the failure repeats on every rerun, which only a change of what it names ends."""
    from mass_jobs.config.errors import REPEATS

    words = spec_words(spec)
    if getattr(err, "repeats", False) or REPEATS in str(err):
        return f"{REPEATS}; `mass status {words}` shows where, then `mass {what} {words}` goes on"
    return f"`mass status {words}` shows where; `mass {what} {words}` resumes"
