"""`mass pods RUN`: an operator's view of a run on the cluster, found by the project's labels.

The run's Workflow (label `mass-jobs.io/run`), then each pod of the run with what its labels say
(step, generation, task, episode) and what its status says: phase, the reason it is not running or
ended (Unschedulable with the scheduler's message, ImagePullBackOff, OOMKilled, Evicted, an exit
code), its node, restarts, age, and the command that shows its logs; then the trainer's PyTorchJobs
and the InferenceServices with their conditions. Argo deletes a succeeded pod 10 minutes after it
ends (the templates' podGC): what ended well is mostly gone, what failed stays.

Custom resources are read as plain objects (CustomObjectsApi's paths), not through the `kserve`
package: its client wraps the same calls, pins a serving framework the view does not need, and
knows InferenceService alone of the four controllers' kinds read here.
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from mass_jobs.cluster.api import Cluster, Forbidden
from mass_jobs.k8s import labels as L
from mass_jobs.k8s import training

# the container whose logs are the pod's: Argo's step, the training operator's, KServe's
MAIN_CONTAINERS = ("main", "pytorch", "kserve-container")


@dataclass
class PodRow:
    name: str
    step: str
    generation: str
    task: str
    episode: str
    phase: str
    reason: str
    node: str
    restarts: int
    age_s: int
    logs: str


@dataclass
class ObjectRow:
    kind: str
    name: str
    generation: str
    conditions: str


def _age(stamp: str | None, now: float) -> int:
    if not stamp:
        return 0
    then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    return max(0, int(now - then))


def reason(pod: dict) -> str:
    """Why the pod is not running as it should, or how it ended ("" for a healthy running pod):
    the pod's own reason (Evicted), the scheduler's condition, then each container's state."""
    status = pod.get("status") or {}
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message', '')}".rstrip(": ")
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason', 'Unschedulable')}: {c.get('message', '')}".rstrip(": ")
    containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return f"{waiting['reason']} ({c['name']}): {waiting.get('message', '')}".rstrip(": ")
    for c in containers:
        ended = (c.get("state") or {}).get("terminated")
        if ended and ended.get("exitCode", 0) != 0:
            return f"{ended.get('reason') or 'Error'} ({c['name']}, exit code {ended.get('exitCode')})"
        before = (c.get("lastState") or {}).get("terminated")
        if before and before.get("exitCode", 0) != 0:
            return (
                f"restarted after {before.get('reason') or 'Error'} ({c['name']}, exit code {before.get('exitCode')})"
            )
    return ""


def pod_row(pod: dict, now: float) -> PodRow:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    names = [c.get("name") for c in spec.get("containers") or []]
    container = next((n for n in MAIN_CONTAINERS if n in names), names[0] if names else "")
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    return PodRow(
        meta.get("name", ""),
        labels.get(L.STEP, ""),
        labels.get(L.GENERATION, ""),
        labels.get(L.TASK, ""),
        labels.get(L.EPISODE, ""),
        status.get("phase", ""),
        reason(pod),
        spec.get("nodeName", ""),
        restarts,
        _age(meta.get("creationTimestamp"), now),
        f"kubectl logs -n {meta.get('namespace', '')} {meta.get('name', '')} -c {container}",
    )


def _conditions(obj: dict) -> str:
    found = [
        f"{c['type']}={c.get('status', '')}"
        + (
            f" ({c['reason']}: {c.get('message', '')})".rstrip(": )") + ")"
            if c.get("status") != "True" and c.get("reason")
            else ""
        )
        for c in (obj.get("status") or {}).get("conditions") or []
    ]
    return ", ".join(found) or "no conditions yet"


def view(cluster: Cluster, run: str) -> dict:
    """The run's Workflows, pods, trainer jobs and InferenceServices, as rows."""
    ns, selector, now = cluster.namespace, f"{L.RUN}={run}", time.time()
    unread: list[str] = []

    def items(path: str, what: str, fields: str | None = None) -> list[dict]:
        try:
            return cluster.items(path, field_selector=fields) if fields else cluster.items(path, selector)
        except Forbidden as err:  # shown, and the rest of the view still drawn
            unread.append(f"{what}: {err}")
            return []

    workflows = items(f"/apis/argoproj.io/v1alpha1/namespaces/{ns}/workflows", "workflows")
    pods = items(f"/api/v1/namespaces/{ns}/pods", "pods")
    jobs = items(f"/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs", "pytorchjobs")
    services = items(f"/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices", "inferenceservices")
    rows = sorted((pod_row(p, now) for p in pods), key=lambda r: (r.generation, r.step, r.task, r.episode, r.name))
    # Argo deletes a pod Pending past its pendingTimeout (the step says only "timeout"), and the train
    # step a trainer job that never started (with its pods), so the scheduler's reason survives in
    # their events alone (kept an hour by default); the jobs are known by the run's job names
    owners = tuple(o["metadata"]["name"] + "-" for o in workflows + jobs + services)
    owners += (training.job_prefix(run),) if owners else ()
    events = items(f"/api/v1/namespaces/{ns}/events", "events", "reason=FailedScheduling") if owners else []
    labels = [
        (o["kind"], o["metadata"]["name"], (o["metadata"].get("labels") or {}).get(L.GENERATION, ""), o)
        for o in jobs + services
    ]
    return {
        "namespace": ns,
        "run": run,
        "workflows": [_workflow_row(w) for w in workflows],
        "pods": [asdict(r) for r in rows],
        "objects": [asdict(ObjectRow(kind, name, gen, _conditions(o))) for kind, name, gen, o in labels],
        "unread": unread,
        "unscheduled": _unscheduled(events, owners, {r.name for r in rows}),
        "unstarted": unstarted_trainers(workflows),
    }


def _workflow_row(w: dict) -> dict:
    status = w.get("status") or {}
    return {
        "name": w["metadata"]["name"],
        "phase": status.get("phase", "Pending"),
        "message": status.get("message", ""),
    }


def _unscheduled(events: list[dict], owners: tuple[str, ...], listed: set[str]) -> list[dict]:
    """The pods of the run's objects that are gone (not listed) with the scheduler's last word."""
    gone = [
        e
        for e in events
        if (e.get("involvedObject") or {}).get("name", "").startswith(owners)
        and e["involvedObject"]["name"] not in listed
    ]
    unscheduled = sorted({e["involvedObject"]["name"]: e.get("message", "") for e in gone}.items())
    return [{"pod": n, "message": m} for n, m in unscheduled]


def workflow_nodes(wf: dict) -> list[dict]:
    """A Workflow's nodes, also where the controller compressed them (`status.compressedNodes`:
    the node map as JSON, gzip, then base64, once the object nears etcd's limit)."""
    status = wf.get("status") or {}
    if status.get("nodes"):
        return list(status["nodes"].values())
    if status.get("compressedNodes"):
        return list(json.loads(gzip.decompress(base64.b64decode(status["compressedNodes"]))).values())
    return []


def unstarted_trainers(workflows: list[dict]) -> list[dict]:
    """The train steps' record of each trainer job deleted unstarted: the Master's scheduling
    message, read by the `train-unstarted` hook before the job went (its `scheduler` output)."""
    return [
        {"node": n.get("name", ""), "message": p["value"]}
        for w in workflows
        for n in workflow_nodes(w)
        for p in (n.get("outputs") or {}).get("parameters") or []
        if p.get("name") == "scheduler" and p.get("value")
    ]


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h" if seconds < 172800 else f"{seconds // 86400}d"


def _table(header: tuple, rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def render(v: dict) -> str:
    lines = [f"run {v['run']} in namespace {v['namespace']}"]
    if not v["workflows"]:
        lines.append("no Workflow of this run here (label mass-jobs.io/run); argo submit ... -p run=<name> starts one")
    for w in v["workflows"]:
        lines.append(f"workflow {w['name']}: {w['phase']}" + (f" ({w['message']})" if w["message"] else ""))
    lines.append("")
    if v["pods"]:
        header = ("POD", "STEP", "GEN", "TASK", "EPISODE", "PHASE", "NODE", "RESTARTS", "AGE")
        rows = [
            (
                p["name"],
                p["step"],
                p["generation"],
                p["task"] or "-",
                p["episode"] or "-",
                p["phase"],
                p["node"] or "-",
                p["restarts"],
                _duration(p["age_s"]),
            )
            for p in v["pods"]
        ]
        lines += _table(header, rows)
        trouble = [p for p in v["pods"] if p["reason"]]
        if trouble:
            lines += ["", "why:"] + [f"  {p['name']}: {p['reason']}" for p in trouble]
        lines += ["", "logs:"] + [f"  {p['logs']}" for p in v["pods"] if p["reason"] or p["phase"] == "Running"][:20]
    else:
        lines.append("no pods of this run (succeeded pods are deleted 10 minutes after they end)")
    if v.get("unscheduled"):
        lines += [
            "",
            'pods deleted while Pending (their steps say "timeout" or "deadline"), the scheduler\'s last word:',
        ]
        lines += [f"  {u['pod']}: {u['message']}" for u in v["unscheduled"]]
    if v.get("unstarted"):
        lines += ["", "trainer jobs deleted unstarted, their Master's scheduling message:"]
        lines += [f"  {u['node']}: {u['message']}" for u in v["unstarted"]]
    if v.get("unread"):
        lines += ["", "not read (this account may not):"] + [f"  {u}" for u in v["unread"]]
    if v["objects"]:
        lines += [""] + _table(
            ("KIND", "NAME", "GEN", "CONDITIONS"),
            [(o["kind"], o["name"], o["generation"], o["conditions"]) for o in v["objects"]],
        )
    return "\n".join(lines)
