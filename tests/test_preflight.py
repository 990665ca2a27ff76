"""`mass validate SPEC --values VALUES.yaml`: the spec against the chart's values before `argo
submit`, one table of checks, exit 2 naming each failure; the cluster examples pass with the values
they document; every scenario's cron spec passes with that scenario's values; the validate step of
`mass-cycle` (cluster_issues) runs the same checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.cli import main as mass
from mass_jobs.commands.validate import cluster_issues
from mass_jobs.k8s import preflight
from mass_jobs.spec.load import load_spec, validate_document

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "mass-jobs"


def defaults() -> dict:
    """The chart's defaults plus the values that have none (ci/default-values.yaml: network peers)."""
    return preflight.load_values([str(CHART / "ci" / "default-values.yaml")])


@pytest.mark.parametrize(
    "spec,values",
    [
        ("examples/k8s-small.yaml", "charts/mass-jobs/ci/default-values.yaml"),
        ("examples/paper.yaml", "charts/mass-jobs/ci/paper-values.yaml"),
    ],
)
def test_the_cluster_examples_pass_with_the_values_they_document(spec, values, capsys):
    assert mass(["validate", str(ROOT / spec), "--values", str(ROOT / values)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["check", "value", "limit", "verdict"]
    rows = [line for line in out.splitlines()[2:] if line.rstrip().endswith((" ok", " FAIL"))]
    assert len(rows) >= 12 and all(r.rstrip().endswith(" ok") for r in rows)


def test_the_paper_with_the_chart_defaults_names_each_value_to_set(capsys):
    assert mass(["validate", str(ROOT / "examples/paper.yaml"), "--values", str(CHART / "values.yaml")]) == 2
    captured = capsys.readouterr()
    assert "invalid run spec for this cluster, 9 error(s)" in captured.err
    for needle in (
        "$.execution.vllm.tool_call_parser: expected the chart's vLLM tool-call parser 'hermes' "
        "(chart value model.toolCallParser), found 'qwen3_coder'",
        "$.model.sampling.context_length: expected at most the server's max model length 32768",
        "$.model.sampling.max_output_tokens: expected less than the server's max model length 32768",
        "$.judges[0].api_key_env: expected a key of the judge Secret (chart value judges.keys "
        "['JUDGE_API_KEY']), found 'JUDGE_A_API_KEY'",
        "$.judges[1].api_key_env",
        "values network.s3.to: required, no default",
        "values network.apiServer.to: required unless",
        "values resources.agent.memory: expected the agent pods' sandbox container (chart value "
        "resources.agent.memory) to hold execution.limits.memory_mb 65536 MiB, found 2Gi",
        "values resources.agent.ephemeralStorage: expected the agent pods' disk (chart value "
        "resources.agent.ephemeralStorage) to hold execution.limits.workspace_mb + scratch_mb = 98304 MiB",
    ):
        assert needle in captured.err
    # each refusal points to where the cluster's side is documented, a heading that exists
    assert captured.err.count(f"(cluster prerequisites: {preflight.PREREQUISITES})") == 9
    assert "\n## Cluster prerequisites\n" in (ROOT / "docs" / "kubernetes.md").read_text()
    fails = [line.split("  ")[0] for line in captured.out.splitlines() if line.rstrip().endswith("FAIL")]
    assert fails == [
        "context length",
        "max output tokens",
        "tool-call parser",
        "judge judge-a key",
        "judge judge-b key",
        "agent container memory",
        "agent workspace disk",
        "network.s3.to set",
        "network.apiServer.to set",
    ]


BAD_VALUES = """\
model: {maxModelLen: "abc"}
modle: {maxModelLen: 8192}
network:
  s3: {to: [{ipBlock: {cidr: 52.216.0.0/15}}]}
  apiServer: {to: [{ipBlock: {cidr: 10.0.0.2/32}}]}
"""


@pytest.mark.parametrize(
    "command",
    [["validate", str(ROOT / "examples" / "k8s-small.yaml")], ["render", "argo"]],
    ids=["validate", "render-argo"],
)
def test_values_are_checked_against_the_charts_schema_naming_each_key(command, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_VALUES)
    out = ["--out", str(tmp_path / "argo")] if command[0] == "render" else []
    assert mass([*command, *out, "--values", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: invalid chart values, 2 error(s)" in err and "Traceback" not in err
    assert 'values model.maxModelLen: expected integer, found string "abc"' in err
    assert "values modle: unknown key; expected one of: agent, argo, clusterDomain" in err
    assert not (tmp_path / "argo").exists()  # nothing written from values Helm would refuse
    # the values the chart's templates require, with no default, are named too
    bad.write_text("model: {maxModelLen: 8192}\n")
    code = mass([*command, *out, "--values", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "values network.s3.to: required, no default" in err
    assert "values network.apiServer.to: required unless network.cilium" in err


def _cron_scenarios() -> list[str]:
    """The ci/ scenarios whose values schedule a spec of their own (a CronWorkflow with a spec)."""
    out = []
    for p in sorted((CHART / "ci").glob("*-values.yaml")):
        cron = (yaml.safe_load(p.read_text()) or {}).get("cron") or {}
        if cron.get("enabled", True) and "spec" in cron:
            out.append(p.name)
    return out


def test_some_scenario_schedules_a_spec():
    assert _cron_scenarios() == ["gpu-cluster-values.yaml"]


@pytest.mark.parametrize("scenario", _cron_scenarios())
def test_a_scenario_cron_runs_a_spec_its_values_accept(scenario, capsys):
    cron = yaml.safe_load((CHART / "ci" / scenario).read_text())["cron"]
    spec = ROOT / "examples" / Path(cron["spec"]).name
    assert spec.is_file(), f"{scenario}: cron spec {cron['spec']} is no example"
    assert mass(["validate", str(spec), "--values", str(CHART / "ci" / scenario)]) == 0, capsys.readouterr().err


def small(**changes) -> object:
    doc = yaml.safe_load((ROOT / "examples" / "k8s-small.yaml").read_text())
    doc["tasks"] = [{"id": "a", "split": "train", "prompt": "do a"}, {"id": "b", "split": "test", "prompt": "do b"}]
    for dotted, value in changes.items():
        node = doc
        *head, last = dotted.split("__")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return validate_document(doc)


def test_the_recursion_bound_is_argos_exactly():
    """The executor (as Argo's operator.go) errors at depth >= 100: 99 is the deepest that runs."""
    from tests.fixtures.argo_exec.controller import MAX_STACK_DEPTH

    assert MAX_STACK_DEPTH == preflight.ARGO_MAX_STACK_DEPTH
    for iterations, ok in ((91, True), (92, False)):  # depth (1 - 1) + 8 + iterations: 99 runs, 100 errors
        spec = small(generations=1, search__iterations=iterations)
        (check,) = [c for c in preflight.checks(spec, defaults()) if c.name == "template recursion depth"]
        assert (check.value, check.ok) == (str(8 + iterations), ok)
    # evaluate's agent pods sit three templates below its round: a search of fewer iterations is shallower
    assert [preflight.recursion_depth(small(generations=2, search__iterations=k)) for k in (0, 1, 2, 3, 4)] == [
        12,
        12,
        12,
        12,
        13,
    ]


@pytest.mark.parametrize(
    "changes,values,path,needle",
    [
        (
            {"generations": 40, "search__iterations": 60},
            {"argo": {"nodeStatusOffload": True}},
            "$.search.iterations",
            "(generations - 1) + 8 + max(search.iterations, 3) < 100 (Argo's maxAllowedStackDepth: the controller errors at "
            "depth >= 100 unless its environment sets DISABLE_MAX_RECURSION=true), found 107",
        ),
        (
            {"execution__limits__wall_s": 86200},
            {},
            "$.execution.limits.wall_s",
            "at least 300 s below the agent pods' deadline 86400 s (chart value agent.activeDeadlineSeconds), found 86200",
        ),
        (
            {"execution__limits__wall_s": None},
            {"agent": {"activeDeadlineSeconds": 4200}},
            "$.execution.limits.wall_s",
            "of at least 21600 s when episodes have no wall limit, or a wall_s 300 s below it, found 4200 s",
        ),
        (
            {"sft__checkpoint_selection": "panel", "sft__panel": {"tasks": ["b"]}},
            {},
            "$.sft.checkpoint_selection",
            "panel selection serves every checkpoint",
        ),
        (
            {"roles__executor": {"endpoint": "https://other.example.com/v1", "model": "m"}},
            {},
            "$.roles.executor",
            "agent pods reach only DNS, the predictor, the apiserver and S3",
        ),
        (
            {"execution__vllm__tool_call_parser": "qwen3_coder"},
            {},
            "$.execution.vllm.tool_call_parser",
            "expected the chart's vLLM tool-call parser 'hermes'",
        ),
        ({}, {"s3": {"endpoint": "https://minio.lab:9000"}}, "values s3.endpoint", "as host[:port]"),
        (
            {"store__endpoint_url": "http://minio.lab:9000"},
            {},
            "$.store.endpoint_url",
            "expected the chart's S3 endpoint 'https://s3.amazonaws.com'",
        ),
        ({"store__uri": "s3://other-bucket/run"}, {}, "$.store.uri", "bucket 'other-bucket'"),
        (
            {"execution__vllm__reasoning_parser": "deepseek_r1"},
            {},
            "$.execution.vllm.reasoning_parser",
            "expected the chart's vLLM reasoning parser 'qwen3' (chart value model.reasoningParser)",
        ),
        ({}, {"gpu": {"concurrentJobs": 0}}, "values gpu.concurrentJobs", "train never starts"),
        (
            {"sft__replicas": 3, "sft__gpus_per_replica": 4},
            {"kueue": {"queueName": "q", "gpuQuota": 8}},
            "$.sft.replicas",
            "expected a trainer job of at most 8 GPUs, the nominal quota of Kueue queue 'q' (chart value kueue.gpuQuota), "
            "found 12: Kueue never admits it",
        ),
        (
            {"generations": 3},
            {"kueue": {"queueName": "q", "gpuQuota": 1}, "resources": {"server": {"gpu": 2}}},
            "values resources.server.gpu",
            "expected an InferenceService of at most 1 GPUs, the nominal quota of Kueue queue "
            "'q' (chart value kueue.gpuQuota), found 2: Kueue never admits it",
        ),
    ],
)
def test_each_check_fails_naming_the_field(changes, values, path, needle):
    found = preflight.checks(small(**changes), preflight.merge(defaults(), values))
    failing = [c for c in found if not c.ok]
    assert [c.path for c in failing] == [path], [(c.path, c.why) for c in failing]
    assert needle in failing[0].why


def test_the_gpu_queue_checks_bound_the_largest_workloads_exactly():
    """At the quota both pass; one GPU less and each fails. Without a queue or a known quota there is
    nothing to compare (Kueue's quota lives in the cluster)."""
    spec = small(generations=3, sft__replicas=2, sft__gpus_per_replica=3)

    def verdicts(quota, server=3, queue="q"):
        values = preflight.merge(
            defaults(), {"kueue": {"queueName": queue, "gpuQuota": quota}, "resources": {"server": {"gpu": server}}}
        )
        return {c.name: c.ok for c in preflight.checks(spec, values) if "GPU queue" in c.name}

    # one predictor at a time (evaluate serves its generations in rounds): the quota holds one
    assert verdicts(6) == {"trainer job within the GPU queue": True, "predictor within the GPU queue": True}
    assert verdicts(5) == {"trainer job within the GPU queue": False, "predictor within the GPU queue": True}
    assert verdicts(6, server=6) == {"trainer job within the GPU queue": True, "predictor within the GPU queue": True}
    assert verdicts(6, server=7) == {"trainer job within the GPU queue": True, "predictor within the GPU queue": False}
    assert verdicts(None) == {} and verdicts(5, queue="") == {}


def test_a_queue_that_does_not_cover_ephemeral_storage_is_named():
    """Kueue's ClusterQueue must list every resource the workloads request; the first queue a
    cluster defines often covers cpu, memory and GPUs only, and then admits nothing of this chart's."""
    spec = small()

    def check(covered, **kueue):
        values = preflight.merge(defaults(), {"kueue": {"queueName": "q", "coveredResources": covered, **kueue}})
        return [c for c in preflight.checks(spec, values) if c.name == "Kueue queue covers every requested resource"]

    (refused,) = check(["cpu", "memory", "nvidia.com/gpu"], podIntegration=True)
    assert not refused.ok and refused.path == "values kueue.coveredResources"
    assert "to cover ephemeral-storage" in refused.why and "predictor and pod requests it" in refused.why
    assert '"resource ephemeral-storage unavailable in ClusterQueue"' in refused.why
    (ok,) = check(["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"])
    assert ok.ok
    assert (
        check(None) == []
        and [
            c
            for c in preflight.checks(
                spec, preflight.merge(defaults(), {"kueue": {"queueName": "", "coveredResources": ["cpu"]}})
            )
            if "covers" in c.name
        ]
        == []
    )


def test_the_workflow_object_must_fit_the_controllers_limit_or_be_offloaded():
    """The estimate after the last generation against argo.maxWorkflowSize, to the byte; the refusal
    names nodeStatusOffLoad, and with offloading the size is not bounded (nothing estimated)."""
    from mass_jobs.k8s.workflow_size import estimate

    spec = small(generations=2)
    last = estimate(spec)[-1]
    assert last.generation == 1 and last.stored_bytes == last.fixed_bytes + last.nodes_bytes

    def row(**argo):
        (check,) = [
            c
            for c in preflight.checks(spec, preflight.merge(defaults(), {"argo": argo}))
            if c.name == "workflow object size"
        ]
        return check

    assert row(maxWorkflowSize=last.stored_bytes).ok
    refused = row(maxWorkflowSize=last.stored_bytes - 1)
    assert not refused.ok and refused.path == "$.generations" and "Enable nodeStatusOffLoad" in refused.why
    assert row(maxWorkflowSize=1, nodeStatusOffload=True).ok


def test_an_in_cluster_minio_passes_when_the_spec_names_its_endpoint():
    values = preflight.merge(defaults(), {"s3": {"endpoint": "minio.minio:9000", "insecure": True}})
    spec = small(store__endpoint_url="http://minio.minio:9000")
    assert [c.name for c in preflight.checks(spec, values) if not c.ok] == []


def test_the_validate_step_of_a_cycle_runs_the_same_checks():
    """mass-cycle's validate step passes the chart's bucket and max model length: the same rules."""
    deep = small(generations=40, search__iterations=60, sft__checkpoint_selection="panel", sft__panel={"tasks": ["b"]})
    paths = {i.path for i in cluster_issues(deep, "mass-jobs", 32768)}
    assert {"$.search.iterations", "$.sft.checkpoint_selection"} <= paths
    assert cluster_issues(small(), "mass-jobs", 32768) == []


def test_the_validate_step_gets_every_chart_value_the_preflight_reads():
    """The cycle's validate step hands the preflight the chart's values (--chart-value): parsed,
    they are the chart's defaults, and a spec they cannot serve fails there as in the preflight."""
    cycle = next(
        d
        for d in yaml.safe_load_all((ROOT / "argo" / "mass-cycle.yaml").read_text())
        if d and d["kind"] == "WorkflowTemplate"
    )
    args = next(t for t in cycle["spec"]["templates"] if t["name"] == "validate")["container"]["args"]
    given = preflight.parse_chart_values(a.split("=", 1)[1] for a in args if a.startswith("--chart-value="))
    chart = defaults()
    assert given == {
        "model": {k: chart["model"][k] for k in ("toolCallParser", "reasoningParser")},
        "agent": {"activeDeadlineSeconds": chart["agent"]["activeDeadlineSeconds"]},
        "judges": {"keys": chart["judges"]["keys"]},
    }
    spec = small(
        execution__vllm__reasoning_parser="deepseek_r1",
        execution__limits__wall_s=86200,
        judges=[{"name": "j", "endpoint": "https://j.example.com/v1", "model": "m", "api_key_env": "MINE"}],
    )
    paths = {
        i.path
        for i in cluster_issues(
            spec, "mass-jobs", 32768, [a.split("=", 1)[1] for a in args if a.startswith("--chart-value=")]
        )
    }
    assert {"$.execution.vllm.reasoning_parser", "$.execution.limits.wall_s", "$.judges[0].api_key_env"} <= paths
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        preflight.parse_chart_values(["model.toolCallParser"])
    with pytest.raises(ValueError, match="agent.activeDeadlineSeconds: expected an integer"):
        preflight.parse_chart_values(["agent.activeDeadlineSeconds=soon"])


def test_the_validate_step_mounts_the_judge_secret_and_refuses_a_key_it_lacks():
    """The judge Secret is optional to the pods: validate reads it as evaluate's finish does, so a key
    a judge names but the Secret lacks stops the cycle in its first step, named, not at the first verdict."""
    cycle = next(
        d
        for d in yaml.safe_load_all((ROOT / "argo" / "mass-cycle.yaml").read_text())
        if d and d["kind"] == "WorkflowTemplate"
    )
    mounted = {
        t["name"]: [e["secretRef"]["name"] for e in t["container"].get("envFrom", [])]
        for t in cycle["spec"]["templates"]
        if "container" in t
    }
    assert defaults()["judges"]["secretName"] in mounted["validate"]
    assert mounted["validate"] == mounted["evaluate-finish"]
    keyed = {"endpoint": "https://j.example.com/v1", "model": "m", "api_key_env": "JUDGE_API_KEY"}
    spec = small(
        judges=[
            {"name": "a", **keyed},
            {"name": "b", **keyed, "api_key_env": "OTHER_KEY"},
            {"name": "c", "endpoint": "https://c.example.com/v1", "model": "m"},
        ]
    )
    found = preflight.judge_key_issues(spec, {"JUDGE_API_KEY": "k", "OTHER_KEY": ""})
    assert [(i.path, i.message) for i in found] == [
        (
            "$.judges[1].api_key_env",
            "expected OTHER_KEY in the judge Secret (chart value judges.secretName; validate "
            "and evaluate's finish read it from there), found it unset or empty (judge 'b')",
        )
    ]
    assert preflight.judge_key_issues(spec, {"JUDGE_API_KEY": "k", "OTHER_KEY": "o"}) == []


def test_model_size_against_the_pods_ephemeral_storage(capsys):
    """From the model's config (no weights): a 27B bf16 model needs 54 GB where it is downloaded."""
    paper = ROOT / "examples" / "paper.yaml"
    config = ROOT / "examples" / "qwen3.5-27b-config.json"
    values = [str(CHART / "ci" / "paper-values.yaml")]
    assert mass(["validate", str(paper), "--values", *values, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "merge ephemeral storage" in out and "2 x 53.8 GB" in out
    spec = load_spec(paper)
    found = preflight.checks(
        spec,
        preflight.merge(preflight.load_values(values), {"resources": {"merge": {"ephemeralStorage": "100Gi"}}}),
        preflight.model_config(spec, str(config)),
    )
    failing = [c for c in found if not c.ok]
    assert [c.path for c in failing] == ["values resources.merge.ephemeralStorage"]
    assert "expected at least 110Gi for 2 copies of the 53.8 GB model" in failing[0].why
    # without a config (a hub id base), the storage rows are left out rather than guessed
    assert not [c for c in preflight.checks(spec, preflight.load_values(values)) if "ephemeral" in c.name]


def test_a_scratch_volume_holds_the_model_instead_of_the_nodes_disk():
    """With scratch.merge on a volume the model's two copies are checked against the volume's size,
    not the pod's ephemeral storage, and the node disk the values ask for drops to the other pods'."""
    paper = ROOT / "examples" / "paper.yaml"
    spec = load_spec(paper)
    config = preflight.model_config(spec, str(ROOT / "examples" / "qwen3.5-27b-config.json"))
    base = preflight.load_values([str(CHART / "ci" / "paper-values.yaml")])
    (disk,) = [c for c in preflight.checks(spec, base, config) if c.name == "node disk per pod"]
    assert disk.value == "merge 160Gi, server 80Gi, trainer 80Gi, step 20Gi, agent 12Gi"

    def found(size):
        over = {
            "scratch": {"merge": {"size": size, "storageClass": ""}},
            "resources": {"merge": {"ephemeralStorage": "4Gi"}},
        }
        return preflight.checks(spec, preflight.merge(base, over), config)

    failing = [c for c in found("100Gi") if not c.ok]
    assert [(c.name, c.path) for c in failing] == [("merge scratch volume", "values scratch.merge.size")]
    assert (
        "expected at least 110Gi for 2 copies of the 53.8 GB model (chart value scratch.merge.size), found 100Gi"
        in failing[0].why
    )
    checks = found("120Gi")
    assert all(c.ok for c in checks)
    (disk,) = [c for c in checks if c.name == "node disk per pod"]
    assert disk.value == "server 80Gi, trainer 80Gi, step 20Gi, agent 12Gi, merge 4Gi"


def test_a_hub_id_model_passes_with_a_note_to_mirror_it_and_a_mirrored_one_without(capsys):
    """A hub id is downloaded anew by every predictor, trainer pod and merge: preflight accepts it and
    says so under the table, with the size from the config; the same spec mirrored to S3 has no note."""
    paper, config = str(ROOT / "examples" / "paper.yaml"), str(ROOT / "examples" / "qwen3.5-27b-config.json")
    values = ["--values", str(CHART / "ci" / "paper-values.yaml"), "--config", config]
    assert mass(["validate", paper, *values]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("model base downloadable"))
    assert row.split()[-1] == "note"
    model = load_spec(paper).model
    assert (
        f"note: model base downloadable: every predictor start, every trainer pod and every merge downloads "
        f"54 GB of {model.base} or {model.serve} from the Hugging Face Hub"
    ) in out
    assert "set model.base and model.serve to its s3:// URI" in out
    mirrored = [
        "--set",
        "model.base=s3://mass-jobs/models/qwen3.5-27b",
        "--set",
        "model.serve=s3://mass-jobs/models/fp8",
    ]
    assert mass(["validate", paper, *values, *mirrored]) == 0
    out = capsys.readouterr().out
    assert "note: model base" not in out
    assert next(line for line in out.splitlines() if line.startswith("model base downloadable")).split()[-1] == "ok"


def test_model_size_against_the_merge_and_trainer_pods_memory(capsys):
    """The paper's 27B model (53.8 GB): a trainer pod holds one copy (rank 0 alone reads it) and 1 GiB of
    memory-backed /dev/shm per rank for NCCL, so the chart's default 64Gi holds it and 48Gi does not; the
    merge streams shard by shard, so 64Gi holds
    it and 8Gi does not hold two 5 GB shards. Each refusal names the value."""
    paper = ROOT / "examples" / "paper.yaml"
    config = ROOT / "examples" / "qwen3.5-27b-config.json"
    assert (
        mass(["validate", str(paper), "--values", str(CHART / "ci" / "paper-values.yaml"), "--config", str(config)])
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "merge memory" in out
        and "2 x 5 GB shards" in out
        and "trainer memory" in out
        and "1 x 53.8 GB + /dev/shm" in out
    )
    spec = load_spec(paper)
    for memory, refused in (("64Gi", False), ("48Gi", True), ("8Gi", True)):
        found = preflight.checks(
            spec,
            preflight.merge(
                preflight.load_values([str(CHART / "ci" / "paper-values.yaml")]),
                {"resources": {"merge": {"memory": memory}, "trainer": {"memory": memory}}},
            ),
            preflight.model_config(spec, str(config)),
        )
        failing = {c.path: c.why for c in found if not c.ok}
        expected = (["values resources.trainer.memory"] if refused else []) + (
            ["values resources.merge.memory"] if memory == "8Gi" else []
        )
        assert sorted(failing) == sorted(expected), (memory, failing)
    assert (
        "expected at least 57Gi of memory for a trainer pod: the whole 53.8 GB model, which its rank 0 reads, and "
        "2Gi of /dev/shm for NCCL (2 rank(s) per pod; memory-backed, it counts against the pod's limit) (chart "
        "value resources.trainer.memory), found 8Gi" in failing["values resources.trainer.memory"]
    )
    assert (
        "expected at least 13Gi of memory for the merge and its FP8 export, which hold one input and one output "
        "shard of up to 5 GB (chart value resources.merge.memory), found 8Gi"
        in failing["values resources.merge.memory"]
    )


def test_the_trainer_job_check_runs_the_operators_webhook(monkeypatch):
    from mass_jobs.k8s import training

    for replicas in (1, 2, 3):
        assert preflight.trainer_webhook_errors(small(sft__replicas=replicas)) == []
    real = training.pytorch_job

    def zero_workers(*a, **kw):  # what an older renderer made of one replica
        job = real(*a, **{**kw, "workers": 0})
        return job

    monkeypatch.setattr(training, "pytorch_job", zero_workers)
    found = preflight.checks(small(sft__replicas=1), defaults())
    (bad,) = [c for c in found if not c.ok]
    assert bad.path == "$.sft.replicas" and "Worker replicas must be at least 1, got 0" in bad.why


def test_values_files_merge_over_the_chart_defaults_and_bad_files_are_named(tmp_path, capsys):
    over = tmp_path / "mine.yaml"
    over.write_text("model: {maxModelLen: 8192}\n")
    values = preflight.load_values([str(over)])
    assert values["model"] == {**yaml.safe_load((CHART / "values.yaml").read_text())["model"], "maxModelLen": 8192}
    spec = ROOT / "examples" / "k8s-small.yaml"
    assert mass(["validate", str(spec), "--values", str(over)]) == 2
    assert (
        "$.model.sampling.context_length: expected at most the server's max model length 8192"
        in capsys.readouterr().err
    )
    over.write_text("- a list\n")
    assert mass(["validate", str(spec), "--values", str(over)]) == 2
    assert f"--values: --values {over}: expected a mapping of chart values, found list" in capsys.readouterr().err
    assert load_spec(spec).name == "k8s-small"


def test_s3_egress_by_name_needs_cilium_and_then_no_cidrs():
    fqdns = {"fqdns": [{"matchName": "s3.us-east-1.amazonaws.com"}], "to": None}
    api = {"to": [{"ipBlock": {"cidr": "10.0.0.2/32"}}]}
    plain = preflight.merge(preflight.load_values([]), {"network": {"apiServer": api, "s3": fqdns}})
    assert [(i.path, i.message.split(":")[0]) for i in preflight.required_issues(plain)] == [
        ("values network.s3.fqdns", "expected network.cilium=true")
    ]
    cilium = preflight.merge(plain, {"network": {"cilium": True}})
    assert preflight.required_issues(cilium) == []
    neither = preflight.merge(preflight.load_values([]), {"network": {"apiServer": api}})
    assert [i.path for i in preflight.required_issues(neither)] == ["values network.s3.to"]


def test_gpu_agent_pods_under_kueue_need_its_pod_integration():
    """A GPU per agent pod with a Kueue queue: without the plain-pod integration the agent pods carry
    no queue label and take GPUs outside the quota, so preflight refuses and names the value."""
    spec = load_spec(ROOT / "examples" / "paper.yaml")
    base = preflight.load_values([str(CHART / "ci" / "paper-values.yaml"), str(CHART / "ci" / "kueue-values.yaml")])
    assert [c for c in preflight.checks(spec, base) if c.name == "GPU agent pods queued"][0].ok
    off = preflight.merge(base, {"kueue": {"podIntegration": False}})
    (check,) = [c for c in preflight.checks(spec, off) if c.name == "GPU agent pods queued"]
    assert not check.ok and check.path == "values kueue.podIntegration" and "1 GPU(s) per agent pod" in check.why
    cpu_only = preflight.merge(off, {"resources": {"agent": {"gpu": 0}}})
    assert not [c for c in preflight.checks(spec, cpu_only) if c.name == "GPU agent pods queued"]
