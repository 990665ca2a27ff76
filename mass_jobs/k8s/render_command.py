"""`mass render argo --out DIR`: write the Argo YAML (and optionally the manifests and chart templates).

    mass render argo --out argo/
    mass render argo --out argo/ --manifests manifests/ --examples examples/k8s/ --chart charts/mass-jobs/
    mass render argo --out argo/ --check      # write nothing; exit 1 when a file on disk differs
    mass render argo --out my-argo/ --values my-values.yaml   # plain YAML with your chart values baked in
    mass render argo --out my-argo/ --pipeline my_steps:PIPELINE   # mass-cycle of a pipeline of your own

Without --values the files carry the chart's defaults (AWS S3, bucket mass-jobs, the published
images); with it they carry the chart's defaults with those files merged over them, as `helm
install -f` would, for clusters installed with `kubectl apply` instead of Helm. With --values the
objects the chart adds for them come too, beside the manifests (--manifests DIR, else --out DIR):
the network policies its `network.*` values describe (CiliumNetworkPolicies under network.cilium,
the FQDN S3 policy under network.s3.fqdns) and the Secret templates under secretTemplates.create,
so nothing under examples/k8s/ needs editing.
"""

from __future__ import annotations

import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="directory of the Argo YAML (argo/)")
    parser.add_argument(
        "--manifests", type=Path, help="also write the objects safe to apply as they are here (manifests/)"
    )
    parser.add_argument(
        "--examples",
        type=Path,
        help="also write reference objects, Secret templates and per-cluster policies here (examples/k8s/)",
    )
    parser.add_argument("--chart", type=Path, help="also write the generated templates of this chart dir")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")
    parser.add_argument(
        "--values",
        action="append",
        default=[],
        metavar="VALUES.yaml",
        help="bake these chart values (merged over the chart's defaults) into the plain YAML; "
        "repeatable; not with --chart (the chart reads its values at install)",
    )
    parser.add_argument(
        "--pipeline",
        metavar="MODULE:NAME",
        help="compile mass-cycle from this pipeline (a sequence of StepDefs importable in the jobs "
        "image, e.g. one with an agent step of your own) instead of the shipped one; not with --chart",
    )


def check_pipeline(args) -> None:
    """--pipeline names a pipeline importable here, and comes without --chart."""
    from mass_jobs.pipeline.table import steps
    from mass_jobs.spec.load import SpecError, SpecIssue

    if args.chart:
        raise SpecError(
            "mass render argo",
            [SpecIssue("--pipeline", "expected no --chart with it: the chart installs the shipped pipeline")],
            what="arguments",
        )
    try:
        steps(args.pipeline)
    except ValueError as err:
        raise SpecError("mass render argo", [SpecIssue("--pipeline", str(err))], what="arguments") from None


def values_of(args) -> tuple[dict, object]:
    """(the chart's values with --values merged over them, the settings they make), refused by name
    where Helm would refuse them."""
    from mass_jobs.k8s import preflight
    from mass_jobs.k8s.settings import values_settings
    from mass_jobs.spec.load import SpecError, SpecIssue

    if args.chart:
        raise SpecError(
            "mass render argo",
            [SpecIssue("--values", "expected no --chart with it: the chart reads its values when installed")],
            what="arguments",
        )
    try:
        values = preflight.load_values(args.values)
    except preflight.ValuesError as err:
        raise SpecError(" ".join(args.values), err.issues, what="chart values") from None
    missing = preflight.required_issues(values)
    if missing:
        raise SpecError(" ".join(args.values), missing, what="chart values")
    try:
        return values, values_settings(values)
    except (ValueError, KeyError, TypeError) as err:
        raise SpecError(
            "mass render argo", [SpecIssue("--values", f"expected chart values ({err})")], what="arguments"
        ) from None


def main(args) -> int:
    # here, not at the top: `mass render sft` builds this parser too, in every render step's process
    from mass_jobs.k8s import codegen

    if args.pipeline:
        check_pipeline(args)
    settings, suffix = None, ""
    if args.values:
        values, settings = values_of(args)
        suffix = "".join(f" --values {v}" for v in args.values)

    def made(files, flag: str, root) -> dict:
        """Generated files; with --values, from those settings, their header naming the command."""
        return files(settings, f"mass render argo {flag} {root}{suffix}") if settings else files()

    def argo(settings=None, command="mass render argo --out argo/") -> dict:
        if args.pipeline:
            command += f" --pipeline {args.pipeline}"
        return codegen.argo_files(settings, command, pipeline=args.pipeline)

    targets = [(args.out, made(argo, "--out", args.out), "argo/")]
    if settings and not (values.get("cron") or {}).get("enabled", True):  # as the chart: no CronWorkflow
        targets[0][1].pop("argo/mass-nightly.yaml", None)
    if args.manifests:
        targets.append((args.manifests, made(codegen.manifest_files, "--manifests", args.manifests), "manifests/"))
    if settings:
        where, flag = (args.manifests, "--manifests") if args.manifests else (args.out, "--out")
        targets.append(
            (
                where,
                codegen.values_policy_files(settings, values, "policies/", f"mass render argo {flag} {where}{suffix}"),
                "policies/",
            )
        )
    if args.examples:
        targets.append((args.examples, made(codegen.example_files, "--examples", args.examples), "examples/k8s/"))
    if args.chart:
        targets.append((args.chart, codegen.chart_files(), "charts/mass-jobs/"))
    stale = 0
    for root, files, prefix in targets:
        rel = {name[len(prefix) :]: text for name, text in files.items()}
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
