"""The Pod Security Standard "restricted", checked on every pod the generated objects can start.

Pods come from Argo templates (main container from the template; Argo's init and wait
containers, and the main container of resource templates, from the controller's
`executor.securityContext`), from the objects Argo's resource templates create (InferenceService
predictors with KServe's storage initializer, PyTorchJob replicas with the training operator's
Worker init container) and from plain pod templates. The containers controllers add are
`Injected`: what each controller's config makes of them. `restricted_violations` returns one
line per broken rule, naming where the pod is defined and which container breaks it.

Rules (kubernetes.io/docs/concepts/security/pod-security-standards, restricted + baseline):
no hostNetwork/hostPID/hostIPC, only ephemeral or projected volume types (no hostPath), no
hostPort, no privileged container, allowPrivilegeEscalation false, capabilities drop ALL (only
NET_BIND_SERVICE may be added), runAsNonRoot true and runAsUser not 0 (container or pod), seccomp
RuntimeDefault or Localhost (container or pod).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALLOWED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}
ALLOWED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}
ARGO_KINDS = {"Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow"}


@dataclass
class Injected:
    """Containers controllers add to pods, as their configs define them; the defaults are the
    controllers' own (no securityContext at all)."""

    argo_executor: dict = field(default_factory=dict)  # securityContext of Argo's init/wait containers
    pytorch_worker_init: list[dict] = field(default_factory=lambda: [{"name": "init-pytorch"}])  # training operator
    storage_initializer: dict = field(default_factory=dict)  # KServe, predictor pods with a storageUri


@dataclass
class PodDef:
    """One pod as the cluster would build it: where it is defined, pod-level fields, containers."""

    where: str
    pod: dict  # securityContext, hostNetwork, hostPID, hostIPC, volumes
    containers: list[tuple[str, dict]] = field(default_factory=list)  # (role name, container)


def restricted_violations(p: PodDef) -> list[str]:
    out = []
    psc = p.pod.get("securityContext") or {}
    if p.pod.get("podSpecPatch"):
        out.append(f"{p.where}: podSpecPatch can change any field of the pod; not checkable, not allowed")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if p.pod.get(flag):
            out.append(f"{p.where}: {flag} must not be true")
    for v in p.pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUME_TYPES:
            out.append(
                f"{p.where}: volume {v.get('name')!r} is {sorted(kinds - ALLOWED_VOLUME_TYPES)}, "
                f"restricted allows only {sorted(ALLOWED_VOLUME_TYPES)}"
            )
    if psc.get("runAsUser") == 0:
        out.append(f"{p.where}: pod securityContext.runAsUser must not be 0")
    for role, c in p.containers:
        at = f"{p.where} container {role}"
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{at}: privileged must not be true")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{at}: allowPrivilegeEscalation must be false, is {sc.get('allowPrivilegeEscalation')!r}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{at}: capabilities.drop must contain ALL, is {caps.get('drop')!r}")
        added = set(caps.get("add") or []) - ALLOWED_ADDED_CAPABILITIES
        if added:
            out.append(f"{at}: capabilities.add may only hold NET_BIND_SERVICE, has {sorted(added)}")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"{at}: runAsNonRoot must be true (container or pod), is {non_root!r}")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{at}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ALLOWED_SECCOMP:
            out.append(
                f"{at}: seccompProfile.type must be RuntimeDefault or Localhost (container or pod), is {seccomp!r}"
            )
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{at}: hostPort {port['hostPort']} is not allowed")
    return out


def pod_spec_pods(where: str, spec: dict) -> list[PodDef]:
    """A plain PodSpec: init containers, containers and ephemeral containers."""
    containers = [
        (f"{kind}/{c.get('name')}", c)
        for kind in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(kind) or []
    ]
    return [PodDef(where, spec, containers)]


def object_pods(where: str, obj: dict, injected: Injected | None = None, templates: dict | None = None) -> list[PodDef]:
    """Every pod one object can start, with the containers controllers inject; `templates` maps
    WorkflowTemplate names to objects for templateRef and workflowTemplateRef."""
    kind = obj.get("kind")
    name = f"{where} {kind}/{(obj.get('metadata') or {}).get('name')}"
    injected = injected or Injected()
    if kind in ARGO_KINDS:
        return _argo_pods(name, obj, injected.argo_executor, templates or {})
    if kind == "InferenceService":
        pred = obj["spec"]["predictor"]
        spec = {k: v for k, v in pred.items() if k not in ("model",)}
        containers = [c for c in pred.get("containers") or []]
        if "model" in pred:
            containers = [{"name": "kserve-container", **pred["model"]}] + containers
        inits = list(pred.get("initContainers") or [])
        if (pred.get("model") or {}).get("storageUri"):
            inits.append({"name": "storage-initializer", **injected.storage_initializer})
        return pod_spec_pods(f"{name} predictor", {**spec, "initContainers": inits, "containers": containers})
    if kind == "PyTorchJob":
        out = []
        for r, rs in obj["spec"]["pytorchReplicaSpecs"].items():
            spec = dict(rs["template"]["spec"])
            if r == "Worker" and "Master" in obj["spec"]["pytorchReplicaSpecs"]:
                spec["initContainers"] = list(spec.get("initContainers") or []) + injected.pytorch_worker_init
            out += pod_spec_pods(f"{name} {r}", spec)
        return out
    if kind in ("Pod",):
        return pod_spec_pods(name, obj["spec"])
    if kind in ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        return pod_spec_pods(name, obj["spec"]["template"]["spec"])
    if kind == "CronJob":
        return pod_spec_pods(name, obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return []


def _argo_pods(name: str, obj: dict, executor_sc: dict | None, templates: dict) -> list[PodDef]:
    spec = obj["spec"].get("workflowSpec", obj["spec"]) if obj["kind"] == "CronWorkflow" else obj["spec"]
    ref = (spec.get("workflowTemplateRef") or {}).get("name")
    if ref:  # the submitted workflow's spec is merged over the referenced template's
        base = templates[ref]["spec"]
        spec = {**base, **spec, "templates": base.get("templates", []) + spec.get("templates", [])}
    executor = {"name": "argoexec", "securityContext": executor_sc or {}}
    # templateRef runs another WorkflowTemplate's templates under this workflow's spec: take all
    # of them (and what they reference in turn), a superset of what can run.
    runnable = [(t, name) for t in spec.get("templates") or []]
    seen, queue = set(), [spec]
    while queue:
        for t in queue.pop().get("templates") or []:
            steps = [s for group in t.get("steps") or [] for s in group] + list((t.get("dag") or {}).get("tasks") or [])
            for step in steps:
                ref_name = (step.get("templateRef") or {}).get("name")
                if ref_name in templates and ref_name not in seen:
                    seen.add(ref_name)
                    queue.append(templates[ref_name]["spec"])
                    runnable += [
                        (x, f"{name} via templateRef {ref_name}") for x in templates[ref_name]["spec"]["templates"]
                    ]
    out = []
    for t, where in runnable:
        pod = {
            "securityContext": t.get("securityContext", spec.get("securityContext")),
            "hostNetwork": t.get("hostNetwork", spec.get("hostNetwork")),
            "volumes": (spec.get("volumes") or []) + (t.get("volumes") or []),
        }
        at = f"{where} template {t['name']}"
        if "podSpecPatch" in t or "podSpecPatch" in spec:
            pod["podSpecPatch"] = t.get("podSpecPatch", spec.get("podSpecPatch"))
        main = t.get("container") or t.get("script") or t.get("containerSet")
        if t.get("resource") is not None:
            out.append(PodDef(at, pod, [("main (argoexec resource)", executor)]))
        elif main is not None:
            mains = main.get("containers", []) if "containers" in main else [main]
            containers = [("init (argoexec)", executor), ("wait (argoexec)", executor)]
            containers += [(f"initContainers/{c.get('name')}", c) for c in t.get("initContainers") or []]
            containers += [(f"main/{c.get('name', 'main')}", c) for c in mains]
            containers += [(f"sidecars/{c.get('name')}", c) for c in t.get("sidecars") or []]
            out.append(PodDef(at, pod, containers))
    return out
