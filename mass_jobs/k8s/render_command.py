"""`mass render argo --out DIR`: write the Argo YAML (and optionally the manifests and chart templates).

    mass render argo --out argo/
    mass render argo --out argo/ --manifests manifests/ --examples examples/k8s/ --chart charts/mass-jobs/
    mass render argo --out argo/ --check      # write nothing; exit 1 when a file on disk differs
"""

from __future__ import annotations

import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="directory of the Argo YAML (argo/)")
    parser.add_argument("--manifests", type=Path,
                        help="also write the objects safe to apply as they are here (manifests/)")
    parser.add_argument("--examples", type=Path,
                        help="also write reference objects, Secret templates and per-cluster policies here (examples/k8s/)")
    parser.add_argument("--chart", type=Path, help="also write the generated templates of this chart dir")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")


def main(args) -> int:
    from mass_jobs.k8s import codegen

    targets = [(args.out, codegen.argo_files(), "argo/")]
    if args.manifests:
        targets.append((args.manifests, codegen.manifest_files(), "manifests/"))
    if args.examples:
        targets.append((args.examples, codegen.example_files(), "examples/k8s/"))
    if args.chart:
        targets.append((args.chart, codegen.chart_files(), "charts/mass-jobs/"))
    stale = 0
    for root, files, prefix in targets:
        rel = {name[len(prefix):]: text for name, text in files.items()}
        if args.check:
            for name, text in sorted(rel.items()):
                path = root / name
                if not path.is_file() or path.read_text() != text:
                    print(f"{path}: differs from the generated text (run without --check)", file=sys.stderr)
                    stale += 1
        else:
            for path in codegen.write(rel, root):
                print(path)
    return 1 if stale else 0
