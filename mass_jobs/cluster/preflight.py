"""`mass validate SPEC --values V --cluster`: the spec and the chart's values against the live cluster.

Read-only, with the user's kubeconfig (or a pod's account). What a platform team's first run fails
on, each checked where the cluster lets it be read:
- the controllers' APIs: Argo's Workflow kinds, the training operator's PyTorchJob, KServe's
  InferenceService and ClusterServingRuntime, Kueue's queues when `kueue.queueName` is set; served at
  the versions rendered here, and declaring every field the rendered PyTorchJob and InferenceService
  set (a CRD's structural schema prunes what it does not declare: an older training operator drops
  `nprocPerNode` without a word, and every replica trains alone);
- the three controller settings docs/install.md asks for, under Pod Security "restricted": Argo's
  executor securityContext, the training operator's init-container template, KServe's storage
  initializer (its securityContext and memory);
- what the executor's ServiceAccount may do (SubjectAccessReview, the verbs of the chart's Role) and
  whether this account may submit a run;
- the S3 and judge Secrets and their keys;
- the LocalQueue and its ClusterQueue: present, covering every resource the queued workloads
  request (Kueue admits nothing that requests an uncovered resource) and with GPU quota for the
  largest of them;
- the nodes: for each class of pods, a node that would take it (kube-scheduler's filters: taints
  against the class's tolerations, its selector and affinity, allocatable cpu, memory, GPUs and
  ephemeral storage against its requests), and the StorageClass a scratch volume names.

A read the cluster refuses this account is a note saying what could not be checked, never a pass.
"""

from __future__ import annotations

import base64
from dataclasses import replace

import yaml

from mass_jobs.cluster.api import Cluster, Forbidden
from mass_jobs.cluster.capacity import (
    node_checks,
    predictor,
    queue_checks,
    served_versions,
    storage_checks,
    trainer_job,
    unread,
)
from mass_jobs.k8s import manifests, pods
from mass_jobs.k8s.preflight import Check
from mass_jobs.k8s.settings import ClusterSettings

RESTRICTED = "restricted"
PSS_ENFORCE = "pod-security.kubernetes.io/enforce"
# (what, group, plural, the versions this project renders, where to get it)
APIS = (
    ("Argo Workflow", "argoproj.io", "workflows", ("v1alpha1",), "Argo Workflows v4"),
    ("Argo WorkflowTemplate", "argoproj.io", "workflowtemplates", ("v1alpha1",), "Argo Workflows v4"),
    ("PyTorchJob", "kubeflow.org", "pytorchjobs", ("v1",), "training-operator v1.9"),
    ("InferenceService", "serving.kserve.io", "inferenceservices", ("v1beta1",), "KServe v0.20"),
    ("ClusterServingRuntime", "serving.kserve.io", "clusterservingruntimes", ("v1alpha1",), "KServe v0.20's runtimes"),
)
# Kueue v0.16 added v1beta2 and v0.20 stopped serving v1beta1: either is read
KUEUE_APIS = (
    ("Kueue LocalQueue", "kueue.x-k8s.io", "localqueues", ("v1beta2", "v1beta1"), "Kueue v0.19"),
    ("Kueue ClusterQueue", "kueue.x-k8s.io", "clusterqueues", ("v1beta2", "v1beta1"), "Kueue v0.19"),
)
# where the controllers' settings live in a default install of each
ARGO_CONFIG = ("argo", "workflow-controller-configmap")
TRAINING_OPERATOR = ("kubeflow", "training-operator")
INIT_TEMPLATE_FLAG = "--pytorch-init-container-template-file"
STORAGE_CONTAINER = "default"
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


# -- the controllers' APIs ------------------------------------------------------------------------


def crd(cluster: Cluster, group: str, plural: str) -> dict | None:
    return cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}")


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """The fields of `obj` a CRD's structural schema does not declare: the API server prunes them."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(obj, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, value in obj.items():
            here = f"{path}.{key}" if path else key
            if props is not None and key in props:
                out += unknown_fields(value, props[key], here)
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, here)
            elif props is not None or extra is False:
                out.append(here)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema.get("items") or {}, f"{path}[{i}]")
    return out


def api_checks(cluster: Cluster, spec, s: ClusterSettings) -> list[Check]:
    found, seen = [], {}
    rendered = {"pytorchjobs": trainer_job(spec, s), "inferenceservices": predictor(s)}
    for what, group, plural, versions, source in APIS + (KUEUE_APIS if s.kueue_queue else ()):
        name, fix = f"API {plural}.{group}", f"crd {plural}.{group}"
        served = served_versions(cluster, group, plural, seen)
        usable = [v for v in versions if v in served]
        if not usable:
            have = f"serves {', '.join(served)}" if served else "not installed"
            found.append(
                Check(
                    name,
                    have,
                    f"{group}/{versions[0]}",
                    False,
                    fix,
                    f"{what} ({plural}.{group}) is {have} here and this project creates "
                    f"{group}/{versions[0]} objects: install {source} (docs/install.md)",
                )
            )
            continue
        ok = Check(name, f"serves {', '.join(served)}", f"{group}/{usable[0]}", True, fix)
        if plural not in rendered:
            found.append(ok)
            continue
        try:
            obj = crd(cluster, group, plural)
        except Forbidden as err:
            found.append(replace(ok, advice=f"could not read its CRD ({err}): the fields it declares are not checked"))
            continue
        version = next((v for v in (obj or {}).get("spec", {}).get("versions", []) if v["name"] == usable[0]), {})
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        dropped = unknown_fields({"spec": rendered[plural]["spec"]}, schema)
        found.append(
            replace(
                ok,
                value=f"drops {', '.join(dropped[:3])}",
                limit="every rendered field declared",
                ok=False,
                why=f"the cluster's {what} CRD ({group}/{usable[0]}) does not declare "
                f"{', '.join(dropped)}: it is older than {source}, and the API server "
                f"drops undeclared fields from every object created; upgrade to {source} "
                f"(docs/install.md)",
            )
            if dropped
            else ok
        )
    return found


# -- the controllers' settings --------------------------------------------------------------------


def restricted(cluster: Cluster) -> bool | None:
    """Whether the run's namespace enforces Pod Security "restricted" (None: not readable)."""
    try:
        ns = cluster.get(f"/api/v1/namespaces/{cluster.namespace}")
    except Forbidden:
        return None
    return ((ns or {}).get("metadata", {}).get("labels") or {}).get(PSS_ENFORCE) == RESTRICTED


def _is_restricted_context(ctx: dict | None) -> bool:
    ctx = ctx or {}
    return (
        ctx.get("runAsNonRoot") is True
        and ctx.get("allowPrivilegeEscalation") is False
        and "ALL" in ((ctx.get("capabilities") or {}).get("drop") or [])
        and (ctx.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    )


def _lookup(
    cluster: Cluster, check: str, where: str, paths: list[str], absent: str
) -> tuple[dict | None, Check | None]:
    """A controller's settings object at the first of `paths` that holds it, or the note that says it
    could not be read or is not where a default install puts it (not judged: not checked)."""
    try:
        obj = next((o for o in (cluster.get(p) for p in paths) if o is not None), None)
    except Forbidden as err:
        return None, unread(check, where, err)
    if obj is None:
        return None, Check(
            check, "not found", where, True, where, advice=f"{where} does not exist ({absent}); not checked"
        )
    return obj, None


def argo_executor_check(cluster: Cluster) -> Check:
    ns, name = ARGO_CONFIG
    paths = [f"/api/v1/namespaces/{n}/configmaps/{name}" for n in dict.fromkeys((ns, cluster.namespace))]
    cm, note = _lookup(
        cluster,
        "Argo executor securityContext",
        f"configmap {ns}/{name}",
        paths,
        f"nor in {cluster.namespace}: is Argo installed under another namespace?",
    )
    if note:
        return note
    executor = yaml.safe_load((cm.get("data") or {}).get("executor") or "") or {}
    ok = _is_restricted_context(executor.get("securityContext"))
    where = f"{cm['metadata'].get('namespace', ns)}/{name}"
    return Check(
        "Argo executor securityContext",
        "restricted" if ok else "unset or not restricted",
        RESTRICTED,
        ok,
        f"configmap {where} key executor",
        f"Argo's init and wait containers take their securityContext from {where} (key executor), which "
        f"has none for Pod Security {RESTRICTED}: every step pod of namespace {cluster.namespace} is "
        f"refused; apply examples/k8s/argo-controller-values.yaml",
    )


def operator_init_check(cluster: Cluster, replicas: int) -> Check:
    ns, name = TRAINING_OPERATOR
    dep, note = _lookup(
        cluster,
        "training operator init container",
        f"deployment {ns}/{name}",
        [f"/apis/apps/v1/namespaces/{ns}/deployments/{name}"],
        "is the training operator installed under another name?",
    )
    if note:
        return note
    args = [
        a
        for c in dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
        for a in (c.get("args") or []) + (c.get("command") or [])
    ]
    ok = any(a.startswith(INIT_TEMPLATE_FLAG) for a in args)
    return Check(
        "training operator init container",
        "template set" if ok else "built-in",
        "hardened template",
        ok,
        f"deployment {ns}/{name} args {INIT_TEMPLATE_FLAG}",
        f"the training operator ({ns}/{name}) runs without {INIT_TEMPLATE_FLAG}: its built-in Worker init "
        f"container has no securityContext and Pod Security {RESTRICTED} refuses every Worker of a "
        f"{replicas}-replica job; mount examples/k8s/training-operator-init-container.yaml",
    )


def storage_initializer_check(cluster: Cluster, strict: bool) -> Check:
    where = f"clusterstoragecontainer {STORAGE_CONTAINER}"
    csc, note = _lookup(
        cluster,
        "KServe storage initializer",
        where,
        [f"/apis/serving.kserve.io/v1alpha1/clusterstoragecontainers/{STORAGE_CONTAINER}"],
        "KServe then takes its storage initializer from inferenceservice-config",
    )
    if note:
        return note
    container = (csc.get("spec") or {}).get("container") or {}
    memory = ((container.get("resources") or {}).get("limits") or {}).get("memory", "1Gi")
    want = pods.STORAGE_INITIALIZER_RESOURCES["limits"]["memory"]
    unsafe = strict and not _is_restricted_context(container.get("securityContext"))
    why = ([f"no securityContext for Pod Security {RESTRICTED} (every predictor is refused)"] if unsafe else []) + (
        [f"a memory limit of {memory} (a download of tens of GB throttles under {want})"]
        if pods.quantity(memory) < pods.quantity(want)
        else []
    )
    return Check(
        "KServe storage initializer",
        f"memory {memory}" + (", not restricted" if unsafe else ""),
        f"memory >= {want}" + (f", {RESTRICTED}" if strict else ""),
        not why,
        where,
        f"KServe's storage initializer ({where}) has {' and '.join(why)}; apply "
        f"examples/k8s/kserve-storage-initializer-patch.yaml",
    )


def controller_checks(cluster: Cluster, spec, s: ClusterSettings) -> list[Check]:
    """The three settings docs/install.md asks for, where Pod Security "restricted" needs them (a
    namespace that could not be read is taken as restricted)."""
    found = []
    enforced = restricted(cluster)
    if enforced is None:
        found.append(
            Check(
                "namespace Pod Security",
                "not read",
                RESTRICTED,
                True,
                "the account's RBAC",
                advice=f"could not read namespace {cluster.namespace}: the controller settings below "
                f"are checked as if it enforced {RESTRICTED}",
            )
        )
    strict = enforced is not False
    if strict:
        found.append(argo_executor_check(cluster))
        if spec.sft.replicas > 1:
            found.append(operator_init_check(cluster, spec.sft.replicas))
    return found + [storage_initializer_check(cluster, strict)]


# -- access -----------------------------------------------------------------------------------------


def _review(cluster: Cluster, kind: str, spec: dict) -> bool:
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}
    path = "selfsubjectaccessreviews" if kind.startswith("Self") else "subjectaccessreviews"
    return bool((cluster.create(f"/apis/authorization.k8s.io/v1/{path}", body).get("status") or {}).get("allowed"))


def access_checks(cluster: Cluster, s: ClusterSettings) -> list[Check]:
    ns, found = cluster.namespace, []
    attrs = {"namespace": ns, "verb": "create", "group": "argoproj.io", "resource": "workflows"}
    try:
        ok = _review(cluster, "SelfSubjectAccessReview", {"resourceAttributes": attrs})
        found.append(
            Check(
                "submit a run",
                "allowed" if ok else "forbidden",
                "create workflows",
                ok,
                f"your RBAC in namespace {ns}",
                f"this account may not create workflows.argoproj.io in namespace {ns}: argo submit "
                f"fails; ask for a RoleBinding to Argo's argo-workflows-edit ClusterRole",
            )
        )
    except Forbidden as err:
        found.append(unread("submit a run", "a SelfSubjectAccessReview", err))
    # each ServiceAccount of the chart may do what its Role grants: the executor (resource templates,
    # Argo's wait containers) and the serve step's wait (it reads the predictor's pods)
    for role in (o for o in manifests.rbac(s) if o["kind"] == "Role"):
        name = role["metadata"]["name"]
        what = f"{role['metadata']['labels']['app.kubernetes.io/component']} ServiceAccount"
        user, missing = f"system:serviceaccount:{ns}:{name}", []
        try:
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        res, _, sub = resource.partition("/")
                        for verb in rule["verbs"]:
                            attrs = {"namespace": ns, "verb": verb, "group": group, "resource": res, "subresource": sub}
                            if not _review(cluster, "SubjectAccessReview", {"user": user, "resourceAttributes": attrs}):
                                missing.append(f"{verb} {resource}{'.' + group if group else ''}")
        except Forbidden as err:
            return found + [unread(what, "a SubjectAccessReview", err)]
        found.append(
            Check(
                what,
                f"{len(missing)} verb(s) missing" if missing else "every verb",
                f"role {name}",
                not missing,
                f"role/rolebinding {name} in {ns}",
                f"serviceaccount {name} in {ns} may not {'; '.join(missing)} (the chart's Role {name} "
                f"grants them: reinstall the chart, or fix the Role and RoleBinding)",
            )
        )
    return found


# -- Secrets ----------------------------------------------------------------------------------------


def secret_checks(cluster: Cluster, spec, s: ClusterSettings) -> list[Check]:
    judge_keys = [j.api_key_env for j in spec.judges if j.endpoint != "local" and j.api_key_env]
    wanted = [(s.s3_secret, S3_KEYS, "s3.secretName"), (s.judge_secret, tuple(judge_keys), "judges.secretName")]
    found = []
    for name, keys, value in wanted:
        if not keys:
            continue
        try:
            secret = cluster.get(f"/api/v1/namespaces/{cluster.namespace}/secrets/{name}")
        except Forbidden as err:
            found.append(unread(f"secret {name}", f"secret {name}", err))
            continue
        data = (secret or {}).get("data") or {}
        empty = [k for k in keys if not base64.b64decode(data.get(k) or "")]
        state = "missing" if secret is None else (f"{', '.join(empty)} empty or missing" if empty else "every key")
        found.append(
            Check(
                f"secret {name}",
                state,
                ", ".join(keys),
                secret is not None and not empty,
                f"secret {name} in {cluster.namespace} (values {value})",
                f"secret {name} in namespace {cluster.namespace} "
                + ("does not exist" if secret is None else f"has no value for {', '.join(empty)}")
                + f": create it with {', '.join(keys)} (docs/install.md)",
            )
        )
    return found


def checks(cluster: Cluster, spec, s: ClusterSettings) -> list[Check]:
    """Every live check, in the order a platform team fixes them."""
    s = replace(s, namespace=cluster.namespace)
    return (
        api_checks(cluster, spec, s)
        + controller_checks(cluster, spec, s)
        + access_checks(cluster, s)
        + secret_checks(cluster, spec, s)
        + queue_checks(cluster, spec, s)
        + node_checks(cluster, spec, s)
        + storage_checks(cluster, s)
    )
