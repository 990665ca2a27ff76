"""kube-scheduler's filtering of a pod onto a node: which nodes would take a pod of this project.

Ported from the default profile's filter plugins, in their order, a node failing at the first:
- TaintToleration: every NoSchedule and NoExecute taint of the node is tolerated (`operator:
  Exists` with or without a key, `Equal` with the value; an empty effect tolerates every effect);
  PreferNoSchedule never filters;
- NodeAffinity: the pod's nodeSelector labels, and its required node affinity (nodeSelectorTerms
  ORed, matchExpressions ANDed: In, NotIn, Exists, DoesNotExist, Gt, Lt);
- NodeResourcesFit: the pod's requests (its containers' requests, else their limits) against the
  node's allocatable less what is bound there: cpu, memory, ephemeral-storage and extended
  resources (a GPU), which a node without them has 0 of.

A pod no node passes is Unschedulable with the filter part of the scheduler's FailedScheduling
message: the nodes counted per reason, sorted as text ("0/2 nodes are available: 1 Insufficient
nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: present}.").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mass_jobs.k8s.pods import quantity

FILTERING = ("NoSchedule", "NoExecute")


@dataclass
class Node:
    name: str
    allocatable: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)

    @classmethod
    def from_api(cls, obj: dict) -> Node:
        """A Node object as the API server returns it."""
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        return cls(
            meta.get("name", ""),
            dict(status.get("allocatable") or {}),
            dict(meta.get("labels") or {}),
            list(spec.get("taints") or []),
        )

    @property
    def schedulable(self) -> bool:
        """Cordoned nodes carry the node.kubernetes.io/unschedulable taint (the API adds it)."""
        return not any(t.get("key") == "node.kubernetes.io/unschedulable" for t in self.taints)


def pod_requests(pod_spec: dict) -> dict[str, float]:
    """The pod's requests: each container's requests (its limits where it sets none), summed; an init
    container runs alone, so the pod needs the larger of the sum and any one of them."""

    def asked(c: dict) -> dict[str, str]:
        res = c.get("resources") or {}
        return res.get("requests") or res.get("limits") or {}

    total: Counter = Counter()
    for c in pod_spec.get("containers", []):
        for r, q in asked(c).items():
            total[r] += quantity(q)
    for c in pod_spec.get("initContainers") or []:
        for r, q in asked(c).items():
            total[r] = max(total[r], quantity(q))
    return dict(total)


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t["key"] == taint["key"]:
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def untolerated(node: Node, tolerations: list[dict]) -> list[dict]:
    """The node's filtering taints the pod does not tolerate."""
    return [t for t in node.taints if t.get("effect") in FILTERING and not tolerates(tolerations, t)]


def _matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels:
            return False
        have, bound = int(labels[key]), int(values[0])
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"node selector operator {op!r}")


def affinity_ok(pod_spec: dict, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    return any(
        all(_matches(e, labels) for e in term.get("matchExpressions") or [])
        for term in required.get("nodeSelectorTerms") or []
    )


def taint_text(taint: dict) -> str:
    return f"{{{taint['key']}: {taint.get('value', '')}}}"


def why_not(node: Node, pod_spec: dict, asked: dict[str, float], used: Counter | None = None) -> list[str]:
    """The scheduler's reasons this node does not take the pod (empty: it does), first filter first."""
    for taint in untolerated(node, pod_spec.get("tolerations") or []):
        return [f"node(s) had untolerated taint {taint_text(taint)}"]
    if not affinity_ok(pod_spec, node.labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    used = used or Counter()
    return [
        f"Insufficient {r}"
        for r, q in sorted(asked.items())
        if q > quantity(node.allocatable.get(r, 0)) - used[r] + 1e-9
    ]


def unschedulable_message(n_nodes: int, reasons: Counter) -> str:
    listed = ", ".join(sorted(f"{n} {r}" for r, n in reasons.items()))  # as FitError sorts them
    return f"0/{n_nodes} nodes are available: {listed}."


def fit(nodes: list[Node], pod_spec: dict) -> tuple[list[str], str]:
    """(the nodes that take the pod when empty, the scheduler's message when none does)."""
    asked, reasons, fitting = pod_requests(pod_spec), Counter(), []
    for node in nodes:
        why = why_not(node, pod_spec, asked)
        if why:
            reasons.update(why)
        else:
            fitting.append(node.name)
    return fitting, "" if fitting else unschedulable_message(len(nodes), reasons)
