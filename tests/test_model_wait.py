"""The serve step's wait (mass_jobs/cluster/model_wait.py): a model served, or why it never will be,
read from the InferenceService and its predictor's pods; through the real Kubernetes client, as the
chart's serve-wait account, against the recorded-API server."""

from __future__ import annotations

import pytest

from mass_jobs.cluster.api import Cluster
from mass_jobs.cluster.model_wait import ModelNotServed, held, look, wait
from mass_jobs.k8s import manifests
from mass_jobs.k8s.settings import ClusterSettings
from tests.fixtures.kube_api import RecordedApi
from tests.fixtures.kube_recordings import crd, meta

NS, NAME = "mass", "mass-demo-g1"
UNSCHEDULABLE = (
    "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: present}."
)


def pod(name: str, phase: str = "Pending", scheduled: dict | None = None, waiting: str = "", uid: str = "") -> dict:
    status = {"phase": phase, "conditions": [{"type": "PodScheduled", **(scheduled or {"status": "True"})}]}
    if waiting:
        status["containerStatuses"] = [
            {"name": "kserve-container", "state": {"waiting": {"reason": waiting, "message": "pull access denied"}}}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **meta(name, NS, labels={"serving.kserve.io/inferenceservice": NAME, "component": "predictor"}),
            "uid": uid or name,
        },
        "status": status,
    }


def isvc(state: str = "Pending", transition: str = "InProgress", failure: dict | None = None) -> dict:
    model = {"transitionStatus": transition, "states": {"activeModelState": "", "targetModelState": state}}
    if failure:
        model["lastFailureInfo"] = failure
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": meta(NAME, NS),
        "spec": {},
        "status": {"modelStatus": model},
    }


UNSCHED = {"status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}


@pytest.mark.unit
def test_a_pod_is_held_while_unscheduled_queued_or_its_image_does_not_pull_not_while_it_loads():
    assert held(pod("p", scheduled=UNSCHED)) == f"Unschedulable: {UNSCHEDULABLE}"
    gated = {
        "status": "False",
        "reason": "SchedulingGated",
        "message": "Scheduling is blocked due to non-empty scheduling gates",
    }
    assert held(pod("p", scheduled=gated)).startswith("SchedulingGated: Scheduling is blocked")
    assert held(pod("p", waiting="ImagePullBackOff")) == "ImagePullBackOff (kserve-container): pull access denied"
    # scheduled and loading (the storage initializer, vLLM reading weights): the ready deadline's business
    assert held(pod("p")) == "" and held(pod("p", phase="Running")) == ""
    assert held(pod("p", waiting="ContainerCreating")) == ""
    no_condition = pod("p")
    no_condition["status"]["conditions"] = []
    assert held(no_condition) == "not scheduled yet"


@pytest.mark.unit
def test_a_held_pod_fails_the_wait_at_the_pending_bound_naming_the_schedulers_message():
    since: dict = {}
    unscheduled = [pod("p-1", scheduled=UNSCHED)]
    assert look(NAME, isvc(), unscheduled, since, 100.0, 900).waiting == f"pod p-1: Unschedulable: {UNSCHEDULABLE}"
    assert look(NAME, isvc(), unscheduled, since, 999.0, 900).failure == ""
    failed = look(NAME, isvc(), unscheduled, since, 1000.0, 900)
    assert (
        failed.failure
        == f"predictor pod p-1 held for 900 s (the pending bound is 900 s): Unschedulable: {UNSCHEDULABLE}"
    )
    # no bound (scheduling.pendingTimeoutSeconds: 0): it only waits
    assert look(NAME, isvc(), unscheduled, {}, 10**6, 0).failure == ""


@pytest.mark.unit
def test_a_pod_that_got_scheduled_starts_its_count_again_if_held_again():
    since: dict = {}
    look(NAME, isvc(), [pod("p-1", scheduled=UNSCHED)], since, 0.0, 900)
    assert look(NAME, isvc(), [pod("p-1")], since, 800.0, 900).waiting == "model Pending (1 predictor pod)"
    assert since == {}
    # its replacement (a new uid), held from 850 on
    look(NAME, isvc(), [pod("p-2", scheduled=UNSCHED)], since, 850.0, 900)
    assert look(NAME, isvc(), [pod("p-2", scheduled=UNSCHED)], since, 1700.0, 900).failure == ""
    assert "held for 900 s" in look(NAME, isvc(), [pod("p-2", scheduled=UNSCHED)], since, 1750.0, 900).failure


@pytest.mark.unit
def test_loaded_ends_the_wait_and_a_failed_load_fails_it_with_kserves_reason():
    assert look(NAME, isvc("Loaded", "UpToDate"), [pod("p", phase="Running")], {}, 0.0, 900).done
    failure = {"reason": "ModelLoadFailed", "message": "no such key: gen-1/model"}
    failed = look(NAME, isvc("FailedToLoad", "BlockedByFailedLoad", failure), [], {}, 0.0, 900)
    assert failed.failure == f"InferenceService {NAME}: BlockedByFailedLoad: ModelLoadFailed: no such key: gen-1/model"
    # UpToDate before any load is KServe's default, not a verdict
    assert not look(NAME, isvc("Pending", "UpToDate"), [], {}, 0.0, 900).done
    assert look(NAME, None, [], {}, 0.0, 900).waiting == f"InferenceService {NAME} not found yet"


class Timeline:
    """The cluster as the wait polls it: what it holds changes with a fake clock the wait's sleep moves."""

    def __init__(self, steps: list[tuple[float, dict, list[dict]]]):
        self.now, self.steps = 0.0, steps

    def objects(self) -> list[dict]:
        _, service, pods = [s for s in self.steps if s[0] <= self.now][-1]
        return [service, *pods]

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _served(timeline: Timeline, account: str = manifests.SERVE_WAIT_SA, rbac: bool = True):
    """An API server holding the chart's Roles and bindings and the timeline's objects, and a client
    that reads it with `account`'s token."""
    s = ClusterSettings(namespace=NS)
    roles = [dict(o, metadata={**o["metadata"], "namespace": NS}) for o in manifests.rbac(s)] if rbac else []
    kserve = crd("serving.kserve.io", "InferenceService", "inferenceservices", {"v1beta1": {"type": "object"}})
    tokens = {"token": (f"system:serviceaccount:{NS}:{account}", [])}
    return RecordedApi([kserve, *roles], tokens=tokens, live=timeline.objects)


def _wait(api, tmp_path, timeline, pending_s=900, ready_s=3600):
    said = []
    cluster = Cluster.connect(str(api.kubeconfig(tmp_path / "kubeconfig", namespace=NS, token="token")))
    try:
        wait(
            cluster,
            NAME,
            pending_s,
            ready_s,
            poll_s=60,
            clock=lambda: timeline.now,
            sleep=timeline.sleep,
            say=lambda line, **_: said.append(line),
        )
    finally:
        cluster.client.close()
    return said


def test_the_wait_account_reads_a_predictor_that_never_schedules_and_fails_at_the_bound(tmp_path):
    timeline = Timeline([(0, isvc(), []), (60, isvc(), [pod("p-1", scheduled=UNSCHED)])])
    with _served(timeline) as api, pytest.raises(ModelNotServed) as err:
        _wait(api, tmp_path, timeline)
    assert (
        str(err.value)
        == f"predictor pod p-1 held for 900 s (the pending bound is 900 s): Unschedulable: {UNSCHEDULABLE}"
    )
    assert timeline.now == 960  # seen held at 60 s, failed at 960 s: not the ready deadline's 3600 s
    assert {(m, p.split("?")[0]) for _, m, p in api.requests} == {
        ("GET", f"/apis/serving.kserve.io/v1beta1/namespaces/{NS}/inferenceservices/{NAME}"),
        ("GET", f"/api/v1/namespaces/{NS}/pods"),
    }


def test_a_model_that_loads_ends_the_wait_with_its_progress_said_once_per_change(tmp_path):
    timeline = Timeline(
        [
            (0, isvc(), [pod("p-1", scheduled=UNSCHED)]),
            (120, isvc("Loading"), [pod("p-1")]),
            (600, isvc("Loaded", "UpToDate"), [pod("p-1", phase="Running")]),
        ]
    )
    with _served(timeline) as api:
        said = _wait(api, tmp_path, timeline)
    assert said == [
        f"{NAME}: 0 s: pod p-1: Unschedulable: {UNSCHEDULABLE}",
        f"{NAME}: 120 s: model Loading (1 predictor pod)",
        f"{NAME}: served after 600 s",
    ]


def test_a_model_still_loading_at_the_ready_deadline_fails_saying_what_it_waited_for(tmp_path):
    timeline = Timeline([(0, isvc("Loading"), [pod("p-1", phase="Running")])])
    with _served(timeline) as api, pytest.raises(ModelNotServed) as err:
        _wait(api, tmp_path, timeline, ready_s=1800)
    assert str(err.value) == (
        f"InferenceService {NAME} not served within 1800 s (model.readyDeadlineSeconds): "
        f"model Loading (1 predictor pod)"
    )


def test_an_account_without_its_binding_fails_at_once_naming_the_refusal(tmp_path):
    timeline = Timeline([(0, isvc(), [])])
    with _served(timeline, account="default") as api, pytest.raises(ModelNotServed) as err:
        _wait(api, tmp_path, timeline)
    assert timeline.now == 0 and "may not read what the wait needs" in str(err.value)
    assert 'User "system:serviceaccount:mass:default" cannot get resource "inferenceservices"' in str(err.value)


def test_the_command_exits_2_with_the_reason_as_its_last_line(tmp_path, capsys):
    from mass_jobs.commands.cli import main

    timeline = Timeline(
        [
            (
                0,
                isvc(
                    "FailedToLoad", "BlockedByFailedLoad", {"reason": "ModelLoadFailed", "message": "weights missing"}
                ),
                [],
            )
        ]
    )
    with _served(timeline) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig", namespace=NS, token="token"))
        assert main(["serve-wait", NAME, "--kubeconfig", kubeconfig, "--poll", "0.01"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"mass serve-wait: InferenceService {NAME}: BlockedByFailedLoad: ModelLoadFailed: weights missing"
