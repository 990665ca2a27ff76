"""`mass validate SPEC`: exit 0 when the spec is valid, exit 2 listing every error (path, expected, found).

With `--gen G --outputs DIR` it is the first step of every Argo cycle: it records the spec in the
run's store (refusing, exit 2, a spec that differs from the one an existing run was made with),
checks the spec against the cluster it runs on (`--artifact-bucket`, `--max-model-len`: the chart's
values; each external judge's key in the judge Secret it mounts) and writes the small values the
templates fan out over and branch on (docs/architecture.md, "Argo"), so a bad spec stops the
workflow before anything is created.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mass_jobs.commands.cli import environment_error
from mass_jobs.run.base_model import local_fitness_issues
from mass_jobs.run.context import RunContext
from mass_jobs.run.sandboxing import sandbox_issues
from mass_jobs.spec.load import SpecError, SpecIssue, load_spec
from mass_jobs.store import open_store


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a YAML/JSON path or an s3:// URI")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    parser.add_argument("--gen", type=int, default=0, help="generation the outputs are for (with --outputs)")
    parser.add_argument("--outputs", metavar="DIR", help="also write the Argo step outputs into DIR (records the spec)")
    parser.add_argument(
        "--artifact-bucket",
        metavar="BUCKET",
        help="the Argo artifact repository's bucket: the run's store must be in it (agent pods "
        "exchange episodes as artifacts)",
    )
    parser.add_argument(
        "--pipeline",
        metavar="MODULE:NAME",
        help="with --outputs: the done flags of this pipeline's steps (one compiled with "
        "`mass render argo --pipeline`), not the shipped one's",
    )
    parser.add_argument(
        "--run",
        metavar="NAME",
        help="the workflow's run parameter: must be the spec's name (it names the InferenceService "
        "and the served model)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="the model server's --max-model-len: the spec's sampling.context_length and "
        "max_output_tokens must fit it (vLLM rejects longer requests)",
    )
    parser.add_argument(
        "--chart-value",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a chart value the cluster runs with (dotted key, e.g. model.toolCallParser=hermes; "
        "a list comma-separated): the preflight checks the spec against it; repeatable",
    )
    add_preflight_arguments(parser)


def add_preflight_arguments(parser) -> None:
    """The offline preflight against chart values, and the live cluster's."""
    parser.add_argument(
        "--values",
        action="append",
        default=[],
        metavar="VALUES.yaml",
        help="preflight before argo submit: check the spec against the chart's values (its defaults "
        "with these files merged over them, as helm -f does) and print a table of every check; "
        "repeatable",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="with or without --values: also check the live cluster, read-only (the controllers' "
        "APIs and settings, RBAC, Secrets, Kueue's queues, nodes against each class of pods); "
        "the kubeconfig's current context, or the pod's account inside a pod",
    )
    parser.add_argument(
        "--kubeconfig", metavar="PATH", help="with --cluster: the kubeconfig (default: KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument(
        "--context", metavar="NAME", help="with --cluster: the kubeconfig context (default: its current one)"
    )
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help="with --cluster: the namespace the chart is installed in (default: the context's)",
    )
    parser.add_argument(
        "--config",
        metavar="CONFIG.json",
        help="with --values: the model's config.json (or a model dir), to check the pods' "
        "ephemeral storage against the model's size; default: model.base when local",
    )


def cluster_issues(spec, artifact_bucket: str | None, max_model_len: int | None, chart_values=()) -> list:
    """What a spec asks that the cluster it is submitted to cannot give (SpecIssue each): the
    preflight's checks (mass_jobs/k8s/preflight.py) for the chart values the validate step is given,
    and the store endpoint its own pod sees."""
    import os

    from mass_jobs.k8s import preflight

    values: dict = preflight.parse_chart_values(chart_values)
    if artifact_bucket is not None:
        values = preflight.merge(values, {"s3": {"bucket": artifact_bucket}})
    if max_model_len is not None:
        values = preflight.merge(values, {"model": {"maxModelLen": max_model_len}})
    issues = preflight.issues(preflight.checks(spec, values))
    # Step pods reach the store at the chart's endpoint (env AWS_ENDPOINT_URL / AWS_REGION); a spec
    # that names another one would read and write a different store than Argo's artifacts.
    for field, env in (("endpoint_url", "AWS_ENDPOINT_URL"), ("region", "AWS_REGION")):
        mine, pods = getattr(spec.store, field), os.environ.get(env)
        if artifact_bucket is not None and mine and pods and mine.rstrip("/") != pods.rstrip("/"):
            issues.append(
                SpecIssue(
                    f"$.store.{field}",
                    f"expected the cluster's {pods!r} ({env} of the step pods, chart values s3.*), found {mine!r}",
                )
            )
    return issues


def done_outputs(ctx, gen: int, pipeline=None) -> dict[str, str]:
    """What is stored already, by each step's own done-check: `done-<step>` for generation `gen`,
    `needs-model` (a model step of it is not done) and `run-done`. The templates skip GPU steps
    and the model server that have nothing to do (a re-submitted or scheduled finished run)."""
    from mass_jobs.pipeline import table as P  # every step's module: only the cluster's validate step asks

    spec, tasks = ctx.spec, P.train_task_ids(ctx)
    gen_steps = P.generation_steps(pipeline)
    done = {s.name: gen >= spec.generations or s.is_done(ctx, gen, tasks) for s in gen_steps}
    out = {P.done_output(name): _flag(flag) for name, flag in done.items()}
    out["needs-model"] = _flag(any(not done[s.name] for s in gen_steps if s.model))
    out["run-done"] = _flag(
        all(s.is_done(ctx, g, tasks) for g in range(spec.generations) for s in gen_steps)
        and all(s.is_done(ctx, spec.generations, tasks) for s in P.run_steps(pipeline))
    )
    return out


def stored_run_check(source: str, spec, quiet: bool) -> None:
    """A spec that differs from its run's stored one is refused here as `mass run` refuses it
    (`RunContext.spec_differences`). A store this machine cannot reach (no credentials, offline)
    is said, not an error: validating before the store exists is what the command is for."""

    try:
        changed = RunContext(spec, open_store(spec.store)).spec_differences()
    except Exception as err:  # noqa: BLE001 (only the environment's errors are a note)
        known = environment_error(err)
        if known is None:
            raise
        if not quiet:
            print(f"note: the store was not compared with a stored run ({known[1]})")
        return
    if changed:
        raise SpecError(source, changed, what="run spec for its stored run")


def _flag(b: bool) -> str:
    return "true" if b else "false"


def live_cluster_issues(args, spec, values: dict) -> list:
    """`--cluster`: the live checks' table, and a SpecIssue per failing one (mass_jobs/cluster/preflight.py)."""
    from mass_jobs.cluster import preflight as live
    from mass_jobs.cluster.api import Cluster, Unreachable
    from mass_jobs.k8s.preflight import table
    from mass_jobs.k8s.settings import values_settings

    try:
        cluster = Cluster.connect(args.kubeconfig, args.context, args.namespace)
        t = cluster.target
        print(f"\nthe cluster: context {t.context} ({t.server}), namespace {t.namespace}")
        found = live.checks(cluster, spec, values_settings(values))
    except Unreachable as err:
        raise SpecError(args.spec, [SpecIssue("--cluster", str(err))], what="arguments") from None
    print(table(found))
    return [SpecIssue(c.path, c.why) for c in found if not c.ok]


def main(args) -> int:

    spec = load_spec(args.spec)  # a SpecError exits 2 listing every issue (mass_jobs.commands.cli)

    # the Argo cycle's own validate (--outputs) runs in a step pod: its episodes run in agent pods
    unfit = local_fitness_issues(spec) + ([] if args.outputs else sandbox_issues(spec))
    if unfit:
        raise SpecError(args.spec, unfit)
    from mass_jobs.k8s import preflight
    from mass_jobs.spec.load import SpecIssue

    try:
        preflight.parse_chart_values(args.chart_value)
    except ValueError as err:
        raise SpecError(args.spec, [SpecIssue("--chart-value", str(err))], what="arguments") from None
    if args.outputs:
        from mass_jobs.run.context import RunContext
        from mass_jobs.spec.load import SpecIssue
        from mass_jobs.store import open_store

        issues = []
        if args.pipeline:
            from mass_jobs.pipeline.table import steps

            try:
                steps(args.pipeline)
            except ValueError as err:
                issues.append(SpecIssue("--pipeline", str(err)))
        if not 0 <= args.gen <= spec.generations:
            issues.append(SpecIssue("--gen", f"expected 0..{spec.generations} (generations), found {args.gen}"))
        if not spec.store.uri.startswith("s3://"):
            issues.append(SpecIssue("$.store.uri", f"expected an s3:// URI for Argo outputs, found {spec.store.uri!r}"))
        issues += cluster_issues(spec, args.artifact_bucket, args.max_model_len, args.chart_value)
        issues += preflight.judge_key_issues(spec, os.environ)
        if args.run is not None and args.run != spec.name:
            issues.append(
                SpecIssue(
                    "--run", f"expected the spec's name {spec.name!r} (argo submit -p run=...), found {args.run!r}"
                )
            )
        if issues:
            raise SpecError(args.spec, issues)
        ctx = RunContext(spec, open_store(spec.store))
        ctx.claim_spec()  # a changed spec on an existing run: SpecError naming each changed field
        out = Path(args.outputs)
        out.mkdir(parents=True, exist_ok=True)
        from mass_jobs.pipeline.table import argo_outputs

        for name, text in {**argo_outputs(spec, args.gen), **done_outputs(ctx, args.gen, args.pipeline)}.items():
            (out / name).write_text(text)
        if args.gen >= 1 or spec.model.serve:  # what this cycle's InferenceService serves, and why
            from mass_jobs.serving.precision import for_cluster

            ctx.store.put_json(
                ctx.serving(args.gen), {**for_cluster(spec, args.gen).as_dict(), "backend": "kserve-vllm"}
            )
    elif args.values or args.cluster:
        from mass_jobs.k8s import preflight
        from mass_jobs.spec.load import SpecIssue

        try:
            values = preflight.load_values(args.values)
        except preflight.ValuesError as err:
            raise SpecError(" ".join(args.values), err.issues, what="chart values") from None
        except ValueError as err:
            raise SpecError(args.spec, [SpecIssue("--values", str(err))], what="arguments") from None
        try:
            config = preflight.model_config(spec, args.config)
        except ValueError as err:
            raise SpecError(args.spec, [SpecIssue("--config", str(err))], what="arguments") from None
        found = preflight.checks(spec, values, config)
        print(preflight.table(found))
        issues = preflight.issues(found)
        if args.cluster:
            issues += live_cluster_issues(args, spec, values)
        if issues:
            raise SpecError(args.spec, issues, what="run spec for this cluster")
    elif args.artifact_bucket or args.max_model_len or args.chart_value:
        issues = cluster_issues(spec, args.artifact_bucket, args.max_model_len, args.chart_value)
        if issues:
            raise SpecError(args.spec, issues)
    if not args.outputs:
        stored_run_check(args.spec, spec, quiet=args.quiet)
    from mass_jobs.spec.check_imports import check_import_warnings

    for warning in check_import_warnings(spec):
        print(f"warning: {warning}", file=sys.stderr)
    if not args.quiet:
        from mass_jobs.serving.precision import summary
        from mass_jobs.spec.locations import model_location_notes

        for note in model_location_notes(spec):
            print(f"note: {note}")
        print(summary(spec))
        tasks = spec.resolved_tasks()
        n_train = len(spec.train_tasks())
        print(
            f"{args.spec}: valid run spec {spec.name!r}: {len(tasks)} task(s) ({n_train} train, "
            f"{len(tasks) - n_train} test), {spec.generations} generation(s), store {spec.store.uri}"
        )
    return 0
