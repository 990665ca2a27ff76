"""charts/mass-jobs rendered by Helm's own Go engine (helm-python-sdk) under every ci/*-values.yaml.

Every object validates strictly against the upstream schemas; the default render reproduces argo/
and manifests/; the values schema is closed; every values key is documented; no secret values.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from mass_jobs.k8s import codegen, labels, schemas
from tests.fixtures.k8s import CHART, REPO, ci_values_files, load_docs, render_chart

CHART_FILES = codegen.chart_files()
SCENARIOS = {p.name.removesuffix("-values.yaml"): p for p in ci_values_files()}


def _objects(values: dict, **kw) -> list[dict]:
    return [d for name, text in sorted(render_chart(values, **kw).items()) if name.endswith(".yaml")
            for d in load_docs(text)]


def _by(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("rel", sorted(CHART_FILES))
def test_generated_chart_templates_match_checked_in(rel, tmp_path):
    codegen.write({rel: CHART_FILES[rel]}, tmp_path)
    assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), f"{rel} is stale: run `{codegen.RENDER}`"


def test_manifests_dir_matches_generator(tmp_path):
    files = codegen.manifest_files()
    assert {f"manifests/{p.name}" for p in (REPO / "manifests").iterdir()} == set(files)
    for rel, text in files.items():
        assert (REPO / rel).read_text() == text, f"{rel} is stale: run `{codegen.RENDER}`"


def test_scenarios_exist():
    assert set(SCENARIOS) == {"default", "gpu-cluster", "minio-gitops"}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_validates_strictly(scenario):
    objs = _objects(yaml.safe_load(SCENARIOS[scenario].read_text()) or {})
    kinds = sorted(o["kind"] for o in objs)
    assert kinds.count("WorkflowTemplate") == 2 and "NetworkPolicy" in kinds and "Role" in kinds
    errors = [e for o in objs for e in schemas.all_errors(o)]
    assert errors == []
    for o in objs:
        meta = o["metadata"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert all(len(v) <= 63 for v in meta["labels"].values())


def test_manifests_validate_strictly():
    docs = [d for text in codegen.manifest_files().values() for d in load_docs(text)]
    assert len(docs) == 13
    assert [e for d in docs for e in schemas.all_errors(d)] == []


def _strip(obj: dict) -> dict:
    """Drop what only the chart adds: its standard labels and the namespace."""
    obj = json.loads(json.dumps(obj))
    meta = obj["metadata"]
    meta.pop("namespace", None)
    meta["labels"] = {k: v for k, v in meta["labels"].items() if not k.startswith(("helm.sh/", "app.kubernetes.io/name",
                                                                                   "app.kubernetes.io/instance",
                                                                                   "app.kubernetes.io/version",
                                                                                   "app.kubernetes.io/managed-by"))}
    return obj


def _parsed_manifests(obj):
    """Embedded YAML (resource manifests, the artifact repository) compared as data, not text."""
    if obj["metadata"]["name"] == "artifact-repositories":
        obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        return obj
    for t in obj.get("spec", {}).get("templates", []):
        if "resource" in t:
            t["resource"]["manifest"] = yaml.safe_load(schemas.substitute_examples(t["resource"]["manifest"]))
    return obj


def test_default_render_is_exactly_argo_and_manifests(argo_docs):
    objs = _objects({}, namespace="mass-jobs")
    for name, doc in argo_docs.items():
        rendered = _by(objs, doc["kind"], name)
        assert rendered["metadata"]["namespace"] == "mass-jobs"
        assert _parsed_manifests(_strip(rendered)) == _parsed_manifests(json.loads(json.dumps(doc)))
    plain = [d for rel, text in codegen.manifest_files().items() if "base" not in rel and "secret-templates" not in rel
             for d in load_docs(text)]
    for doc in plain:
        assert _parsed_manifests(_strip(_by(objs, doc["kind"], doc["metadata"]["name"]))) == _parsed_manifests(doc)
    assert not [o for o in objs if o["kind"] == "Secret" and o.get("type") == "Opaque"]


def test_gpu_cluster_values_reach_the_jobs():
    objs = _objects(yaml.safe_load(SCENARIOS["gpu-cluster"].read_text()))
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    created = {o["kind"]: o for o in schemas.embedded_manifests(cycle) if "spec" in o}
    isvc, job = created["InferenceService"], created["PyTorchJob"]
    # replicas, processes and GPUs per replica are the spec's (validate's outputs, example values here)
    assert job["spec"]["nprocPerNode"] == "2"
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "2"}
    model = isvc["spec"]["predictor"]["model"]
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "2" and "--max-model-len=65536" in model["args"]
    assert _by(objs, "ConfigMap", "mass-semaphores")["data"] == {"gpu-jobs": "4"}
    cron = _by(objs, "CronWorkflow", "mass-nightly")
    assert cron["spec"]["schedules"] == ["0 2 * * *", "0 14 * * *"] and cron["spec"]["suspend"] is False
    assert cron["spec"]["workflowSpec"]["arguments"]["parameters"][1] == {"name": "run", "value": "paper-nightly"}
    policy = _by(objs, "NetworkPolicy", "mass-agent-egress")
    assert [p["ipBlock"]["cidr"] for p in policy["spec"]["egress"][2]["to"]] == ["172.20.0.10/32", "172.20.0.11/32"]


def test_minio_gitops_values():
    objs = _objects(yaml.safe_load(SCENARIOS["minio-gitops"].read_text()), namespace="ignored")
    assert {o["metadata"]["namespace"] for o in objs} == {"mass-lab"}
    assert not [o for o in objs if o["kind"] == "CronWorkflow"]
    repo = yaml.safe_load(_by(objs, "ConfigMap", "artifact-repositories")["data"]["default-v1"])["s3"]
    assert repo["endpoint"] == "minio.minio.svc.cluster.local:9000" and repo["insecure"] is True
    assert repo["keyFormat"] == "argo-artifacts/{{workflow.name}}/{{pod.name}}"
    assert repo["accessKeySecret"] == {"name": "minio-mass", "key": "AWS_ACCESS_KEY_ID"}
    s3 = _by(objs, "Secret", "minio-mass")
    assert s3["metadata"]["annotations"]["serving.kserve.io/s3-usehttps"] == "0"
    assert _by(objs, "Secret", "judge-keys")["stringData"] == {"JUDGE_A_KEY": "", "JUDGE_B_KEY": ""}
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    images = {t["container"]["image"] for t in cycle["spec"]["templates"] if "container" in t}
    assert images == {"registry.lab.internal/mass-jobs/jobs:0.1.0", "registry.lab.internal/mass-jobs/sandbox:0.1.0"}
    assert {t["container"]["imagePullPolicy"] for t in cycle["spec"]["templates"] if "container" in t} == {"Always"}


def test_long_release_name_keeps_label_values_within_63():
    name = "r" * 53  # Helm's own maximum release name
    objs = _objects({}, name=name)
    assert {o["metadata"]["labels"]["app.kubernetes.io/instance"] for o in objs} == {name}
    long_override = _objects({"nameOverride": "n" * 70})
    assert {o["metadata"]["labels"]["app.kubernetes.io/name"] for o in long_override} == {"n" * 63}


# ---------------------------------------------------------------- values


def _walk_objects(schema):
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema:
            yield schema
        for v in schema.values():
            yield from _walk_objects(v)


def test_values_schema_is_closed_and_rejects_typos():
    import helm_python

    schema = json.loads((CHART / "values.schema.json").read_text())
    objects = list(_walk_objects(schema))
    assert len(objects) >= 20 and all(o["additionalProperties"] is False for o in objects)
    with helm_python.Chart.load(CHART) as chart:
        for p in SCENARIOS.values():
            chart.validate_schema(chart.merge_values(yaml.safe_load(p.read_text()) or {}))
        for typo in ({"images": {"job": "x"}}, {"gpus": {}}, {"resources": {"trainer": {"gpus": 2}}},
                     {"cron": {"schedule": "* * * * *"}}):
            with pytest.raises(helm_python.HelmError):
                chart.validate_schema(chart.merge_values(typo))
            with pytest.raises(helm_python.HelmError):
                chart.render(typo, name="mass")


def test_every_values_key_has_a_doc_comment():
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys, list_indent = 0, None  # keys inside list items are data (e.g. NetworkPolicy peers), not values keys
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith("- "):
            list_indent = indent if list_indent is None else min(list_indent, indent)
            continue
        if list_indent is not None and line.strip() and not line.lstrip().startswith("#"):
            if indent > list_indent:
                continue
            list_indent = None
        if re.match(r"^\s*[A-Za-z][A-Za-z0-9_]*:", line):
            keys += 1
            assert lines[i - 1].strip().startswith("# --"), f"values.yaml:{i + 1} {line.strip()!r} has no `# --` comment"
    assert keys >= 40


def test_values_schema_covers_exactly_the_values_keys():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def paths(v, s, prefix=""):
        assert set(v) == set(s["properties"]), prefix
        for k, sub in v.items():
            if isinstance(sub, dict) and "properties" in s["properties"][k] and sub:
                paths(sub, s["properties"][k], f"{prefix}.{k}")

    paths(values, schema)
    used = set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", "".join(CHART_FILES.values()) +
                          "".join(p.read_text() for p in (CHART / "templates").glob("*.t*"))))
    for path in used:
        node = values
        for part in path.split("."):
            assert part in node, f".Values.{path} is not in values.yaml"
            node = node[part]


def test_helm_lint_reports_no_errors():
    import helm_python

    report = helm_python.lint(CHART, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# ---------------------------------------------------------------- secrets

SECRET_PATTERNS = [r"AKIA[0-9A-Z]{16}", r"-----BEGIN [A-Z ]*PRIVATE KEY", r"(?i)(password|secret_?key|token)\s*:\s*[\"']?[^\s\"'{}]{6,}",
                   r"sk-[A-Za-z0-9]{20,}", r"ghp_[A-Za-z0-9]{20,}"]


def test_no_secret_values_anywhere():
    texts = {p.relative_to(REPO).as_posix(): p.read_text()
             for d in ("argo", "manifests", "charts/mass-jobs") for p in (REPO / d).rglob("*") if p.is_file()}
    assert len(texts) >= 25
    for rel, text in texts.items():
        for pat in SECRET_PATTERNS:
            assert not re.search(pat, text), f"{rel} matches {pat}"
    rendered = [o for p in SCENARIOS.values() for o in _objects(yaml.safe_load(p.read_text()) or {})]
    rendered += [d for text in codegen.manifest_files().values() for d in load_docs(text)]
    secrets = [o for o in rendered if o["kind"] == "Secret"]
    assert len(secrets) >= 4
    for s in secrets:
        assert "data" not in s and all(v == "" for v in (s.get("stringData") or {}).values()), s["metadata"]["name"]


def test_agent_network_policy_selects_the_agent_pods(argo_docs):
    policy = load_docs(codegen.manifest_files()["manifests/networkpolicy.yaml"])[0]
    agent = next(t for t in argo_docs["mass-cycle"]["spec"]["templates"] if t["name"] == "agent-episode")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert all(agent["metadata"]["labels"][k] == v for k, v in selector.items())
    assert policy["spec"]["ingress"] == [] and policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ports = [p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]]
    assert ports == [53, 53, 8080, 443, 6443, 443, 9000]
    model_rule = policy["spec"]["egress"][1]["to"][0]["podSelector"]["matchLabels"]
    isvc = next(o for o in schemas.embedded_manifests(argo_docs["mass-cycle"]) if o["kind"] == "InferenceService"
                and "spec" in o)
    assert all(isvc["spec"]["predictor"]["labels"][k] == v for k, v in model_rule.items())
    assert labels.STEP in model_rule
