"""Pod hardening shared by every pod mass-jobs creates (Argo steps, agents, trainers, servers).

Non-root, read-only root filesystem (writable emptyDirs only where named), all capabilities
dropped, seccomp RuntimeDefault, CPU/memory limits on every container.
"""

from __future__ import annotations

import re

from mass_jobs.k8s.settings import ClusterSettings, Pod, helm_block

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?$")
_FACTOR = {
    None: 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 10**-3,
}


def quantity(text) -> float:
    """The value of a Kubernetes quantity: "500m" CPU is 0.5, "64Gi" is bytes, "8" GPUs is 8
    (exponent forms, which the chart never writes, are refused)."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"expected a Kubernetes quantity such as 512Mi or 4Gi, found {text!r}")
    return float(m.group(1)) * _FACTOR[m.group(2)]


def quantity_bytes(text) -> int:
    """Bytes of a Kubernetes memory or storage quantity ("64Gi", "500M")."""
    return int(quantity(text))


UID = 1000
SANDBOX_UID = 2000  # an agent pod's sandbox container: model-written code never runs as UID
QWEN_UID = 3000  # an agent pod's qwen-code container: neither the harness's uid nor its shells'


def pod_security_context() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def sandbox_security_context() -> dict:
    """The sandbox container of an agent pod: the restricted profile, as a uid and group of its own
    (the pod's fsGroup stays a supplementary group: the socket volume is shared through it)."""
    return {**container_security_context(), "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID}


def qwen_security_context() -> dict:
    """The qwen-code container of an agent pod: the restricted profile as a third uid, so the
    sandbox's shell commands can read neither its environment (the proxy token) nor its pipes."""
    return {**container_security_context(), "runAsUser": QWEN_UID, "runAsGroup": QWEN_UID}


# KServe's storage initializer, as the ClusterStorageContainer patch sets it (KServe's defaults:
# 100m/100Mi requested, 1 CPU and 1Gi at most): room for the S3 transfer's parallel parts and the
# page cache of a model of tens of GB. An init container: the predictor's requests stay the larger.
STORAGE_INITIALIZER_RESOURCES = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}


def executor_security_context() -> dict:
    """Containers that controllers add to our pods (Argo's init and wait containers, the training
    operator's Worker init container, KServe's storage initializer): set in each controller's
    config, which no object of ours can. No runAsUser: the pod's (or the image's) applies, so Argo's
    wait container reads the main container's outputs as the same user."""
    return {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def resources(pod: Pod, settings: ClusterSettings) -> dict:
    """Requests equal limits (Guaranteed QoS); GPUs only where the pod asks for them."""
    amounts = {"cpu": pod.cpu, "memory": pod.memory, "ephemeral-storage": pod.ephemeral}
    if pod.gpu.startswith("@helm-block("):  # the chart's line, rendered only for a count above 0
        amounts[pod.gpu] = ""
    elif pod.gpu != "0":
        amounts[settings.gpu_resource] = pod.gpu
    return {"limits": dict(amounts), "requests": dict(amounts)}


def mounts(**paths: str) -> list[dict]:
    """mounts(tmp="/tmp") -> volumeMounts; keyword = volume name."""
    return [{"name": n, "mountPath": p} for n, p in paths.items()]


def placement(s: ClusterSettings, cls: str) -> dict:
    """The scheduling fields of a class of pods (nodeSelector, tolerations, affinity,
    priorityClassName), only those set; in the chart a block of `scheduling.<cls>`."""
    if s.chart:
        return {helm_block(f'include "mass-jobs.placement" .Values.scheduling.{cls}'): ""}
    p = s.scheduling[cls]
    fields = {
        "nodeSelector": dict(p.node_selector),
        "tolerations": [dict(t) for t in p.tolerations],
        "affinity": dict(p.affinity),
        "priorityClassName": p.priority_class,
    }
    return {k: v for k, v in fields.items() if v}


def scratch_volume(s: ClusterSettings, cls: str, name: str = "tmp") -> dict:
    """The volume a class's /tmp is (values `scratch.<cls>`): an emptyDir on the node's disk, or,
    with a size, a generic ephemeral volume, a PVC made with the pod and deleted with it, so that
    a model of tens of GB needs no node disk that large."""
    if s.chart:
        return {"name": name, helm_block(f'include "mass-jobs.scratch" .Values.scratch.{cls}'): ""}
    scratch = s.scratch.get(cls)
    if scratch is None or not scratch.size:
        return {"name": name, "emptyDir": {}}
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": scratch.size}}}
    if scratch.storage_class:
        claim["storageClassName"] = scratch.storage_class
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": claim}}}


def pull_secrets(s: ClusterSettings) -> dict:
    """`imagePullSecrets` of a ServiceAccount: the pods using it pull with them (values imagePullSecrets)."""
    if s.chart:
        return {helm_block('include "mass-jobs.pullSecrets" .'): ""}
    return {"imagePullSecrets": [{"name": n} for n in s.image_pull_secrets]} if s.image_pull_secrets else {}
