"""`mass import upstream DIR --out DIR`: convert an upstream MASS task directory (splits.json,
bare/ prompts, initial/ task-plus-agent-list files) to native task files, one YAML per task, and
print the `tasks:` entries a spec lists them with (see mass_jobs.spec.upstream_tasks).
One upstream file can also be used as is: `{file: x.txt, format: upstream, id: ..., split: ...}`."""

from __future__ import annotations

from pathlib import Path

from mass_jobs.spec.upstream_tasks import REVIEW, convert, overlay, write


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="import_what", metavar="FORMAT", required=True)
    what = "convert an upstream MASS task directory (with splits.json) to native task files"
    up = sub.add_parser("upstream", help=what, description=what)
    up.add_argument("dir", metavar="DIR", help="the upstream task directory (holds splits.json)")
    up.add_argument("--out", required=True, metavar="DIR", help="where the task files are written (created)")
    up.add_argument(
        "--for",
        dest="for_spec",
        metavar="SPEC",
        help="also write DIR/overlay.yaml, which runs these tasks as SPEC's: "
        "`mass run SPEC --overlay DIR/overlay.yaml`",
    )


def main(args) -> int:

    docs, notes = convert(Path(args.dir))  # a SpecError exits 2 naming every missing file or key
    paths = write(docs, Path(args.out))
    if args.for_spec:
        import yaml

        path = Path(args.out) / "overlay.yaml"
        path.write_text(
            f"# The tasks imported from {args.dir}, as {args.for_spec}'s tasks.\n"
            + yaml.safe_dump(overlay(paths, Path(args.for_spec)), sort_keys=False)
        )
        print(f"run them: mass run {args.for_spec} --overlay {path}")
    review = sum(1 for d in docs if len(d.get(REVIEW, ())) > 1)
    if review:
        print(f"{review} task file(s) open with what a person must still review (deliverables, guards)")
    print(
        f"{len(paths)} task file(s) written to {args.out}; list them in a spec (absolute paths here; a spec "
        "may name them relative to its own folder):"
    )
    print("tasks:")
    for p in paths:
        print(f"  - file: {p.resolve()}")
    for note in notes:
        print(f"note: {note}")
    return 0
