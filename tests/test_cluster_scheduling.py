"""kube-scheduler's filters as ported (mass_jobs/cluster/scheduling.py): what `mass validate --cluster`
reads real nodes with and the test executor binds its pods with."""

from __future__ import annotations

import pytest

from mass_jobs.cluster.scheduling import Node, affinity_ok, fit, pod_requests, tolerates

pytestmark = pytest.mark.unit

GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "toleration, tolerated",
    [
        ({"operator": "Exists"}, True),  # no key: every taint
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "nvidia.com/gpu", "value": "present"}, True),  # Equal by default
        ({"key": "nvidia.com/gpu", "value": "true"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_toleration_matches_key_value_and_effect(toleration, tolerated):
    assert tolerates([toleration], GPU) is tolerated


def test_node_affinity_terms_are_ored_and_expressions_anded():
    labels = {"zone": "a", "gpus": "8", "pool": "gpu"}

    def term(*exprs) -> dict:
        return {"matchExpressions": list(exprs)}

    def pod(*terms) -> dict:
        required = {"nodeSelectorTerms": list(terms)}
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}}

    assert affinity_ok(
        pod(
            term(
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "gpus", "operator": "Gt", "values": ["4"]},
            )
        ),
        labels,
    )
    assert not affinity_ok(
        pod(term({"key": "zone", "operator": "In", "values": ["a"]}, {"key": "spot", "operator": "Exists"})), labels
    )
    assert affinity_ok(
        pod(term({"key": "spot", "operator": "Exists"}), term({"key": "pool", "operator": "NotIn", "values": ["cpu"]})),
        labels,
    )
    assert not affinity_ok({"nodeSelector": {"pool": "cpu"}}, labels)


def test_requests_sum_the_containers_and_an_init_container_counts_alone():
    pod = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}},
        ],  # limits stand for requests
        "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
    }
    assert pod_requests(pod) == {"cpu": 2.0, "memory": 2 * 2**30}


def test_no_node_gives_the_schedulers_message_counted_and_sorted():
    nodes = [
        Node("cpu-1", {"cpu": "16", "memory": "64Gi", "ephemeral-storage": "100Gi"}),
        Node("cpu-2", {"cpu": "16", "memory": "64Gi", "ephemeral-storage": "100Gi"}),
        Node("gpu-1", {"cpu": "96", "memory": "1Ti", "ephemeral-storage": "1Ti", "nvidia.com/gpu": "8"}, taints=[GPU]),
    ]
    pod = {"containers": [{"resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"}}}]}
    assert fit(nodes, pod) == (
        [],
        "0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: "
        "present}, 2 Insufficient nvidia.com/gpu.",
    )
    assert fit(nodes, {**pod, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}) == (["gpu-1"], "")
    # a node's API object, cordoned: the API server adds the unschedulable taint
    api = {
        "metadata": {"name": "gpu-2", "labels": {"pool": "gpu"}},
        "spec": {"taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "4"}},
    }
    node = Node.from_api(api)
    assert (node.name, node.labels, node.allocatable, node.schedulable) == (
        "gpu-2",
        {"pool": "gpu"},
        {"cpu": "4"},
        False,
    )
