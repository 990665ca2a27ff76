"""`mass validate --cluster`: the spec and the chart's values against a live cluster, read through the
real Kubernetes client from a recorded-API server on loopback (tests/fixtures/kube_api.py), a healthy
recording and one recording per fault a platform team meets first (tests/fixtures/kube_recordings.py)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from mass_jobs.cluster.preflight import unknown_fields
from mass_jobs.commands.cli import main
from mass_jobs.k8s.schemas import schema_errors
from tests.fixtures import kube_recordings as R
from tests.fixtures.kube_api import RecordedApi

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "examples/k8s-small.yaml")
VALUES = [ROOT / "charts/mass-jobs/ci/gpu-cluster-values.yaml", ROOT / "charts/mass-jobs/ci/kueue-values.yaml"]
# k8s-small's judge key and tool-call parser, over the GPU cluster's scenario values
OWN_VALUES = "judges:\n  keys: [JUDGE_API_KEY]\nmodel:\n  toolCallParser: hermes\n"
LIVE_CHECKS = [
    "API workflows.argoproj.io",
    "API workflowtemplates.argoproj.io",
    "API pytorchjobs.kubeflow.org",
    "API inferenceservices.serving.kserve.io",
    "API clusterservingruntimes.serving.kserve.io",
    "API localqueues.kueue.x-k8s.io",
    "API clusterqueues.kueue.x-k8s.io",
    "Argo executor securityContext",
    "KServe storage initializer",
    "submit a run",
    "executor ServiceAccount",
    "serve-wait ServiceAccount",
    "secret mass-s3-credentials",
    "secret mass-judge-keys",
    "Kueue covered resources",
    "Kueue GPU quota",
    "Kueue PyTorchJob integration",
    "nodes for step pods",
    "nodes for agent pods",
    "nodes for merge pods",
    "nodes for trainer pods",
    "nodes for server pods",
    "scratch storage class (agent)",
    "scratch storage class (merge)",
    "scratch storage class (trainer)",
]
# kinds neither the schemas folder nor kubernetes-validate has: only the fields read here are recorded
NO_UPSTREAM_SCHEMA = {"ClusterStorageContainer", "LocalQueue", "ClusterQueue"}


@pytest.fixture(scope="module")
def healthy() -> list[dict]:
    return R.healthy("mass")


def validate(objects, tmp_path, capsys, *extra: str, tokens=None, token="admin-token"):
    """`mass validate SPEC --values ... --cluster` against a recording: (exit code, the live table's
    rows {check: verdict}, the error lines)."""
    own = tmp_path / "own-values.yaml"
    own.write_text(OWN_VALUES)
    with RecordedApi(objects, tokens=tokens) as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", token=token)
        argv = [
            "validate",
            SPEC,
            *(a for v in VALUES for a in ("--values", str(v))),
            "--values",
            str(own),
            "--cluster",
            "--kubeconfig",
            str(kubeconfig),
            "--quiet",
            *extra,
        ]
        rc = main(argv)
    out, err = capsys.readouterr()
    live = out.split("\nthe cluster: ", 1)[1]
    rows = {}
    for line in live.splitlines()[3:]:
        if not line.strip():
            break
        rows[re.split(r"\s{2,}", line)[0]] = line.rsplit(None, 1)[-1]
    errors = [x.strip() for x in err.splitlines() if x.startswith("  ")]
    return rc, rows, errors, live


def test_a_healthy_cluster_passes_every_check_exit_0(healthy, tmp_path, capsys):
    rc, rows, errors, live = validate(healthy, tmp_path, capsys)
    assert (
        live.startswith("context recorded (http://127.0.0.1:") and ", namespace mass\n" in live.split("\n", 1)[0] + "\n"
    )
    assert (rc, errors) == (0, [])
    assert list(rows) == LIVE_CHECKS and set(rows.values()) == {"ok"}
    # the nodes that take each class, counted: the GPU pool only for the trainer and the predictor
    assert "nodes for trainer pods                        1 of 3" in live
    assert "nodes for step pods                           2 of 3" in live


@pytest.mark.parametrize(
    "fault, failing, named",
    [
        (
            "missing-crd",
            {"API pytorchjobs.kubeflow.org"},
            ["crd pytorchjobs.kubeflow.org: PyTorchJob (pytorchjobs.kubeflow.org) is not installed here"],
        ),
        (
            "old-pytorchjob",
            {"API pytorchjobs.kubeflow.org"},
            [
                "crd pytorchjobs.kubeflow.org: the cluster's PyTorchJob CRD (kubeflow.org/v1) does not declare spec.nprocPerNode"
            ],
        ),
        (
            "gpu-taint",
            {"nodes for trainer pods", "nodes for server pods"},
            [f"values scheduling.{c}.tolerations: no node takes a {c} pod" for c in ("trainer", "server")],
        ),
        (
            "small-node-disk",
            {"nodes for step pods"},
            ["values resources.step.ephemeralStorage (or scratch.step.size): no node takes a step pod"],
        ),
        (
            "queue-without-ephemeral-storage",
            {"Kueue covered resources"},
            [
                "clusterqueue team-gpu spec.resourceGroups[].coveredResources: clusterqueue team-gpu does not cover "
                "ephemeral-storage"
            ],
        ),
        (
            "judge-key-missing",
            {"secret mass-judge-keys"},
            [
                "secret mass-judge-keys in mass (values judges.secretName): secret mass-judge-keys in namespace mass has no "
                "value for JUDGE_API_KEY"
            ],
        ),
        (
            "executor-forbidden-verb",
            {"executor ServiceAccount"},
            [
                "role/rolebinding mass-executor in mass: serviceaccount mass-executor in mass may not patch "
                "workflowtaskresults.argoproj.io"
            ],
        ),
        (
            "serve-wait-unbound",
            {"serve-wait ServiceAccount"},
            [
                "role/rolebinding mass-serve-wait in mass: serviceaccount mass-serve-wait in mass may not get "
                "inferenceservices.serving.kserve.io; list pods"
            ],
        ),
    ],
)
def test_one_fault_exits_2_with_one_line_naming_it(healthy, tmp_path, capsys, fault, failing, named):
    rc, rows, errors, _ = validate(R.FAULTS[fault](healthy), tmp_path, capsys)
    assert rc == 2
    assert {c for c, v in rows.items() if v == "FAIL"} == failing
    assert len(errors) == len(named) and all(e.startswith(n) for e, n in zip(errors, named)), errors
    if fault == "gpu-taint":  # the scheduler's own words, the taint named
        assert all("1 node(s) had untolerated taint {dedicated: ml-training}" in e for e in errors)
    if fault == "small-node-disk":
        assert errors[0].endswith("2 Insufficient ephemeral-storage.")


def test_an_account_that_may_not_read_gets_notes_not_passes(healthy, tmp_path, capsys):
    """A namespace user: its own namespace's objects, discovery, nothing cluster-wide; what it cannot
    read is said, the APIs are still found through discovery."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": R.meta("run-operator", "mass"),
        "rules": [
            {
                "apiGroups": ["", "kueue.x-k8s.io"],
                "resources": ["secrets", "namespaces", "localqueues"],
                "verbs": ["get", "list"],
            },
            {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create", "get", "list"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": R.meta("run-operator", "mass"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "run-operator"},
        "subjects": [{"kind": "User", "name": "dev", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    tokens = {"admin-token": ("admin", ["system:masters"]), "dev-token": ("dev", [])}
    rc, rows, errors, live = validate(healthy + [role, binding], tmp_path, capsys, tokens=tokens, token="dev-token")
    assert (rc, errors) == (0, [])
    # served versions come from discovery, which every account may read; the CRDs' fields are not checked
    assert rows["API workflows.argoproj.io"] == "ok"
    assert "note: API pytorchjobs.kubeflow.org: could not read its CRD" in live
    assert rows["secret mass-judge-keys"] == rows["submit a run"] == "ok"
    unread = {
        "API pytorchjobs.kubeflow.org",
        "API inferenceservices.serving.kserve.io",
        "Argo executor securityContext",
        "KServe storage initializer",
        "executor ServiceAccount",
        "Kueue queue",
        "nodes",
        "scratch storage class (agent)",
        "scratch storage class (merge)",
        "scratch storage class (trainer)",
    }
    assert {c for c, v in rows.items() if v == "note"} == unread
    assert {c for c, v in rows.items() if v == "FAIL"} == set()
    assert (
        'note: nodes: could not read the nodes: nodes is forbidden: User "dev" cannot list resource '
        '"nodes" in API group "" at the cluster scope; not checked' in live
    )
    assert "note: executor ServiceAccount: could not read a SubjectAccessReview" in live


def test_the_namespace_flag_reads_another_namespace(healthy, tmp_path, capsys):
    rc, rows, errors, live = validate(healthy, tmp_path, capsys, "--namespace", "team-b")
    assert rc == 2 and ", namespace team-b" in live.split("\n", 1)[0]
    assert rows["secret mass-s3-credentials"] == rows["secret mass-judge-keys"] == "FAIL"
    assert any(
        e.startswith(
            "secret mass-s3-credentials in team-b (values s3.secretName): secret "
            "mass-s3-credentials in namespace team-b does not exist"
        )
        for e in errors
    )


def test_no_reachable_cluster_is_an_argument_error(tmp_path, capsys):
    rc = main(["validate", SPEC, "--cluster", "--kubeconfig", str(tmp_path / "missing"), "--quiet"])
    assert rc == 2
    assert "--cluster: no kubeconfig to read" in capsys.readouterr().err


def test_the_recorded_objects_are_valid_against_the_upstream_schemas(healthy):
    checked = 0
    for obj in healthy:
        if obj["kind"] in NO_UPSTREAM_SCHEMA:
            continue
        assert schema_errors(obj) == [], obj["metadata"]["name"]
        checked += 1
    assert checked == len(healthy) - 3
    # and the schemas catch what is wrong: a node's allocatable as a list, a CRD with a stray field
    bad_node = copy.deepcopy(next(o for o in healthy if o["kind"] == "Node"))
    bad_node["status"]["allocatable"] = ["cpu"]
    bad_crd = dict(next(o for o in healthy if o["kind"] == "CustomResourceDefinition"), served=True)
    assert schema_errors(bad_node) and schema_errors(bad_crd)


def test_unknown_fields_are_what_a_structural_schema_prunes():
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "items": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}},
                },
            }
        },
    }
    obj = {
        "spec": {
            "a": 1,
            "b": 2,
            "labels": {"any": "thing"},
            "open": {"deep": {"er": 1}},
            "items": [{"x": "1"}, {"x": "2", "y": 3}],
        }
    }
    assert unknown_fields(obj, schema) == ["spec.b", "spec.items[1].y"]
