"""`mass validate SPEC`: exit 0 when the spec is valid, exit 2 listing every error (path, expected, found)."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a YAML/JSON path or an s3:// URI")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")


def main(args) -> int:
    from mass_jobs.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        print(f"{exc.source}: invalid run spec, {len(exc.issues)} error(s):", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        return 2
    if not args.quiet:
        tasks = spec.resolved_tasks()
        n_train = sum(t.split == "train" for t in tasks)
        print(f"{args.spec}: valid run spec {spec.name!r}: {len(tasks)} task(s) ({n_train} train, "
              f"{len(tasks) - n_train} test), {spec.generations} generation(s), store {spec.store.uri}")
    return 0
