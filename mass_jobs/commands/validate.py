"""`mass validate SPEC`: exit 0 when the spec is valid, exit 2 listing every error (path, expected, found).

With `--gen G --outputs DIR` it also writes the small values the Argo templates fan out over
(docs/architecture.md, "Argo"): the first step of every cycle is this validation, so a bad spec
stops the workflow before anything is created or written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a YAML/JSON path or an s3:// URI")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    parser.add_argument("--gen", type=int, default=0, help="generation the outputs are for (with --outputs)")
    parser.add_argument("--outputs", metavar="DIR", help="also write the Argo step outputs into DIR")


def argo_outputs(spec, gen: int) -> dict[str, str]:
    """File name -> content of the values a cycle's Argo steps read (all small: ids, counts, URIs)."""
    from mass_jobs.context import RunContext

    train = [t.id for t in spec.resolved_tasks() if t.split == "train"]
    bucket, _, prefix = spec.store.uri.removeprefix("s3://").partition("/")
    run_prefix = "/".join(p for p in (prefix.strip("/"), spec.name) if p)
    if gen == 0:
        base = spec.model.base
        model_uri = base if base.startswith("s3://") else f"hf://{base}"
    else:  # merged models are stored as plain objects under the run, where KServe can fetch them
        model_key = RunContext(spec, None).model(gen).removeprefix(f"{spec.name}/")
        model_uri = f"s3://{bucket}/{run_prefix}/{model_key}"
    return {
        "train-tasks.json": json.dumps(train),
        "episodes.json": json.dumps([{"task": t, "episode": i} for t in train for i in range(spec.collection.episodes)]),
        "search-iterations": str(spec.search.iterations + 1),  # iteration 0 runs the reference and initial workflow
        "model-uri": model_uri,
        "generations": str(spec.generations),
        "store-prefix": run_prefix,
    }


def main(args) -> int:
    from mass_jobs.spec import load_spec

    spec = load_spec(args.spec)  # a SpecError exits 2 listing every issue (mass_jobs.cli)
    if args.outputs:
        if not 0 <= args.gen <= spec.generations:
            print(f"--gen: expected 0..{spec.generations} (generations), found {args.gen}", file=sys.stderr)
            return 2
        if not spec.store.uri.startswith("s3://"):
            print(f"$.store.uri: expected an s3:// URI for Argo outputs, found {spec.store.uri!r}", file=sys.stderr)
            return 2
        out = Path(args.outputs)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in argo_outputs(spec, args.gen).items():
            (out / name).write_text(text)
    if not args.quiet:
        tasks = spec.resolved_tasks()
        n_train = sum(t.split == "train" for t in tasks)
        print(f"{args.spec}: valid run spec {spec.name!r}: {len(tasks)} task(s) ({n_train} train, "
              f"{len(tasks) - n_train} test), {spec.generations} generation(s), store {spec.store.uri}")
    return 0
