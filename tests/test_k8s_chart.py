"""charts/mass-jobs rendered by Helm's own Go engine (helm-python-sdk) under every ci/*-values.yaml.

Every object validates strictly against the upstream schemas; the default render reproduces argo/
and manifests/; the values schema is closed; every values key is documented; no secret values;
the agent pods' apiserver and S3 egress are required values (no default) or the Cilium form.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from mass_jobs.k8s import codegen, labels, schemas
from tests.fixtures.cilium import cilium_errors
from tests.fixtures.k8s import CHART, REPO, ci_values_files, load_docs, render_chart

CHART_FILES = codegen.chart_files()
SCENARIOS = {p.name.removesuffix("-values.yaml"): p for p in ci_values_files()}


def _scenario(name: str) -> dict:
    return yaml.safe_load(SCENARIOS[name].read_text()) or {}


def _errors(obj: dict) -> list[str]:
    return cilium_errors(obj) if obj["kind"] == "CiliumNetworkPolicy" else schemas.all_errors(obj)


def _objects(values: dict, **kw) -> list[dict]:
    return [
        d
        for name, text in sorted(render_chart(values, **kw).items())
        if name.endswith(".yaml")
        for d in load_docs(text)
    ]


def _by(objs, kind, name):
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("rel", sorted(CHART_FILES))
def test_generated_chart_templates_match_checked_in(rel, tmp_path):
    codegen.write({rel: CHART_FILES[rel]}, tmp_path)
    assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), f"{rel} is stale: run `{codegen.RENDER}`"


@pytest.mark.parametrize(
    "folder, files", [("manifests", codegen.manifest_files()), ("examples/k8s", codegen.example_files())]
)
def test_generated_dirs_match_generator(folder, files):
    assert {f"{folder}/{p.name}" for p in (REPO / folder).iterdir()} == set(files)
    for rel, text in files.items():
        assert (REPO / rel).read_text() == text, f"{rel} is stale: run `{codegen.RENDER}`"


def test_scenarios_exist():
    assert set(SCENARIOS) == {"default", "gpu-cluster", "minio-gitops", "cilium", "paper", "kueue"}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_validates_strictly(scenario):
    objs = _objects(_scenario(scenario))
    kinds = sorted(o["kind"] for o in objs)
    assert kinds.count("WorkflowTemplate") == 2 and "NetworkPolicy" in kinds and "Role" in kinds
    errors = [e for o in objs for e in _errors(o)]
    assert errors == []
    for o in objs:
        meta = o["metadata"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert all(len(v) <= 63 for v in meta["labels"].values())


def test_manifests_and_example_objects_validate_strictly():
    docs = [d for text in codegen.manifest_files().values() for d in load_docs(text)]
    assert len(docs) == 12
    examples = [
        d for text in codegen.example_files().values() for d in load_docs(text) if isinstance(d, dict) and "kind" in d
    ]  # not the controller settings
    assert sorted(d["kind"] for d in examples) == [
        "CiliumNetworkPolicy",
        "CiliumNetworkPolicy",
        "InferenceService",
        "NetworkPolicy",
        "NetworkPolicy",
        "PyTorchJob",
        "Secret",
        "Secret",
    ]
    assert [e for d in docs + examples for e in _errors(d)] == []


def _strip(obj: dict) -> dict:
    """Drop what only the chart adds: its standard labels and the namespace."""
    obj = json.loads(json.dumps(obj))
    meta = obj["metadata"]
    meta.pop("namespace", None)
    meta["labels"] = {
        k: v
        for k, v in meta["labels"].items()
        if not k.startswith(
            (
                "helm.sh/",
                "app.kubernetes.io/name",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/version",
                "app.kubernetes.io/managed-by",
            )
        )
    }
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
    objs = _objects(_scenario("default"), namespace="mass-jobs")
    for name, doc in argo_docs.items():
        rendered = _by(objs, doc["kind"], name)
        assert rendered["metadata"]["namespace"] == "mass-jobs"
        assert _parsed_manifests(_strip(rendered)) == _parsed_manifests(json.loads(json.dumps(doc)))
    plain = [d for text in codegen.manifest_files().values() for d in load_docs(text)]
    for doc in plain:
        assert _parsed_manifests(_strip(_by(objs, doc["kind"], doc["metadata"]["name"]))) == _parsed_manifests(doc)
    assert not [o for o in objs if o["kind"] == "Secret" and o.get("type") == "Opaque"]


def test_gpu_cluster_values_reach_the_jobs():
    objs = _objects(_scenario("gpu-cluster"))
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    made = [o for o in schemas.embedded_manifests(cycle) if "spec" in o]
    isvc = next(o for o in made if o["kind"] == "InferenceService")
    job, single = [o for o in made if o["kind"] == "PyTorchJob"]  # Master + Workers; the Master alone
    assert single["spec"]["pytorchReplicaSpecs"]["Master"] == job["spec"]["pytorchReplicaSpecs"]["Master"]
    # replicas, processes and GPUs per replica are the spec's (validate's outputs, example values here)
    assert job["spec"]["nprocPerNode"] == "2"
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["resources"]["limits"] == {
        "cpu": "32",
        "memory": "256Gi",
        "nvidia.com/gpu": "2",
        "ephemeral-storage": "8Gi",
    }

    # /tmp on a volume of its own (scratch.trainer), /dev/shm still in memory; the merge likewise,
    # the step pods (no scratch value) on the node's disk
    def claim(size):
        return {
            "name": "tmp",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "gp3",
                        "resources": {"requests": {"storage": size}},
                    }
                }
            },
        }

    assert master["volumes"] == [claim("120Gi"), {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    templates = {t["name"]: t for t in cycle["spec"]["templates"]}
    assert templates["merge"]["volumes"] == [claim("200Gi")]
    assert templates["validate"]["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    model = isvc["spec"]["predictor"]["model"]
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "2" and "--max-model-len=262144" in model["args"]
    assert _by(objs, "ConfigMap", "mass-semaphores")["data"] == {"gpu-jobs": "4", "agent-pods": "16"}
    cron = _by(objs, "CronWorkflow", "mass-nightly")
    assert cron["spec"]["schedules"] == ["0 2 * * *", "0 14 * * *"] and cron["spec"]["suspend"] is False
    assert cron["spec"]["workflowSpec"]["arguments"]["parameters"][1] == {"name": "run", "value": "paper-nightly"}
    policy = _by(objs, "NetworkPolicy", "mass-agent-egress-apiserver")
    assert [p["ipBlock"]["cidr"] for p in policy["spec"]["egress"][0]["to"]] == ["172.20.0.10/32", "172.20.0.11/32"]


def test_minio_gitops_values():
    objs = _objects(_scenario("minio-gitops"), namespace="ignored")
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
    objs = _objects(_scenario("default"), name=name)
    assert {o["metadata"]["labels"]["app.kubernetes.io/instance"] for o in objs} == {name}
    long_override = _objects({**_scenario("default"), "nameOverride": "n" * 70})
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
        for typo in (
            {"images": {"job": "x"}},
            {"gpus": {}},
            {"resources": {"trainer": {"gpus": 2}}},
            {"cron": {"schedule": "* * * * *"}},
        ):
            with pytest.raises(helm_python.HelmError):
                chart.validate_schema(chart.merge_values(typo))
            with pytest.raises(helm_python.HelmError):
                chart.render({**_scenario("default"), **typo}, name="mass")


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
            assert lines[i - 1].strip().startswith("# --"), (
                f"values.yaml:{i + 1} {line.strip()!r} has no `# --` comment"
            )
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
    used = set(
        re.findall(
            r"\.Values\.([A-Za-z0-9_.]+)",
            "".join(CHART_FILES.values()) + "".join(p.read_text() for p in (CHART / "templates").glob("*.t*")),
        )
    )
    for path in used:
        node = values
        for part in path.split("."):
            assert part in node, f".Values.{path} is not in values.yaml"
            node = node[part]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_reports_no_errors(scenario):
    import helm_python

    report = helm_python.lint(CHART, _scenario(scenario), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# ---------------------------------------------------------------- secrets

SECRET_PATTERNS = [
    r"AKIA[0-9A-Z]{16}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY",
    r"(?i)(password|secret_?key|token)\s*:\s*[\"']?[^\s\"'{}]{6,}",
    r"sk-[A-Za-z0-9]{20,}",
    r"ghp_[A-Za-z0-9]{20,}",
]


def test_no_secret_values_anywhere():
    texts = {
        p.relative_to(REPO).as_posix(): p.read_text()
        for d in ("argo", "manifests", "examples/k8s", "charts/mass-jobs")
        for p in (REPO / d).rglob("*")
        if p.is_file()
    }
    assert len(texts) >= 25
    for rel, text in texts.items():
        for pat in SECRET_PATTERNS:
            assert not re.search(pat, text), f"{rel} matches {pat}"
    rendered = [o for name in SCENARIOS for o in _objects(_scenario(name))]
    rendered += [
        d for text in {**codegen.manifest_files(), **codegen.example_files()}.values() for d in load_docs(text)
    ]
    secrets = [o for o in rendered if isinstance(o, dict) and o.get("kind") == "Secret"]
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
    assert ports == [53, 53, 8080, 3128]  # the plain manifests carry no cluster address at all
    assert "ipBlock" not in json.dumps(policy)
    model_rule = policy["spec"]["egress"][1]["to"][0]["podSelector"]["matchLabels"]
    isvc = next(
        o
        for o in schemas.embedded_manifests(argo_docs["mass-cycle"])
        if o["kind"] == "InferenceService" and "spec" in o
    )
    assert all(isvc["spec"]["predictor"]["labels"][k] == v for k, v in model_rule.items())
    assert labels.STEP in model_rule
    # and the run's egress proxy: the pod of each cycle's Deployment, on the port it listens on
    # (a NetworkPolicy sees the pod behind the Service)
    proxy_rule = policy["spec"]["egress"][2]
    (proxy,) = [
        o for o in schemas.embedded_manifests(argo_docs["mass-cycle"]) if o["kind"] == "Deployment" and "spec" in o
    ]
    pod = proxy["spec"]["template"]
    assert all(pod["metadata"]["labels"][k] == v for k, v in proxy_rule["to"][0]["podSelector"]["matchLabels"].items())
    assert [p["port"] for p in proxy_rule["ports"]] == [
        c["containerPort"] for c in pod["spec"]["containers"][0]["ports"]
    ]
    (service,) = [
        o for o in schemas.embedded_manifests(argo_docs["mass-cycle"]) if o["kind"] == "Service" and "spec" in o
    ]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == pod["spec"]["containers"][0]["ports"][0]["name"]
    # every agent egress policy of the chart (all scenarios) selects exactly those pods
    for name in SCENARIOS:
        for o in _objects(_scenario(name)):
            if o["kind"] in ("NetworkPolicy", "CiliumNetworkPolicy"):
                sel = o["spec"].get("podSelector") or o["spec"]["endpointSelector"]
                assert sel == {"matchLabels": selector}, (name, o["metadata"]["name"])


# ---------------------------------------------------------------- network values without defaults

_API = [{"ipBlock": {"cidr": "172.18.0.3/32"}}, {"ipBlock": {"cidr": "172.18.0.4/32"}}]
_S3 = [{"ipBlock": {"cidr": "3.5.0.0/19"}}]


def _render_error(values: dict) -> str:
    import helm_python

    with pytest.raises(helm_python.HelmError) as e:
        render_chart(values)
    return str(e.value)


def test_helm_template_without_network_values_fails_naming_them():
    no_network = _render_error({})
    assert "required values are not set" in no_network and "kubectl get endpoints kubernetes" in no_network
    assert "network.apiServer.to" in no_network and "network.s3.to" in no_network
    only_s3 = _render_error({"network": {"apiServer": {"to": _API}}})
    assert "network.s3.to" in only_s3 and "network.apiServer.to" not in only_s3
    only_api = _render_error({"network": {"s3": {"to": _S3}}})
    assert "network.apiServer.to" in only_api and "network.s3.to" not in only_api
    # Cilium reaches the apiserver by entity: only S3 is still required
    cilium = _render_error({"network": {"cilium": True}})
    assert "network.s3.to" in cilium and "network.apiServer.to" not in cilium
    # an empty list would allow every destination: the values schema refuses it by path
    empty = _render_error({"network": {"apiServer": {"to": []}, "s3": {"to": _S3}}})
    assert "/network/apiServer/to" in empty and "minItems" in empty
    # the chart itself carries no address: the old defaults are gone from values and templates
    chart_text = (CHART / "values.yaml").read_text() + "".join(CHART_FILES.values())
    assert "10.96.0.1" not in chart_text and "10.0.0.0/8" not in chart_text


def _agent_egress(objs: list[dict]) -> dict[str, list[dict]]:
    return {o["metadata"]["name"]: o["spec"]["egress"] for o in objs if o["kind"] == "NetworkPolicy"}


def test_with_the_values_the_policies_have_exactly_those_cidrs():
    objs = _objects({"network": {"apiServer": {"to": _API}, "s3": {"to": _S3}}})
    egress = _agent_egress(objs)
    assert sorted(egress) == ["mass-agent-egress", "mass-agent-egress-apiserver", "mass-agent-egress-s3"]
    assert egress["mass-agent-egress-apiserver"] == [
        {"to": _API, "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    ]
    assert egress["mass-agent-egress-s3"] == [
        {"to": _S3, "ports": [{"port": 443, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}]}
    ]
    cidrs = sorted(
        peer["ipBlock"]["cidr"] for rules in egress.values() for r in rules for peer in r["to"] if "ipBlock" in peer
    )
    assert cidrs == ["172.18.0.3/32", "172.18.0.4/32", "3.5.0.0/19"]
    assert not [o for o in objs if o["kind"] == "CiliumNetworkPolicy"]
    for o in objs:
        if o["kind"] == "NetworkPolicy":
            assert all(rule["to"] for rule in o["spec"]["egress"]), o["metadata"]["name"]  # never `to: []`


def test_the_cilium_option_renders_a_valid_policy_instead_of_the_apiserver_cidrs():
    objs = _objects(_scenario("cilium"))
    cnp = _by(objs, "CiliumNetworkPolicy", "mass-agent-egress-apiserver")
    assert cilium_errors(cnp) == []
    assert cnp["apiVersion"] == "cilium.io/v2"
    assert cnp["spec"]["egress"] == [
        {
            "toEntities": ["kube-apiserver"],
            "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}, {"port": "6443", "protocol": "TCP"}]}],
        }
    ]
    assert sorted(_agent_egress(objs)) == ["mass-agent-egress", "mass-agent-egress-s3"]
    assert _agent_egress(objs)["mass-agent-egress-s3"][0]["ports"] == [{"port": 9000, "protocol": "TCP"}]
    # the check can fail: an integer port, an unknown entity, a missing selector
    bad = json.loads(json.dumps(cnp))
    bad["spec"]["egress"][0]["toPorts"][0]["ports"][0]["port"] = 443
    bad["spec"]["egress"][0]["toEntities"] = ["apiserver"]
    del bad["spec"]["endpointSelector"]
    assert len(cilium_errors(bad)) == 3


# ---------------------------------------------------------------- what `kubectl apply -f manifests/` does

WORKLOAD_KINDS = {
    "Pod",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
    "InferenceService",
    "PyTorchJob",
    "Workflow",
    "CronWorkflow",
}
SAFE_KINDS = {"ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "ConfigMap", "Secret"}


def apply_hazards(rel: str, doc: dict) -> list[str]:
    """What applying this object as it is would do beyond installing configuration."""
    where = f"{rel} {doc['kind']}/{doc['metadata']['name']}"
    out = []
    if doc["kind"] in WORKLOAD_KINDS or doc["kind"] not in SAFE_KINDS:
        out.append(f"{where}: starts work or is not plain configuration")
    if re.search(r"gpu", json.dumps(doc.get("spec", {})), re.I):
        out.append(f"{where}: requests GPUs")
    if doc["kind"] == "Secret":
        filled_by_kubernetes = doc.get("type") == "kubernetes.io/service-account-token"
        data = {**(doc.get("data") or {}), **(doc.get("stringData") or {})}
        if not filled_by_kubernetes or data:
            out.append(f"{where}: a Secret with placeholder or empty values replaces the real one")
    return out


def test_every_object_under_manifests_is_safe_to_apply_as_is():
    files = sorted((REPO / "manifests").glob("*"))
    assert len(files) == 5
    hazards = [h for p in files for d in load_docs(p.read_text()) for h in apply_hazards(p.name, d)]
    assert hazards == []
    # the reference objects moved out are exactly what the check refuses
    moved = {
        rel: [h for d in load_docs(text) for h in apply_hazards(rel, d)]
        for rel, text in codegen.example_files().items()
        if rel.split("/")[-1] in ("inferenceservice-base.yaml", "pytorchjob-base.yaml", "secret-templates.yaml")
    }
    assert all(moved.values()) and len(moved) == 3
    assert any("requests GPUs" in h for h in moved["examples/k8s/pytorchjob-base.yaml"])
    assert sum("Secret" in h for h in moved["examples/k8s/secret-templates.yaml"]) == 2


def test_the_kubernetes_guide_applies_only_manifests_and_argo():
    readme = (REPO / "docs" / "kubernetes.md").read_text()
    applies = re.findall(r"kubectl apply [^\n`]*", readme)
    assert applies and all(
        "examples/k8s" not in a or "networkpolicy-cluster-egress" in a or "ciliumnetworkpolicy" in a for a in applies
    ), applies


def test_cluster_specific_values_reach_every_object():
    """A cluster whose DNS domain is not cluster.local, whose DNS is not kube-dns (NodeLocal
    DNSCache, OpenShift), and whose pods have ephemeral-storage limits."""
    dns = [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}},
            "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}},
        }
    ]
    objs = _objects(
        {
            **_scenario("default"),
            "clusterDomain": "corp.internal",
            "network": {**_scenario("default")["network"], "dns": {"to": dns}},
            "resources": {"server": {"ephemeralStorage": "300Gi"}},
        }
    )
    text = yaml.safe_dump(_by(objs, "WorkflowTemplate", "mass-cycle"))
    assert ".svc.corp.internal/openai/v1" in text and "cluster.local" not in text
    policy = _by(objs, "NetworkPolicy", "mass-agent-egress")
    assert policy["spec"]["egress"][0]["to"] == dns
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    isvc = yaml.safe_load(
        next(t for t in cycle["spec"]["templates"] if t["name"] == "serve-model-apply")["resource"]["manifest"]
    )
    assert isvc["spec"]["predictor"]["model"]["resources"]["limits"]["ephemeral-storage"] == "300Gi"
    # only inside the cluster: KServe would route an external Ingress to the model without it
    assert isvc["metadata"]["labels"]["networking.kserve.io/visibility"] == "cluster-local"
    # every container mass-jobs defines asks for ephemeral storage (the kubelet evicts past it)
    for t in cycle["spec"]["templates"]:
        for c in [t.get("container"), *(t.get("sidecars") or [])]:
            if c:
                assert "ephemeral-storage" in c["resources"]["limits"], t["name"]


def test_an_s3_endpoint_with_a_scheme_fails_the_render():
    err = _render_error({**_scenario("default"), "s3": {"endpoint": "https://minio.example.com:9000"}})
    assert "s3.endpoint: expected host[:port] without a scheme" in err and "https://minio.example.com:9000" in err


def test_the_executor_may_set_owner_references_where_they_are_enforced():
    role = _by(_objects(_scenario("default")), "Role", "mass-executor")
    assert {"apiGroups": ["argoproj.io"], "resources": ["workflows/finalizers"], "verbs": ["update"]} in role["rules"]


def test_the_hardened_trainer_init_container_gives_up_like_the_operators():
    from mass_jobs.k8s import training

    (init,) = training.operator_init_container_template()
    script = init["command"][-1]
    assert "{{.MaxTries}}" in script and "until" not in script and script.endswith("exit $err")


def _queue_labels(objs) -> dict[str, list]:
    """The queue label of every object and pod template mass-cycle makes, by where it stands."""
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    made = [o for o in schemas.embedded_manifests(cycle) if "spec" in o]
    job = next(o for o in made if o["kind"] == "PyTorchJob")
    isvc = next(o for o in made if o["kind"] == "InferenceService")
    pods = [t for t in cycle["spec"]["templates"] if "container" in t or "containerSet" in t]
    return {
        "job": [job["metadata"]["labels"].get(labels.QUEUE)],
        "job pods": [job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"].get(labels.QUEUE)],
        "isvc": [isvc["metadata"]["labels"].get(labels.QUEUE), isvc["spec"]["predictor"]["labels"].get(labels.QUEUE)],
        "pods": sorted({str(((t.get("metadata") or {}).get("labels") or {}).get(labels.QUEUE)) for t in pods}),
    }


def _deadlines(objs) -> dict[str, int]:
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    tmpl = {t["name"]: t for t in cycle["spec"]["templates"]}
    job = yaml.safe_load(tmpl["train-job-single"]["resource"]["manifest"])
    return {
        "job": job["spec"]["runPolicy"]["activeDeadlineSeconds"],
        "train step": int(tmpl["train-job"]["activeDeadlineSeconds"]),
        "single step": int(tmpl["train-job-single"]["activeDeadlineSeconds"]),
        "wait step": int(tmpl["train-wait"]["activeDeadlineSeconds"]),
        "started": tmpl["train-job"]["resource"]["successCondition"],
        "serve wait": _serve_wait(tmpl["serve-model-wait"]),
    }


def _serve_wait(t: dict) -> tuple[int, int, int]:
    """The serve step's wait: (its pending bound, its ready deadline, its pod's deadline)."""
    args = dict(a.removeprefix("--").split("=", 1) for a in t["container"]["args"] if a.startswith("--"))
    return int(args["pending-timeout"]), int(args["ready-timeout"]), int(t["activeDeadlineSeconds"])


def test_kueue_labels_the_papers_gpu_workloads_and_its_queue_time_extends_only_the_argo_deadlines():
    """With kueue.queueName the trainer job (not its pods: Kueue admits the job as one Workload) and
    the predictor carry the queue label; step and agent pods only under the plain-pod integration.
    The job's own deadline counts from its admission; the Argo steps that wait on a queued object
    get maxQueueSeconds more: the train step's start (its Master running, past Kueue's Suspended
    condition) within scheduling.pendingTimeoutSeconds, its wait within the training deadline."""
    paper = _scenario("paper")
    plain = _objects(paper)
    assert _queue_labels(plain) == {"job": [None], "job pods": [None], "isvc": [None, None], "pods": ["None"]}
    assert _deadlines(plain) == {
        "job": 172800,
        "train step": 900,
        "single step": 900,
        "wait step": 172800,
        "started": "status.conditions.1.type",
        "serve wait": (900, 3600, 3900),
    }
    queued = _objects({**paper, "kueue": {"queueName": "gpu-team", "maxQueueSeconds": 7200}})
    assert _queue_labels(queued) == {
        "job": ["gpu-team"],
        "job pods": [None],
        "isvc": ["gpu-team", "gpu-team"],
        "pods": ["None"],
    }
    assert _deadlines(queued) == {
        "job": 172800,
        "train step": 900 + 7200,
        "single step": 900 + 7200,
        "wait step": 172800 + 7200,
        "started": "status.conditions.2.type",
        "serve wait": (900 + 7200, 3600 + 7200, 3900 + 7200),
    }
    # no pending bound: the start waits as long as the training may
    unbound = _objects({**paper, "scheduling": {"pendingTimeoutSeconds": 0}})
    assert _deadlines(unbound)["train step"] == 172800
    assert _deadlines(unbound)["serve wait"] == (0, 3600, 3900)  # a held predictor waits for the ready deadline
    pods = _objects(_scenario("kueue"))
    assert _queue_labels(pods) == {
        "job": ["mass-gpu"],
        "job pods": [None],
        "isvc": ["mass-gpu", "mass-gpu"],
        "pods": ["mass-gpu"],
    }


def test_s3_egress_by_name_on_cilium_replaces_the_cidr_policy():
    """network.s3.fqdns: the S3 egress as a CiliumNetworkPolicy toFQDNs rule (with the DNS proxy rule
    Cilium learns the addresses from) instead of the NetworkPolicy of CIDRs, which is then not
    required; without Cilium the chart refuses the option, and the CIDR form is still the default."""
    fqdns = [{"matchName": "s3.us-east-1.amazonaws.com"}, {"matchPattern": "*.s3.us-east-1.amazonaws.com"}]
    objs = _objects({"network": {"cilium": True, "s3": {"fqdns": fqdns, "ports": [{"port": 443, "protocol": "TCP"}]}}})
    cnp = _by(objs, "CiliumNetworkPolicy", "mass-agent-egress-s3")
    assert cilium_errors(cnp) == []
    dns, s3 = cnp["spec"]["egress"]
    assert s3 == {"toFQDNs": fqdns, "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]}
    assert dns["toEndpoints"] == [
        {"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}}
    ]
    assert dns["toPorts"][0]["rules"] == {"dns": [{"matchPattern": "*"}]}
    assert "mass-agent-egress-s3" not in _agent_egress(objs)  # no NetworkPolicy of CIDRs beside it
    refused = _render_error({"network": {"apiServer": {"to": _API}, "s3": {"fqdns": fqdns}}})
    assert "network.s3.fqdns: expected network.cilium=true" in refused
    cidrs = _objects({"network": {"apiServer": {"to": _API}, "s3": {"to": _S3}}})
    assert not [o for o in cidrs if o["kind"] == "CiliumNetworkPolicy"] and "mass-agent-egress-s3" in _agent_egress(
        cidrs
    )
    bad = json.loads(json.dumps(cnp))
    bad["spec"]["egress"][1]["toFQDNs"] = [{"matchName": "s3 .amazonaws.com"}]
    assert len(cilium_errors(bad)) == 1


def test_the_grafana_dashboard_charts_exactly_the_metrics_the_templates_emit():
    """Every panel queries a metric some generated template emits (with or without the controller's
    argo_workflows_ prefix), and every emitted metric has a panel; `metrics.dashboard` installs it as
    a ConfigMap Grafana's sidecar loads, byte for byte the chart's file."""
    from mass_jobs.k8s import prometheus

    path = CHART / "dashboards" / "mass-jobs.json"
    dash = json.loads(path.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\(argo_workflows_\)\?(\w+?)(?:_bucket|_count|_sum)?\"", e)}
    cycle = yaml.safe_load((REPO / "argo" / "mass-cycle.yaml").read_text().split("\n---\n")[0])
    emitted = {m["name"] for t in cycle["spec"]["templates"] for m in (t.get("metrics") or {}).get("prometheus", [])}
    assert queried == emitted == set(prometheus.NAMES), (queried, emitted)
    # one run at a time (the dashboard's run variable): every series the templates emit has the label
    assert all('run="$run"' in e for e in exprs), exprs
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "run"]
    assert all(
        any(lab["key"] == "run" for lab in m.get("labels") or [])
        for t in cycle["spec"]["templates"]
        for m in (t.get("metrics") or {}).get("prometheus", [])
    )
    (egress,) = [t for t in cycle["spec"]["templates"] if t["name"] == "egress-proxy"]
    assert "metrics" not in egress  # a daemon's metrics fire when it is ready, in status Running
    assert not [o for o in _objects(_scenario("default")) if o["metadata"]["name"] == "mass-jobs-dashboard"]
    (cm,) = [
        o
        for o in _objects({**_scenario("default"), "metrics": {"dashboard": True}})
        if o["metadata"]["name"] == "mass-jobs-dashboard"
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and schemas.all_errors(cm) == []
    assert cm["data"]["mass-jobs.json"] == path.read_text().rstrip("\n")


def _placements(objs) -> dict[str, set]:
    """Each class of pods mass-cycle makes -> the scheduling fields its pods carry (as JSON)."""
    from mass_jobs.k8s.argo import scheduling_class
    from mass_jobs.pipeline.table import PIPELINE

    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    made = [o for o in schemas.embedded_manifests(cycle) if "spec" in o]
    fields = ("nodeSelector", "tolerations", "affinity", "priorityClassName")

    def of(spec: dict) -> str:
        return json.dumps({k: spec[k] for k in fields if k in spec}, sort_keys=True)

    out: dict[str, set] = {}
    for t in cycle["spec"]["templates"]:
        if "container" in t:
            out.setdefault(scheduling_class(t["name"], PIPELINE), set()).add(of(t))
    for job in (o for o in made if o["kind"] == "PyTorchJob"):
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            out.setdefault("trainer", set()).add(of(replica["template"]["spec"]))
    for isvc in (o for o in made if o["kind"] == "InferenceService"):
        out.setdefault("server", set()).add(of(isvc["spec"]["predictor"]))
    for proxy in (o for o in made if o["kind"] == "Deployment"):
        out.setdefault("egress", set()).add(of(proxy["spec"]["template"]["spec"]))
    return out


def test_each_class_of_pods_gets_its_scheduling_values_and_every_pod_the_pull_secrets():
    """A tainted GPU pool (gpu-cluster values): the trainer's replicas and the predictor tolerate it
    and select it; step, agent, egress and merge pods carry nothing and stay off it. Every pod's
    ServiceAccount has the registry's pull Secret. Defaults: no field anywhere, no pull Secret."""
    gpu = _scenario("gpu-cluster")
    objs = _objects(gpu)
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pool = {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    got = _placements(objs)
    assert got["trainer"] == {
        json.dumps(
            {"nodeSelector": pool, "priorityClassName": "gpu-training", "tolerations": toleration}, sort_keys=True
        )
    }
    assert got["server"] == {json.dumps({"nodeSelector": pool, "tolerations": toleration}, sort_keys=True)}
    assert {c: v for c, v in got.items() if c not in ("trainer", "server")} == {
        c: {"{}"} for c in ("step", "agent", "egress", "merge")
    }
    sas = [o for o in objs if o["kind"] == "ServiceAccount"]
    assert len(sas) == 4 and all(o["imagePullSecrets"] == [{"name": "registry-credentials"}] for o in sas)
    assert all(_errors(o) == [] for o in objs if o["kind"] in ("WorkflowTemplate", "ServiceAccount"))
    for o in (m for w in objs if w["kind"] == "WorkflowTemplate" for m in schemas.embedded_manifests(w) if "spec" in m):
        assert schemas.all_errors(o) == [], o["kind"]
    # one class at a time: agents onto a node pool of their own, by affinity
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["agents"]}]}]
            }
        }
    }
    agents = _placements(_objects({**gpu, "scheduling": {"agent": {"affinity": affinity}}}))
    assert agents["agent"] == {json.dumps({"affinity": affinity}, sort_keys=True)} and agents["step"] == {"{}"}
    default = _objects(_scenario("default"))
    assert set().union(*_placements(default).values()) == {"{}"}
    assert not any("imagePullSecrets" in o for o in default if o["kind"] == "ServiceAccount")


def test_every_pod_template_has_a_deadline():
    """A step that hangs fails (and is retried) instead of holding the run for days: every pod
    template has activeDeadlineSeconds (steps and merge from their values, agent pods and the GPU
    steps their own, the egress proxy's step its bound to be ready). The proxy itself, a
    Deployment, lives until the cycle's last step or its exit handler deletes it."""
    objs = _objects(
        {
            **_scenario("default"),
            "resources": {"step": {"activeDeadlineSeconds": 900}, "merge": {"activeDeadlineSeconds": 7200}},
        }
    )
    cycle = _by(objs, "WorkflowTemplate", "mass-cycle")
    deadlines = {
        t["name"]: t.get("activeDeadlineSeconds")
        for t in cycle["spec"]["templates"]
        if "container" in t or "resource" in t
    }
    assert [n for n, d in deadlines.items() if d is None] == [], deadlines
    assert deadlines["egress-proxy"] == "1800"
    assert int(deadlines["merge"]) == 7200 and int(deadlines["validate"]) == 900
    assert {int(d) for n, d in deadlines.items() if d is not None and n not in ("merge",)} >= {900}


def _agent_template(values: dict) -> dict:
    cycle = _by(_objects(values), "WorkflowTemplate", "mass-cycle")
    return next(t for t in cycle["spec"]["templates"] if t["name"] == "agent-episode")


def test_the_papers_agent_pods_hold_its_machine_and_a_gpu_and_the_defaults_none():
    """paper-values: the sandbox container (every shell command) gets the GPU and 72Gi, the qwen-code
    container its own small size, the workspace a 128Gi volume made with the pod; the defaults
    request no GPU resource at all (a Kueue queue need not cover one) and keep the workspace on the node."""
    paper = _agent_template(_scenario("paper"))
    containers = {c.get("name", "main"): c["resources"]["limits"] for c in [paper["container"], *paper["sidecars"]]}
    assert containers["sandbox"] == {"cpu": "16", "memory": "72Gi", "ephemeral-storage": "8Gi", "nvidia.com/gpu": "1"}
    assert containers["qwen"] == {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "2Gi"}
    assert "nvidia.com/gpu" not in containers["main"]
    workspace = next(v for v in paper["volumes"] if v["name"] == "workspace")
    assert workspace["ephemeral"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"] == "128Gi"
    sandbox = next(c for c in paper["sidecars"] if c["name"] == "sandbox")
    assert {"name": "TMPDIR", "value": "/workspace"} in sandbox["env"]  # the commands' /tmp folders on that volume
    default = _agent_template(_scenario("default"))
    assert not any("gpu" in k for c in [default["container"], *default["sidecars"]] for k in c["resources"]["limits"])
    assert next(v for v in default["volumes"] if v["name"] == "workspace") == {"name": "workspace", "emptyDir": {}}
    assert all(schemas.all_errors(o) == [] for o in _objects(_scenario("paper")) if o["kind"] == "WorkflowTemplate")
