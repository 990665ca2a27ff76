"""What the step commands share: their flags, opening a run, and the generation's model endpoint.

Exit codes are the CLI's (mass_jobs/commands/cli.py): a SpecError (bad spec, unknown task) exits 2 and a
StepFailed exits 1, so commands raise and never print-and-return those themselves.
"""

from __future__ import annotations

import contextlib
import sys

from mass_jobs.episodes.rollouts import agent_ended as ended
from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import served_model_dir
from mass_jobs.serving.backends import serve_model
from mass_jobs.serving.llm import Endpoint
from mass_jobs.spec.load import SpecError, SpecIssue, load_spec
from mass_jobs.store import open_store


def add_spec(parser, *, gen: str | None = None, task: bool = False) -> None:
    """--spec, and --gen with its help text when the command works on one generation, and --task."""
    parser.add_argument("--spec", required=True, help="run spec: a path or an s3:// URI")
    if gen:
        parser.add_argument("--gen", type=int, required=True, help=gen)
    if task:
        parser.add_argument("--task", required=True, help="task id")


def add_common(parser) -> None:
    add_spec(parser, gen="generation g (the model L_g does the work)", task=True)


def add_rollout_phases(
    parser,
    *,
    phases: tuple[str, ...] = ("prepare", "ingest", "finish"),
    phase: str,
    outputs: str,
    lost: str,
    rollout: bool = True,
) -> None:
    """The flags of a step whose episodes run in agent pods on Argo (episodes.rollouts.Phase): --phase,
    --rollout, --outputs, --agent-status (help texts: what each means for this step)."""
    parser.add_argument("--phase", choices=list(phases), help=f"Argo, around agent pods: {phase}")
    if rollout:
        parser.add_argument("--rollout", metavar="KEY", help="with --phase ingest: the rollout (as prepare listed it)")
    parser.add_argument(
        "--outputs",
        metavar="DIR",
        help=f"with --phase prepare: write {outputs}; with --phase "
        "ingest: DIR/outcome (Argo: the template's episode metric)",
    )
    parser.add_argument(
        "--agent-status",
        metavar="PHASE",
        help=f"with --phase ingest: the agent step's Argo phase; Failed or Error with no output {lost}",
    )


def agent_ended(args) -> bool:
    """--agent-status names an agent step that is over (a missing output is lost, not awaited)."""

    return ended(args.agent_status)


def add_model(parser) -> None:
    parser.add_argument(
        "--endpoint",
        help="OpenAI-compatible base URL (…/v1) of the generation's model; default: serve the generation's model here",
    )
    parser.add_argument("--served-model", default="mass", help="model name at --endpoint (default: mass)")
    parser.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")


def open_run(location: str, task: str | None = None, check_spec: bool = True):
    """The RunContext of a validated spec; an unknown task is a spec error (exit 2) naming the choices,
    and so is a spec that differs from the one the run's store holds (`RunContext.claim_spec`)."""

    spec = load_spec(location)
    if task is not None and task not in {t.id for t in spec.resolved_tasks()}:
        ids = [t.id for t in spec.resolved_tasks()]
        raise SpecError(location, [SpecIssue("--task", f"expected one of {ids}, found {task!r}")], what="arguments")
    ctx = RunContext(spec, open_store(spec.store))
    if check_spec:
        ctx.claim_spec(record=False)
    return ctx


def never_ran(ctx) -> str | None:
    """Why there is nothing to read back for this run (its store holds no spec of it), or None."""
    if ctx.store.exists(ctx.spec_key()):
        return None
    return (
        f"run {ctx.run!r} was never started: {ctx.store.uri.rstrip('/')}/{ctx.spec_key()} does not exist "
        f"(start it with `mass run SPEC`, or check the spec's name and store)"
    )


def report_lines(ctx, head: str) -> list[str]:
    """What a finished run prints last: where its report is, its figures (each with what it shows,
    the win share in numbers), then (as the last line) the report's warnings when it has any, so a
    run that did no work cannot end looking like a good one."""
    from mass_jobs.steps.report_render import CAPTIONS, win_share_summary

    where = f"{ctx.store.uri.rstrip('/')}/{ctx.report()}"
    if where.startswith("file://"):  # a path the terminal can open
        where = where.removeprefix("file://")
    doc = ctx.store.get_json(ctx.report_file("report.json"))
    lines = [f"{head}report: {where}/report.md (JSON: {where}/report.json)", "figures:"]
    for name, caption in CAPTIONS.items():
        if ctx.store.exists(ctx.report_file(name)):
            lines.append(f"  {where}/{name}  {caption}")
    lines.append(f"  win share: {win_share_summary(doc)}")
    warnings = doc.get("warnings") or []
    if warnings:
        lines.append(f"WARNING: {len(warnings)} in the report: " + "; ".join(warnings))
    return lines


def work_dir_default() -> str:
    """--work-dir default of every entry: MASS_WORK_DIR (pods set a writable one), else .mass-work."""
    import os

    return os.environ.get("MASS_WORK_DIR", ".mass-work")


@contextlib.contextmanager
def model_endpoint(args, ctx):
    """The endpoint at --endpoint, or the generation's model served here (execution.serving's backend)
    for the duration."""

    if args.endpoint:
        yield Endpoint(base_url=args.endpoint, model=args.served_model, api_key_env=args.api_key_env)
        return
    if ctx.spec.execution.serving == "external":  # every role has an endpoint (spec validation): serve nothing
        from mass_jobs.serving.roles import role_endpoint

        yield role_endpoint(ctx.spec, "executor")
        return
    from pathlib import Path

    # the directory `mass run` serves too: the spec's chat template on the base, FP8 where it is served
    models = ctx.work_dir(Path(getattr(args, "work_dir", None) or work_dir_default())) / "models"
    with serve_model(ctx.spec, served_model_dir(ctx, args.gen, models), ctx.served_model(args.gen)) as endpoint:
        yield endpoint


def run_guarded(fn) -> int:
    """Model-facing steps: a missing input, a model or store failure is one line and exit 1, not a traceback."""
    try:
        return fn()
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        from mass_jobs.spec.load import SpecError

        if isinstance(exc, SpecError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
