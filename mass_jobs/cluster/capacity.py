"""What the cluster can hold of a run, for `mass validate --cluster` (mass_jobs/cluster/preflight.py):
Kueue's queue (present, covering every resource the queued workloads request, with GPU quota for
the largest of them, its PyTorchJob integration on), the nodes that would take each class of pods
(kube-scheduler's filters against the pods as rendered here) and the StorageClass of each scratch
volume. Each class's pod is built by the same code that renders it for the cluster.
"""

from __future__ import annotations

import yaml

from mass_jobs.cluster.api import Cluster, Forbidden
from mass_jobs.cluster.scheduling import Node, affinity_ok, fit, pod_requests, untolerated, why_not
from mass_jobs.k8s import pods, serving, training
from mass_jobs.k8s.preflight import Check
from mass_jobs.k8s.settings import SCRATCH_CLASSES, ClusterSettings

KUEUE_CONFIG = ("kueue-system", "kueue-manager-config")
KUEUE_PYTORCHJOB = "kubeflow.org/pytorchjob"


def unread(name: str, what: str, err: Forbidden) -> Check:
    """A read the cluster refused this account: a note saying what was not checked, never a pass."""
    return Check(
        name,
        "not read",
        what,
        True,
        "the account's RBAC (or check it by hand)",
        advice=f"could not read {what}: {err}; not checked",
    )


def served_versions(cluster: Cluster, group: str, plural: str, seen: dict | None = None) -> list[str]:
    """The versions of a group that serve `plural`, from discovery (which every authenticated account
    may read, and small: a CRD object holds its whole schema, megabytes for Argo's)."""
    seen = {} if seen is None else seen

    def read(path: str) -> dict:
        if path not in seen:
            seen[path] = cluster.get(path) or {}
        return seen[path]

    versions = [v["version"] for v in read(f"/apis/{group}").get("versions") or []]
    return [
        v for v in versions if any(r.get("name") == plural for r in read(f"/apis/{group}/{v}").get("resources") or [])
    ]


# -- Kueue --------------------------------------------------------------------------------------------


def _kueue_version(cluster: Cluster) -> str | None:
    served = served_versions(cluster, "kueue.x-k8s.io", "clusterqueues")
    return next((v for v in ("v1beta2", "v1beta1") if v in served), None)


def _coverage_check(cq: dict, cq_name: str, workloads: dict) -> Check:
    """Every resource a queued pod requests is one the clusterqueue covers (else Kueue admits none)."""
    covered = {r for g in cq["spec"].get("resourceGroups") or [] for r in g.get("coveredResources") or []}
    asked = sorted({r for p in workloads.values() for r, q in pod_requests(p).items() if q > 0})
    uncovered = [r for r in asked if r not in covered]
    return Check(
        "Kueue covered resources",
        ", ".join(sorted(covered)) or "none",
        ", ".join(asked),
        not uncovered,
        f"clusterqueue {cq_name} spec.resourceGroups[].coveredResources",
        f"clusterqueue {cq_name} does not cover {', '.join(uncovered)}, which every queued pod here "
        f'requests: Kueue admits none of them ("resource ... unavailable in ClusterQueue"); add '
        f"{', '.join(uncovered)} to a resource group with a quota",
    )


def _gpu_quota(cq: dict, gpu: str) -> float:
    """The largest nominal quota of `gpu` among the clusterqueue's resource groups."""
    groups = cq["spec"].get("resourceGroups") or []
    return max(
        (
            sum(
                pods.quantity(r.get("nominalQuota", 0))
                for f in g.get("flavors") or []
                for r in f.get("resources") or []
                if r.get("name") == gpu
            )
            for g in groups
        ),
        default=0.0,
    )


def queue_checks(cluster: Cluster, spec, s: ClusterSettings) -> list[Check]:
    if not s.kueue_queue:
        return []
    version = _kueue_version(cluster)
    if version is None:
        return []  # said by api_checks
    ns, found = cluster.namespace, []
    try:
        lq = cluster.get(f"/apis/kueue.x-k8s.io/{version}/namespaces/{ns}/localqueues/{s.kueue_queue}")
        cq_name = ((lq or {}).get("spec") or {}).get("clusterQueue")
        cq = cluster.get(f"/apis/kueue.x-k8s.io/{version}/clusterqueues/{cq_name}") if cq_name else None
    except Forbidden as err:
        return [unread("Kueue queue", f"localqueue {s.kueue_queue} and its clusterqueue", err)]
    if lq is None or cq is None:
        what = f"localqueue {s.kueue_queue} in {ns}" if lq is None else f"clusterqueue {cq_name}"
        return [
            Check(
                "Kueue queue",
                "missing",
                "present",
                False,
                "values kueue.queueName",
                f"{what} does not exist: every trainer job and predictor waits unadmitted until its "
                f"deadline; create it or set kueue.queueName",
            )
        ]
    workloads = {"trainer": trainer_pod(spec, s), "server": predictor_pod(s)}
    if s.kueue_pods:
        workloads.update({c: p for c, p in class_pods(spec, s).items() if c in ("step", "agent", "merge")})
    found.append(_coverage_check(cq, cq_name, workloads))
    gpu = s.gpu_resource
    quota = _gpu_quota(cq, gpu)
    # one predictor at a time (the cycle's, or one of evaluate's rounds), never beside the trainer
    trainer = pod_requests(workloads["trainer"]).get(gpu, 0) * spec.sft.replicas
    served = pod_requests(workloads["server"]).get(gpu, 0)
    if max(trainer, served):
        found.append(
            Check(
                "Kueue GPU quota",
                f"{quota:g}",
                f">= {max(trainer, served):g}",
                quota >= max(trainer, served),
                f"clusterqueue {cq_name} nominalQuota of {gpu}",
                f"clusterqueue {cq_name} has {quota:g} {gpu} of quota; the trainer job asks {trainer:g} and "
                f"a predictor {served:g}: Kueue never admits what exceeds the quota",
            )
        )
    return [*found, *_integration_checks(cluster)]


def _integration_checks(cluster: Cluster) -> list[Check]:
    """Kueue's PyTorchJob integration: without it a labelled trainer runs outside the queue."""
    found = []
    ns_cfg, name = KUEUE_CONFIG
    try:
        cm = cluster.get(f"/api/v1/namespaces/{ns_cfg}/configmaps/{name}")
    except Forbidden as err:
        found.append(unread("Kueue PyTorchJob integration", f"configmap {ns_cfg}/{name}", err))
    else:
        if cm is not None:
            config = yaml.safe_load((cm.get("data") or {}).get("controller_manager_config.yaml") or "") or {}
            frameworks = (config.get("integrations") or {}).get("frameworks") or []
            ok = KUEUE_PYTORCHJOB in frameworks
            found.append(
                Check(
                    "Kueue PyTorchJob integration",
                    "on" if ok else "off",
                    KUEUE_PYTORCHJOB,
                    ok,
                    f"configmap {ns_cfg}/{name} integrations.frameworks",
                    f"Kueue's integrations.frameworks ({ns_cfg}/{name}) leave out {KUEUE_PYTORCHJOB}: "
                    f"the labelled trainer runs outside the queue's quota; add it and restart Kueue",
                )
            )
    return found


# -- nodes ------------------------------------------------------------------------------------------


def trainer_job(spec, s: ClusterSettings) -> dict:
    workers = spec.sft.replicas - 1
    return training.pytorch_job(
        s,
        "preflight",
        ["mass", "train"],
        {},
        workers=workers or None,
        nproc=str(max(spec.sft.gpus_per_replica, 1)),
        gpus=str(spec.sft.gpus_per_replica),
    )


def trainer_pod(spec, s: ClusterSettings) -> dict:
    return trainer_job(spec, s)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


def predictor(s: ClusterSettings) -> dict:
    return serving.inference_service(s, "preflight", "s3://bucket/model", {})


def predictor_pod(s: ClusterSettings) -> dict:
    p = predictor(s)["spec"]["predictor"]
    return {
        "containers": [p["model"]],
        **{k: v for k, v in p.items() if k in ("tolerations", "nodeSelector", "affinity")},
    }


def class_pods(spec, s: ClusterSettings) -> dict[str, dict]:
    """A pod of each class as it asks to be scheduled: its containers' requests and its placement."""

    def pod(cls: str, *shapes) -> dict:
        return {"containers": [{"resources": pods.resources(p, s)} for p in shapes], **pods.placement(s, cls)}

    return {
        "step": pod("step", s.step),
        "agent": pod("agent", s.agent, s.harness),
        "merge": pod("merge", s.merge),
        "trainer": trainer_pod(spec, s),
        "server": predictor_pod(s),
    }


def _fix(cls: str, nodes: list[Node], pod: dict) -> str:
    """The value to change when no node takes a class's pods: each filter judged on every node on its
    own (the scheduler's message names only the first a node fails), nearest the intended pool first."""
    pool = [n for n in nodes if affinity_ok(pod, n.labels)]
    if not pool:
        return f"values scheduling.{cls}.nodeSelector / affinity"
    if all(untolerated(n, pod.get("tolerations") or []) for n in pool):
        return f"values scheduling.{cls}.tolerations"
    short = sorted(
        {
            r.removeprefix("Insufficient ")
            for n in pool
            for r in why_not(n, {**pod, "tolerations": [{"operator": "Exists"}]}, pod_requests(pod))
        }
    )
    if short == ["ephemeral-storage"]:
        return f"values resources.{cls}.ephemeralStorage" + (
            f" (or scratch.{cls}.size)" if cls in SCRATCH_CLASSES else ""
        )
    return f"values resources.{cls} ({', '.join(short)})" if short else f"values scheduling.{cls}"


def _asked(pod: dict) -> str:
    return ", ".join(
        f"{r} {q:g}" if r in ("cpu",) or "/" in r else f"{r} {q / 2**30:g}Gi"
        for r, q in sorted(pod_requests(pod).items())
        if q
    )


def node_checks(cluster: Cluster, spec, s: ClusterSettings) -> list[Check]:
    try:
        nodes = [Node.from_api(n) for n in cluster.items("/api/v1/nodes")]
    except Forbidden as err:
        return [unread("nodes", "the nodes", err)]
    nodes = [n for n in nodes if n.schedulable]
    found = []
    for cls, pod in class_pods(spec, s).items():
        fitting, message = fit(nodes, pod)
        found.append(
            Check(
                f"nodes for {cls} pods",
                f"{len(fitting)} of {len(nodes)}",
                "at least 1",
                bool(fitting),
                _fix(cls, nodes, pod),
                f"no node takes a {cls} pod ({_asked(pod)}): {message}",
            )
        )
    return found


def storage_checks(cluster: Cluster, s: ClusterSettings) -> list[Check]:
    found = []
    for cls, scratch in sorted(s.scratch.items()):
        if not scratch.size:
            continue
        try:
            if scratch.storage_class:
                ok = cluster.get(f"/apis/storage.k8s.io/v1/storageclasses/{scratch.storage_class}") is not None
                have = scratch.storage_class
            else:
                classes = cluster.items("/apis/storage.k8s.io/v1/storageclasses")
                default = [
                    c["metadata"]["name"]
                    for c in classes
                    if (
                        (c["metadata"].get("annotations") or {}).get("storageclass.kubernetes.io/is-default-class")
                        == "true"
                    )
                ]
                ok, have = bool(default), (default[0] if default else "(the default)")
        except Forbidden as err:
            found.append(unread(f"scratch storage class ({cls})", "storage classes", err))
            continue
        found.append(
            Check(
                f"scratch storage class ({cls})",
                have,
                "exists",
                ok,
                f"values scratch.{cls}.storageClass",
                f"storageclass {have} does not exist: the {cls} pods' scratch volume "
                f"({scratch.size}) is never provisioned and they stay Pending",
            )
        )
    return found
