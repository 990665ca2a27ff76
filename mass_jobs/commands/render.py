"""`mass render <what>`: render artifacts from stored inputs; one sub-command per artifact.

    mass render sft examples/tiny.yaml --gen 0     SFT windows of generation 0
    mass render argo --out argo/                          Argo YAML (mass_jobs/k8s/render_command.py)
Sub-commands are listed in SUBCOMMANDS as "module" or "module:attribute"; the target exposes
`add_arguments(parser)` and `main(args) -> int`, and heavy imports stay inside `main`.
"""

from __future__ import annotations

import argparse
import importlib

from mass_jobs.commands.common import open_run, work_dir_default
from mass_jobs.episodes.rollouts import write_value
from mass_jobs.run.generation_model import local_model_dir
from mass_jobs.steps.render_sft import run_render

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sft": ("mass_jobs.commands.render:SftCommand", "masked SFT windows: <run>/gen-<g>/sft/{train,val}.jsonl"),
    "argo": ("mass_jobs.k8s.render_command", "Argo WorkflowTemplates + CronWorkflow (--manifests, --chart: the rest)"),
}


def _target(name: str):
    module, _, attr = SUBCOMMANDS[name][0].partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="render_what", metavar="WHAT", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        _target(name).add_arguments(sub.add_parser(name, help=help_text, description=help_text))


def main(args: argparse.Namespace) -> int:
    return int(_target(args.render_what).main(args) or 0)


class SftCommand:
    """`mass render sft SPEC --gen G`"""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:

        parser.add_argument("--spec", required=True, help="run spec: local path or s3:// URI")
        parser.add_argument("--gen", type=int, required=True, help="generation whose collected episodes are rendered")
        parser.add_argument(
            "--work-dir",
            default=work_dir_default(),
            help="(default: $MASS_WORK_DIR or .mass-work) local cache for the model's tokenizer",
        )
        parser.add_argument("--outputs", metavar="DIR", help="write DIR/supervised-tokens (Argo: the step's metric)")

    @staticmethod
    def main(args: argparse.Namespace) -> int:

        from transformers import AutoTokenizer

        ctx = open_run(args.spec)
        spec = ctx.spec
        where = spec.model.tokenizer or local_model_dir(ctx, args.gen, ctx.work_dir(args.work_dir) / "models")
        extra = run_render(ctx, args.gen, AutoTokenizer.from_pretrained(where))

        write_value(args.outputs, "supervised-tokens", extra["stored_supervised_tokens"])
        print(
            f"{extra['windows']} train windows {extra['windows_by_role']}, {extra['val_windows']} val windows, "
            f"{extra['stored_supervised_tokens']} stored supervised tokens"
        )
        return 0
