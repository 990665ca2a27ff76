"""The `mass` command line: a thin dispatcher over one module per command.

Each command lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`.
Exit codes: 0 ok, 2 bad input (a SpecError: every problem listed), 1 a step failed (StepFailed).
Modules are imported only when their command runs, so `mass validate` never pays for torch.
Containers in the Argo templates call exactly these entries.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). The single list of entries; tests check each `--help` runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("mass_jobs.commands.validate", "validate a run spec (YAML or JSON); exit 2 lists every error"),
    "schema": ("mass_jobs.commands.schema", "write the JSON Schemas generated from the typed models"),
    "model": ("mass_jobs.commands.model", "model utilities: `mass model tiny --out DIR` builds the tiny test model"),
    "proxy": ("mass_jobs.commands.proxy", "recording proxy for an OpenAI-compatible server: one trace line per call"),
    "episode": ("mass_jobs.commands.episode", "run one agent episode: --in DIR (episode.json, workspace/) --out DIR"),
    "audit": ("mass_jobs.commands.audit", "behaviour audit per episode: delegation D, code handoff H, revisions"),
    "serve": ("mass_jobs.commands.serve", "serve a model over the OpenAI chat API (transformers serve) until Ctrl-C"),
    "render": ("mass_jobs.commands.render", "render SFT windows (`render sft`) or the Kubernetes YAML (`render argo`)"),
    "train": ("mass_jobs.commands.train", "LoRA SFT on the rendered windows; run under torchrun for data parallelism"),
    "select": ("mass_jobs.commands.select", "pick the saved checkpoint with the lowest validation loss"),
    "merge": ("mass_jobs.commands.merge", "merge the selected adapter into L_g (+ optional block-FP8 export) -> L_g+1"),
    "search": ("mass_jobs.commands.search", "workflow search of one task: the whole inner loop, or one --iteration"),
    "collect": ("mass_jobs.commands.collect", "teacher episodes of the elite workflow (one --episode; Argo --phase)"),
    "guard": ("mass_jobs.commands.guard", "deterministic guard verdicts (outputs, protected paths, metrics, checks)"),
    "rank": ("mass_jobs.commands.rank", "pairwise self-verdicts, Bradley-Terry, train/val episode manifest"),
    "evaluate": ("mass_jobs.commands.evaluate", "bare-prompt rollouts of L_G and its baselines, judge panel, self-evaluator"),
    "report": ("mass_jobs.commands.report", "rebuild <run>/report/ (JSON, Markdown, plots) from stored artifacts"),
    "run": ("mass_jobs.commands.run", "run generations L0 -> L_N locally end to end; rerun to resume"),
    "status": ("mass_jobs.commands.status", "what is done, running, failed or pending in a run"),
    "demo": ("mass_jobs.commands.demo", "build the tiny model if missing, run the spec end to end, print the report path"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mass", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    from mass_jobs.errors import StepFailed
    from mass_jobs.spec import SpecError

    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).main(args) or 0)
    except SpecError as err:  # bad input: every problem listed, nothing written
        print(err, file=sys.stderr)
        return 2
    except StepFailed as err:
        print(f"mass {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
