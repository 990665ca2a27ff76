"""The run's egress proxy on a cluster: a Deployment and a Service per cycle, owned by the workflow.

A daemon step's pod is never restarted, and the steps after it hold its IP: a proxy that died
mid-cycle (OOM, eviction, a lost node) left every later network episode of the cycle to fail its
pod attempts and end infra_error. As a one-replica Deployment the proxy comes back, and the agent
pods reach it by the Service's name, which does not change. An episode running while it restarts
loses part of its record, which its harness sees (the proxy's `boot` changed) and ends infra_error;
the episodes after it are whole. The cycle creates both before its first step and deletes them
after its last; its exit handler deletes them too, and as the workflow's objects they go with it.
"""

from __future__ import annotations

from mass_jobs.k8s import labels as L
from mass_jobs.k8s import pods
from mass_jobs.k8s.argo_vocab import GEN, NAMESPACE, SPEC
from mass_jobs.k8s.manifests import EGRESS_PORT, EGRESS_STEP, WORKFLOW_SA
from mass_jobs.k8s.settings import ClusterSettings

# One per workflow and generation (a generation's cycle runs once per workflow): a DNS label of at
# most 47 characters, whatever the workflow's name.
NAME = "egress-{{workflow.uid}}-" + GEN
SELECT = f"{L.PREFIX}/egress-proxy"  # the Service selects the Deployment's pod by its name alone
READY_S = "1800"  # the proxy's pod ready within this (scheduled, pulled, the spec read) or the cycle fails
READY = "status.readyReplicas > 0"


def host(s: ClusterSettings) -> str:
    """The Service's name as the agent pods resolve it (their --egress-proxy host)."""
    return f"{NAME}.{NAMESPACE}.svc.{s.cluster_domain}"


def deployment(s: ClusterSettings, env: list[dict]) -> dict:
    """`mass egress-serve` on its pod IP (the Service's endpoint): the spec's allow-list and the
    rollouts' keys are read from the store, so a restarted pod serves the same rollouts."""
    pod_labels = {**L.pod_labels(EGRESS_STEP, gen=GEN), SELECT: NAME}
    container = {
        "name": "proxy",
        "image": s.images.jobs,
        "imagePullPolicy": s.images.pull_policy,
        "command": ["mass"],
        "args": ["egress-serve", SPEC, "--listen", f":{EGRESS_PORT}"],
        "workingDir": "/tmp",
        "env": [*env, {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "envFrom": [{"secretRef": {"name": s.s3_secret}}],
        "ports": [{"name": "proxy", "containerPort": EGRESS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "proxy"}, "periodSeconds": 2, "failureThreshold": 3},
        # a proxy that stops answering (not only one that exits) is restarted
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "proxy"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": pods.resources(s.step, s),
        "securityContext": pods.container_security_context(),
        "volumeMounts": pods.mounts(tmp="/tmp"),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "labels": L.pod_labels(EGRESS_STEP, gen=GEN)},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two proxies: a rollout's record is in one
            "selector": {"matchLabels": {SELECT: NAME}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": WORKFLOW_SA,
                    "automountServiceAccountToken": False,
                    **pods.placement(s, "egress"),
                    "securityContext": pods.pod_security_context(),
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def service(s: ClusterSettings) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "labels": L.pod_labels(EGRESS_STEP, gen=GEN)},
        "spec": {
            "selector": {SELECT: NAME},
            "ports": [{"name": "proxy", "port": EGRESS_PORT, "targetPort": "proxy", "protocol": "TCP"}],
        },
    }
