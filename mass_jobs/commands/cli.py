"""The `mass` command line: a thin dispatcher over one module per command.

Each command lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`.
Exit codes: 0 ok, 2 bad input (a SpecError: every problem listed), 1 a step failed (StepFailed).
Foreseeable environment errors (S3 credentials, endpoint, bucket; model locations; unreachable
servers; missing files) are one line naming what to fix, mapped in one place: `environment_error`.
Modules are imported only when their command runs, so `mass validate` never pays for torch.
Containers in the Argo templates call exactly these entries.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

# The dispatcher imports only the standard library at module level: `mass --help` runs wherever the
# package's code is, before any dependency is importable (a pod's image check); what a command needs
# is imported when it runs.

# name -> (module, one-line help). The single list of entries; tests check each `--help` runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("mass_jobs.commands.validate", "validate a run spec (YAML or JSON); exit 2 lists every error"),
    "schema": ("mass_jobs.commands.schema", "write the JSON Schemas generated from the typed models"),
    "model": ("mass_jobs.commands.model", "model utilities: `mass model tiny --out DIR` builds the tiny test model"),
    "proxy": ("mass_jobs.commands.proxy", "recording proxy for an OpenAI-compatible server: one trace line per call"),
    "episode": ("mass_jobs.commands.episode", "run one agent episode: --in DIR (episode.json, workspace/) --out DIR"),
    "sandbox-serve": (
        "mass_jobs.commands.sandbox_serve",
        "an agent pod's sandbox container: workspace, tools, qwen-code",
    ),
    "egress-serve": (
        "mass_jobs.commands.egress_serve",
        "the run's egress proxy for agent pods (execution.network), recording each rollout's requests",
    ),
    "audit": ("mass_jobs.commands.audit", "behaviour audit per episode: delegation D, code handoff H, revisions"),
    "serve": (
        "mass_jobs.commands.serve",
        "serve a model over the OpenAI chat API (transformers serve) until Ctrl-C; "
        "concurrent requests are served one after another",
    ),
    "render": ("mass_jobs.commands.render", "render SFT windows (`render sft`) or the Kubernetes YAML (`render argo`)"),
    "train": ("mass_jobs.commands.train", "LoRA SFT on the rendered windows; run under torchrun for data parallelism"),
    "select": ("mass_jobs.commands.select", "pick the saved checkpoint with the lowest validation loss"),
    "merge": ("mass_jobs.commands.merge", "merge the selected adapter into L_g (+ optional block-FP8 export) -> L_g+1"),
    "search": ("mass_jobs.commands.search", "workflow search of one task: the whole inner loop, or one --iteration"),
    "collect": ("mass_jobs.commands.collect", "teacher episodes of the elite workflow (one --episode; Argo --phase)"),
    "guard": ("mass_jobs.commands.guard", "deterministic guard verdicts (outputs, protected paths, metrics, checks)"),
    "rank": ("mass_jobs.commands.rank", "pairwise self-verdicts, Bradley-Terry, train/val episode manifest"),
    "rollouts": (
        "mass_jobs.commands.rollouts",
        "an agent step declared outside the package (--step module:NAME), for one task; Argo --phase",
    ),
    "evaluate": (
        "mass_jobs.commands.evaluate",
        "bare-prompt rollouts of L_G and its baselines, judge panel, self-evaluator",
    ),
    "benchmark": (
        "mass_jobs.commands.benchmark",
        "score generations on an external benchmark dir (prompts + grader command)",
    ),
    "compare-runs": (
        "mass_jobs.commands.compare_runs",
        "runs side by side: teacher composition, windows by role, tokens, win share",
    ),
    "report": ("mass_jobs.commands.report", "rebuild <run>/report/ (JSON, Markdown, plots) from stored artifacts"),
    "run": ("mass_jobs.commands.run", "run generations L0 -> L_N locally end to end; rerun to resume"),
    "status": ("mass_jobs.commands.status", "what is done, running, failed or pending in a run"),
    "serve-wait": (
        "mass_jobs.commands.serve_wait",
        "wait for an InferenceService to serve its model, or fail naming "
        "why it cannot (a predictor pod no node takes, a failed load)",
    ),
    "pods": ("mass_jobs.commands.pods", "a run's pods on the cluster: episode, phase, why Pending or ended, logs"),
    "import": (
        "mass_jobs.commands.importer",
        "convert task files of another format: `mass import upstream DIR --out DIR`",
    ),
    "verify": (
        "mass_jobs.commands.verify",
        "re-hash every output of every step manifest of a run; exit 1 if any broke",
    ),
    "plan": (
        "mass_jobs.commands.plan",
        "counts, training memory per GPU and a simulated schedule of a spec, before a run",
    ),
    "demo": (
        "mass_jobs.commands.demo",
        "build the tiny model if missing, run the spec end to end, print the report path",
    ),
}


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def environment_error(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line naming what to fix) for an error of the environment rather than of
    this program, else None (a real bug keeps its traceback). 2: the input or setup is wrong and a
    rerun fails the same way; 1: a step could not reach something that may come back."""
    for e in _chain(exc):
        mod = type(e).__module__
        name = type(e).__name__
        if mod.startswith("botocore") and (found := _s3_error(e, name)) is not None:
            return found
        if name == "ModelLocationError":
            return 2, str(e)
        if name == "WarmCheckFailed":  # the build's float kernels trained a model the demo cannot use
            return 1, str(e)
        if mod.startswith(("openai", "httpx", "requests", "urllib3")) and "Connect" in name:
            return 1, f"cannot reach a server ({name}: {e}); check the endpoint URL and that it is running"
        if mod.startswith("huggingface_hub") and name in (
            "RepositoryNotFoundError",
            "LocalEntryNotFoundError",
            "OfflineModeIsEnabled",
            "GatedRepoError",
            "RevisionNotFoundError",
        ):
            return 1, (
                f"Hugging Face Hub: {str(e).splitlines()[0]} (a mistyped local path is taken for a hub id; "
                "`mass validate` says which)"
            )
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)) and e.filename:
            return 2, f"{e.strerror or name}: {e.filename}"
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):  # a rerun resumes once there is room
            where = f": {e.filename}" if e.filename else ""
            return (
                1,
                f"{'no space left on the device' if e.errno == errno.ENOSPC else 'disk quota exceeded'}{where}; free room and rerun",
            )
    return None


def _s3_error(e: BaseException, name: str) -> tuple[int, str] | None:
    """`environment_error` of a botocore error: credentials, endpoint, region, bucket."""
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return 2, (
            "S3: no credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE) in the environment of this command"
        )
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError"):
        from urllib.parse import urlsplit

        parts = urlsplit(getattr(e, "kwargs", {}).get("endpoint_url", ""))
        url = f"{parts.scheme}://{parts.netloc}" if parts.netloc else "(unknown)"
        return 1, (
            f"S3: cannot reach the endpoint {url}; check store.endpoint_url "
            "(or AWS_ENDPOINT_URL) and that the server is up"
        )
    if name == "NoRegionError":
        return 2, "S3: no region; set store.region or AWS_REGION"
    if any(c.__name__ == "ClientError" for c in type(e).__mro__):  # errorfactory subclasses too
        err = getattr(e, "response", {}).get("Error", {})
        code, bucket = err.get("Code", "?"), err.get("BucketName")
        if code == "NoSuchBucket":
            where = f"{bucket!r} " if bucket else ""
            return 2, f"S3: the bucket {where}does not exist at this endpoint; create it or fix store.uri"
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "ExpiredToken"):
            return 2, (
                f"S3: the credentials were refused ({code}); check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY and the bucket's policy"
            )
    return None


SPEC_HELP = "run spec: a YAML/JSON path (relative paths in it resolve against its folder) or an s3:// URI"


def spec_either_way(parser: argparse.ArgumentParser) -> None:
    """One convention for every command: `mass CMD SPEC`; `--spec SPEC` (what the Argo templates
    and the runner pass to step commands) keeps working. Applied to the command's parsers after
    `add_arguments`, so each command declares its spec in whichever form it has."""
    for action in list(parser._actions):
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                spec_either_way(child)
        elif action.dest == "spec" and not action.option_strings:  # positional SPEC: add --spec
            action.nargs, action.default, action.required = "?", None, False
            action.metavar, action.help = "SPEC", SPEC_HELP
            parser.add_argument("--spec", dest="spec_flag", metavar="SPEC", help="the same as SPEC")
            overrides(parser)
        elif action.dest == "spec":  # --spec: add a positional SPEC
            action.required, action.metavar, action.help = False, "SPEC", "the same as SPEC"
            parser.add_argument("spec_flag", nargs="?", metavar="SPEC", help=SPEC_HELP)
            overrides(parser)


def overrides(parser: argparse.ArgumentParser) -> None:
    """Changes to the spec itself (spec/overrides.py): every command that reads a spec takes them, and
    they reach hashes, the run's claimed spec and manifests as the spec file's own values would."""
    parser.add_argument(
        "--overlay",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML mapping merged into the spec (repeat; applied in order, before --set)",
    )
    parser.add_argument(
        "--set",
        dest="set_values",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="one spec value, e.g. sft.parallel=fsdp or tasks.0.split=test (VALUE read as YAML; repeat)",
    )


def merge_spec(args: argparse.Namespace) -> str | None:
    """args.spec from SPEC or --spec; an error message when neither or two different ones are given."""
    if not hasattr(args, "spec_flag"):
        return None
    given = {v for v in (args.spec, args.spec_flag) if v is not None}
    if len(given) != 1:
        found = " and ".join(sorted(given)) or "none"
        return f"expected one run spec (`mass {args.command} SPEC`), found {found}"
    from mass_jobs.spec.overrides import SpecSource

    args.spec = SpecSource(given.pop(), args.overlay, args.set_values)
    del args.spec_flag, args.overlay, args.set_values
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mass", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        if name != command:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        mod = importlib.import_module(module)
        # the description is the command's module docstring: what it does, its forms, exit codes
        p = sub.add_parser(
            name,
            help=help_text,
            description=f"{help_text}\n\n{mod.__doc__ or ''}".strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        spec_either_way(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    problem = merge_spec(args)
    if problem:
        print(f"mass {args.command}: {problem}", file=sys.stderr)
        return 2

    from mass_jobs.config.errors import REPEATS, StepFailed
    from mass_jobs.spec.load import SpecError
    from mass_jobs.store.lease import WriterBusy

    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).main(args) or 0)
    except SpecError as err:  # bad input: every problem listed, nothing written
        print(err, file=sys.stderr)
        return 2
    except WriterBusy as err:  # another writer holds the run or the step: nothing written
        print(f"mass {args.command}: {err}", file=sys.stderr)
        return 2
    except StepFailed as err:
        print(f"mass {args.command}: {err}" + (f"\n({REPEATS})" if err.repeats else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mass {args.command}: interrupted (rerun to resume)", file=sys.stderr)
        return 130
    except Exception as err:
        known = environment_error(err)
        if known is None:
            raise
        print(f"mass {args.command}: {known[1]}", file=sys.stderr)
        return known[0]


if __name__ == "__main__":
    sys.exit(main())
