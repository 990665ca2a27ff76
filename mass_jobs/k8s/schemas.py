"""Offline validation of rendered objects against the upstream schemas in shared/k8s-schemas.

CRD schemas are made strict in memory (`strict`), so unknown fields are errors, and the rules
only admission webhooks enforce (KServe name, PyTorchJob replicas/containers) are checked here.
Schemas are found at $MASS_K8S_SCHEMAS or ../shared/k8s-schemas next to the repository root.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

from mass_jobs.k8s.serving import NAME_PATTERN
from mass_jobs.k8s.training import replica_names

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = "kubernetes-v1.35.0-standalone-strict"
ARGO_KINDS = {"Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow"}
# (apiVersion, kind) -> schema files; Argo kinds are checked against both the CRD and schema.json.
SCHEMA_FILES = {
    ("v1", "ServiceAccount"): f"{K8S}/serviceaccount-v1.json",
    ("v1", "ConfigMap"): f"{K8S}/configmap-v1.json",
    ("v1", "Secret"): f"{K8S}/secret-v1.json",
    ("v1", "PersistentVolumeClaim"): f"{K8S}/persistentvolumeclaim-v1.json",
    ("rbac.authorization.k8s.io/v1", "Role"): f"{K8S}/role-rbac-v1.json",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): f"{K8S}/rolebinding-rbac-v1.json",
    ("batch/v1", "Job"): f"{K8S}/job-batch-v1.json",
    ("networking.k8s.io/v1", "NetworkPolicy"): f"{K8S}/networkpolicy-networking-v1.json",
    ("argoproj.io/v1alpha1", "Workflow"): "argoproj.io/workflow_v1alpha1.json",
    ("argoproj.io/v1alpha1", "WorkflowTemplate"): "argoproj.io/workflowtemplate_v1alpha1.json",
    ("argoproj.io/v1alpha1", "CronWorkflow"): "argoproj.io/cronworkflow_v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "serving.kserve.io/inferenceservice_v1beta1.json",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org/pytorchjob_v1.json",
}


def schemas_dir() -> Path:
    env = os.environ.get("MASS_K8S_SCHEMAS")
    path = Path(env) if env else REPO_ROOT.parent / "shared" / "k8s-schemas"
    if not (path / "argoproj.io").is_dir():
        raise FileNotFoundError(f"no k8s schemas at {path}: set MASS_K8S_SCHEMAS to the k8s-schemas folder")
    return path


def strict(s):
    """additionalProperties: false wherever properties are listed and unknown fields are not kept."""
    if isinstance(s, dict):
        s = {k: strict(v) for k, v in s.items()}
        if "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
        return s
    return [strict(x) for x in s] if isinstance(s, list) else s


@cache
def _validator(rel: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(strict(json.loads((schemas_dir() / rel).read_text())))


@cache
def _argo_definitions() -> dict:
    return strict(json.loads((schemas_dir() / "argoproj.io/schema.json").read_text())["definitions"])


@cache
def _argo_json_validator(kind: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(
        {"$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}", "definitions": _argo_definitions()}
    )


# Kinds the offline folder lacks, from the package its Kubernetes schemas were generated with
# (kubernetes-validate, the Kubernetes v1.35.0 OpenAPI, strict): a test dependency.
PACKAGE_SCHEMAS = {
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("v1", "Service"): "service-v1.json",
    # what the live cluster returns to `mass validate --cluster` and `mass pods` (tests record it)
    ("v1", "Node"): "node-v1.json",
    ("v1", "Namespace"): "namespace-v1.json",
    ("v1", "Pod"): "pod-v1.json",
    ("v1", "Event"): "event-v1.json",
    ("storage.k8s.io/v1", "StorageClass"): "storageclass-storage-v1.json",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "customresourcedefinition-apiextensions-v1.json",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "clusterrole-rbac-v1.json",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "clusterrolebinding-rbac-v1.json",
}


@cache
def _package_validator(name: str):
    from importlib.resources import files

    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    root = files("kubernetes_validate") / "kubernetes-json-schema" / "v1.35.0-local-strict"
    defs = strict(json.loads((root / "_definitions.json").read_text()))
    registry = Registry().with_resource(defs["$id"], Resource.from_contents(defs))
    return Draft202012Validator(strict(json.loads((root / name).read_text())), registry=registry)


def validators(doc: dict) -> list:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in PACKAGE_SCHEMAS:
        return [_package_validator(PACKAGE_SCHEMAS[key])]
    if key not in SCHEMA_FILES:
        raise KeyError(f"no schema for apiVersion={key[0]!r} kind={key[1]!r}")
    found = [_validator(SCHEMA_FILES[key])]
    if key[1] in ARGO_KINDS:
        found.append(_argo_json_validator(key[1]))
    return found


def schema_errors(doc: dict) -> list[str]:
    """Every schema error of one object, as 'Kind/name: path: message'."""
    where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    out = []
    for v in validators(doc):
        for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
            out.append(f"{where}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}")
    return out


def webhook_errors(doc: dict) -> list[str]:
    """Rules admission webhooks enforce that no schema carries: KServe's name rule, and what the
    training operator's PyTorchJob webhook refuses (v1.9, pkg/webhooks/pytorch/pytorchjob_webhook.go:
    a DNS-1035 name, Master/Worker only, a `pytorch` container, Master replicas 1, Worker replicas
    at least 1, no negative runPolicy number)."""
    kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
    errors = []
    if kind == "InferenceService" and not re.fullmatch(NAME_PATTERN, name):
        errors.append(f"InferenceService/{name}: name must match {NAME_PATTERN}")
    if kind == "PyTorchJob":
        if len(name) > 63 or not re.fullmatch(NAME_PATTERN, name):
            errors.append(f"PyTorchJob/{name}: name must be a DNS-1035 label ({NAME_PATTERN}, at most 63 characters)")
        spec = doc.get("spec") or {}
        workers = ((spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("replicas")
        for derived in replica_names(name, workers if isinstance(workers, int) else 0):
            if len(derived) > 63:
                errors.append(
                    f"PyTorchJob/{name}: the operator's Service {derived} would be longer than 63 "
                    f"characters ({len(derived)}): the job would hang"
                )
        for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
            value = (spec.get("runPolicy") or {}).get(key)
            if isinstance(value, int) and value < 0:
                errors.append(f"PyTorchJob/{name}: runPolicy.{key} must be >= 0, got {value}")
        specs = spec.get("pytorchReplicaSpecs") or {}
        if set(specs) - {"Master", "Worker"}:
            errors.append(f"PyTorchJob/{name}: replica types must be Master/Worker, got {sorted(specs)}")
        if specs.get("Master", {}).get("replicas") != 1:
            errors.append(f"PyTorchJob/{name}: Master replicas must be 1")
        worker = specs.get("Worker", {}).get("replicas")
        if "Worker" in specs and isinstance(worker, int) and worker < 1:
            errors.append(
                f"PyTorchJob/{name}: Worker replicas must be at least 1, got {worker} (leave Worker out for one replica)"
            )
        for rtype, rs in specs.items():
            names = [c.get("name") for c in ((rs or {}).get("template") or {}).get("spec", {}).get("containers") or []]
            if "pytorch" not in names:
                errors.append(f"PyTorchJob/{name}: {rtype} needs a container named pytorch, has {names}")
    return errors


# Stand-ins for Argo expressions when an embedded manifest is checked on its own.
EXAMPLE_VALUES = {
    "workflow.parameters.run": "demo",
    "workflow.parameters.spec": "s3://mass-jobs/specs/demo.yaml",
    "workflow.parameters.gen": "0",
    "workflow.name": "mass-run-abcde",
    "workflow.uid": "3f9c2a7e-5b1d-4c8e-9a6f-0d2b7e4c1a95",
    "workflow.namespace": "mass-jobs",
    "inputs.parameters.gen": "3",
    "inputs.parameters.model-uri": "s3://mass-jobs/runs/demo/gen-3/model",
    "inputs.parameters.dtype": "bfloat16",
    "retries": "0",
    "inputs.parameters.trainer-workers": "2",
    "inputs.parameters.trainer-nproc": "2",
    "inputs.parameters.trainer-gpus": "2",
}


def substitute_examples(text: str) -> str:
    def one(m):
        key = m.group(1).strip()
        if key not in EXAMPLE_VALUES:
            raise KeyError(f"no example value for {{{{{key}}}}}")
        return EXAMPLE_VALUES[key]

    return re.sub(r"\{\{([^{}]+)\}\}", one, text)


def embedded_manifests(doc: dict) -> list[dict]:
    """Objects created by the resource templates of an Argo object, with example values."""
    import yaml

    spec = doc.get("spec", {})
    templates = spec.get("templates") or spec.get("workflowSpec", {}).get("templates") or []
    return [yaml.safe_load(substitute_examples(t["resource"]["manifest"])) for t in templates if "resource" in t]


def all_errors(doc: dict) -> list[str]:
    errors = schema_errors(doc) + webhook_errors(doc)
    for inner in embedded_manifests(doc):
        if "spec" not in inner:
            continue  # a delete action names the object only
        errors += schema_errors(inner) + webhook_errors(inner)
    return errors
