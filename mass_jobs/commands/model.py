"""`mass model tiny --out DIR [--seed N] [--warm]`: build the tiny Qwen3 test model (no download);
`--warm` fine-tunes it briefly on synthetic harness conversations so its replies are well-formed."""

from __future__ import annotations


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)
    tiny = sub.add_parser("tiny", help="write the tiny Qwen3 model + tokenizer + chat template to a directory")
    tiny.add_argument("--out", required=True, help="output directory (created if missing)")
    tiny.add_argument("--seed", type=int, default=0, help="weight init seed; the same seed gives identical files")
    tiny.add_argument("--warm", action="store_true",
                      help="then fine-tune about a minute on synthetic harness conversations")


def main(args) -> int:
    from mass_jobs.tiny import build_tiny_model

    out = build_tiny_model(args.out, seed=args.seed, warm=args.warm)
    print(f"tiny{' warm' if args.warm else ''} model (seed {args.seed}) written to {out}")
    return 0
