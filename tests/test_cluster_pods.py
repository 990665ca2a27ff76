"""`mass pods RUN`: a run's Workflow, pods and GPU objects, read through the real Kubernetes client
from a recorded-API server (tests/fixtures/kube_api.py). The executor's own pods are served the
same way in tests/test_argo_exec.py (a Pending predictor) and tests/test_egress.py (an agent pod)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from mass_jobs.cluster.pods import reason
from mass_jobs.commands.cli import main
from mass_jobs.k8s import labels as L
from mass_jobs.k8s.schemas import schema_errors
from tests.fixtures.kube_api import RecordedApi, operator_view

RUN = "demo"
UNSCHEDULABLE = (
    "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: ml-training}, 2 Insufficient nvidia.com/gpu."
)


def stamp(ago_s: float) -> str:
    return datetime.fromtimestamp(time.time() - ago_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    step: str,
    status: dict,
    container: str = "main",
    task: str = "",
    episode: str = "",
    node: str = "",
    run: str = RUN,
    ago_s: float = 300,
) -> dict:
    labels = {L.RUN: run, L.GENERATION: "1", L.TASK: task, L.STEP: step, L.EPISODE: episode, **L.PART_OF}
    spec = {"containers": [{"name": container, "image": "ghcr.io/mass-jobs/jobs:0.1.0"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "mass", "labels": labels, "creationTimestamp": stamp(ago_s)},
        "spec": spec,
        "status": status,
    }


def container(name: str, state: dict, restarts: int = 0, last: dict | None = None) -> dict:
    out = {
        "name": name,
        "ready": "running" in state,
        "restartCount": restarts,
        "image": "x",
        "imageID": "",
        "state": state,
    }
    if last:
        out["lastState"] = last
    return out


PODS = [
    pod(
        "demo-collect-agent-1",
        "episode",
        {"phase": "Running", "containerStatuses": [container("main", {"running": {"startedAt": stamp(60)}})]},
        task="fib",
        episode="ep-3",
        node="cpu-1",
    ),
    pod(
        "demo-collect-agent-2",
        "episode",
        {
            "phase": "Failed",
            "containerStatuses": [container("main", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})],
        },
        task="fib",
        episode="ep-4",
        node="cpu-2",
    ),
    pod(
        "demo-collect-agent-3",
        "episode",
        {
            "phase": "Pending",
            "containerStatuses": [
                container(
                    "main",
                    {
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": 'Back-off pulling image "ghcr.io/mass-jobs/sandbox:0.1.0"',
                        }
                    },
                )
            ],
        },
        task="primes",
        episode="ep-0",
        node="cpu-1",
    ),
    pod(
        "demo-evaluate-9",
        "evaluate",
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: ephemeral-storage."},
        node="cpu-2",
    ),
    pod(
        "demo-train-master-0",
        "train",
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
            ],
        },
        container="pytorch",
    ),
    pod(
        "demo-search-1",
        "search",
        {
            "phase": "Running",
            "containerStatuses": [
                container(
                    "main",
                    {"running": {"startedAt": stamp(30)}},
                    restarts=2,
                    last={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                )
            ],
        },
        task="fib",
        node="cpu-1",
    ),
    pod("other-search-1", "search", {"phase": "Running"}, run="other"),
]
OBJECTS = [
    {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "mass-run-x7k2p", "namespace": "mass", "labels": {L.RUN: RUN}},
        "status": {"phase": "Running"},
    },
    {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "demo-g1-train", "namespace": "mass", "labels": {L.RUN: RUN, L.GENERATION: "1"}},
        "status": {"conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}]},
    },
    {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "demo-g1", "namespace": "mass", "labels": {L.RUN: RUN, L.GENERATION: "1"}},
        "status": {
            "conditions": [
                {
                    "type": "PredictorReady",
                    "status": "False",
                    "reason": "MinimumReplicasUnavailable",
                    "message": "Deployment does not have minimum availability.",
                },
                {"type": "Ready", "status": "False"},
            ]
        },
    },
]


def crd(kind: str, group: str, plural: str, version: str) -> dict:
    from tests.fixtures.kube_recordings import OPEN
    from tests.fixtures.kube_recordings import crd as make

    return make(group, kind, plural, {version: OPEN})


CRDS = [
    crd("Workflow", "argoproj.io", "workflows", "v1alpha1"),
    crd("PyTorchJob", "kubeflow.org", "pytorchjobs", "v1"),
    crd("InferenceService", "serving.kserve.io", "inferenceservices", "v1beta1"),
]


def test_the_recorded_pods_are_pods_as_the_api_server_returns_them():
    for p in PODS:
        assert schema_errors(p) == [], p["metadata"]["name"]


def test_each_pod_says_why_it_is_not_running_or_how_it_ended():
    why = {p["metadata"]["name"]: reason(p) for p in PODS}
    assert why == {
        "demo-collect-agent-1": "",
        "demo-collect-agent-2": "OOMKilled (main, exit code 137)",
        "demo-collect-agent-3": 'ImagePullBackOff (main): Back-off pulling image "ghcr.io/mass-jobs/sandbox:0.1.0"',
        "demo-evaluate-9": "Evicted: The node was low on resource: ephemeral-storage.",
        "demo-train-master-0": f"Unschedulable: {UNSCHEDULABLE}",
        "demo-search-1": "restarted after OOMKilled (main, exit code 137)",
        "other-search-1": "",
    }


def test_the_view_lists_the_runs_pods_with_their_episodes_and_the_gpu_objects(tmp_path):
    created = next(p for p in PODS if p["metadata"]["name"] == "demo-collect-agent-1")["metadata"]["creationTimestamp"]
    created_s = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    lo = int(time.time() - created_s)  # the pods were made when the module was imported, however long ago
    v = operator_view(tmp_path, RUN, CRDS + OBJECTS, pods=PODS)
    hi = int(time.time() - created_s)
    rows = {p["name"]: p for p in v["pods"]}
    assert "other-search-1" not in rows and len(rows) == 6  # by the run's label only
    assert {k: rows["demo-collect-agent-1"][k] for k in ("step", "generation", "task", "episode", "phase", "node")} == {
        "step": "episode",
        "generation": "1",
        "task": "fib",
        "episode": "ep-3",
        "phase": "Running",
        "node": "cpu-1",
    }
    assert rows["demo-search-1"]["restarts"] == 2
    assert lo <= rows["demo-collect-agent-1"]["age_s"] <= hi and lo >= 300
    assert rows["demo-train-master-0"]["logs"] == "kubectl logs -n mass demo-train-master-0 -c pytorch"
    assert v["workflows"] == [{"name": "mass-run-x7k2p", "phase": "Running", "message": ""}]
    assert [(o["kind"], o["name"], o["conditions"]) for o in v["objects"]] == [
        ("PyTorchJob", "demo-g1-train", "Created=True"),
        (
            "InferenceService",
            "demo-g1",
            "PredictorReady=False (MinimumReplicasUnavailable: Deployment does not have "
            "minimum availability.), Ready=False",
        ),
    ]


def test_the_command_prints_tables_and_json(tmp_path, capsys):
    with RecordedApi(CRDS + OBJECTS, pods=PODS) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
        assert main(["pods", RUN, "--kubeconfig", kubeconfig]) == 0
        text = capsys.readouterr().out
        assert main(["pods", RUN, "--kubeconfig", kubeconfig, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    assert text.startswith("run demo in namespace mass\nworkflow mass-run-x7k2p: Running\n")
    assert f"  demo-train-master-0: Unschedulable: {UNSCHEDULABLE}" in text
    assert "  kubectl logs -n mass demo-collect-agent-2 -c main" in text
    table = text.split("\n\n")[1].splitlines()
    assert table[0].split() == ["POD", "STEP", "GEN", "TASK", "EPISODE", "PHASE", "NODE", "RESTARTS", "AGE"]
    assert table[1].split()[:7] == ["demo-collect-agent-1", "episode", "1", "fib", "ep-3", "Running", "cpu-1"]
    assert len(doc["pods"]) == 6 and doc["run"] == RUN


def test_a_run_with_nothing_on_the_cluster_says_so(tmp_path):
    from mass_jobs.cluster.pods import render

    v = operator_view(tmp_path, "never-ran", CRDS)
    assert v["pods"] == v["workflows"] == v["objects"] == []
    assert render(v).splitlines() == [
        "run never-ran in namespace mass",
        "no Workflow of this run here (label mass-jobs.io/run); argo submit ... -p run=<name> starts one",
        "",
        "no pods of this run (succeeded pods are deleted 10 minutes after they end)",
    ]


def test_watch_redraws_until_interrupted(tmp_path, capsys, monkeypatch):
    naps = []

    def nap(seconds):  # the second nap is the operator's Ctrl-C
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("mass_jobs.commands.pods.time.sleep", nap)
    with RecordedApi(CRDS + OBJECTS, pods=PODS) as api:
        assert main(["pods", RUN, "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")), "--watch", "2"]) == 0
    assert naps == [2.0, 2.0] and capsys.readouterr().out.count("run demo in namespace mass\n") == 2


def test_what_the_account_may_not_list_is_said_and_the_rest_drawn(tmp_path):
    """A user who may list pods and workflows in the namespace, not the GPU objects."""
    from tests.fixtures.kube_recordings import meta

    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta("pods-reader", "mass"),
        "rules": [{"apiGroups": ["", "argoproj.io"], "resources": ["pods", "workflows"], "verbs": ["list"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta("pods-reader", "mass"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-reader"},
        "subjects": [{"kind": "User", "name": "dev", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    with RecordedApi(CRDS + OBJECTS + [role, binding], tokens={"dev-token": ("dev", [])}, pods=PODS) as api:
        from mass_jobs.cluster.api import Cluster
        from mass_jobs.cluster.pods import render, view

        v = view(Cluster.connect(str(api.kubeconfig(tmp_path / "kubeconfig", token="dev-token"))), RUN)
    assert len(v["pods"]) == 6 and v["objects"] == [] and len(v["workflows"]) == 1
    assert [u.split(":")[0] for u in v["unread"]] == ["pytorchjobs", "inferenceservices", "events"]
    assert 'User "dev" cannot list resource "pytorchjobs"' in v["unread"][0]
    assert "not read (this account may not):" in render(v)


def event(pod: str, message: str, reason: str = "FailedScheduling") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.1", "namespace": "mass"},
        "involvedObject": {"kind": "Pod", "namespace": "mass", "name": pod},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "count": 3,
        "source": {"component": "default-scheduler"},
        "firstTimestamp": stamp(900),
        "lastTimestamp": stamp(60),
    }


def test_a_pod_argo_deleted_at_its_pending_bound_is_named_with_the_schedulers_reason(tmp_path):
    """Argo deletes a pod Pending past pendingTimeout and its step says "timeout": the scheduler's
    message is left in the pod's events, which the view reads for the run's workflows and jobs."""
    disk = "0/2 nodes are available: 2 Insufficient ephemeral-storage."
    events = [
        event("mass-run-x7k2p-merge-3071", disk),  # the run's workflow's pod, deleted
        event("demo-train-master-0", UNSCHEDULABLE),  # still listed: its row says it already
        event("another-run-abc-merge-1", disk),  # another run's
        event("mass-run-x7k2p-search-9", "pulled", reason="Pulled"),
    ]  # not a scheduling failure
    assert all(schema_errors(e) == [] for e in events)
    v = operator_view(tmp_path, RUN, CRDS + OBJECTS + events, pods=PODS)
    assert v["unscheduled"] == [{"pod": "mass-run-x7k2p-merge-3071", "message": disk}]
    from mass_jobs.cluster.pods import render

    assert f"  mass-run-x7k2p-merge-3071: {disk}" in render(v)


def test_a_trainer_job_deleted_unstarted_is_named_with_its_masters_scheduling_message(tmp_path):
    """The train step deletes a trainer job that never started, pods and all: the view still names
    why, from the Master's events (the job's name is the run's, so they are the run's) and from the
    `scheduler` output the hook kept in the workflow, compressed node map or not."""
    import base64
    import gzip

    from mass_jobs.cluster.pods import render
    from mass_jobs.k8s.training import job_name

    master = f"{job_name(RUN, '0', 'train')}-master-0"
    assert master == "mass-demo-g0-train-master-0"
    node = {
        "id": "mass-run-x7k2p-1",
        "name": "mass-run-x7k2p[1].cycle[3].train(0)[2].job-single.onExit[1].scheduling",
        "displayName": "scheduling",
        "type": "Pod",
        "templateName": "train-scheduling",
        "phase": "Succeeded",
        "outputs": {"parameters": [{"name": "scheduler", "value": UNSCHEDULABLE}]},
    }
    quiet = {**node, "id": "mass-run-x7k2p-2", "outputs": {"parameters": [{"name": "scheduler", "value": ""}]}}
    plain = {**OBJECTS[0], "status": {"phase": "Failed", "nodes": {n["id"]: n for n in (node, quiet)}}}
    packed = base64.b64encode(gzip.compress(json.dumps({node["id"]: node}).encode())).decode()
    compressed = {**OBJECTS[0], "status": {"phase": "Failed", "compressedNodes": packed}}
    for wf in (plain, compressed):
        v = operator_view(tmp_path, RUN, CRDS + [wf] + [event(master, UNSCHEDULABLE)], pods=[])
        assert v["unscheduled"] == [{"pod": master, "message": UNSCHEDULABLE}]
        assert v["unstarted"] == [{"node": node["name"], "message": UNSCHEDULABLE}]
        assert f"  {node['name']}: {UNSCHEDULABLE}" in render(v)
    # another run's trainer pods are not this run's
    v = operator_view(tmp_path, RUN, CRDS + [plain, event("mass-demo2-g0-train-master-0", UNSCHEDULABLE)], pods=[])
    assert v["unscheduled"] == []
