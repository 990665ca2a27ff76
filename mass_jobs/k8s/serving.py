"""The InferenceService that serves one generation's model (KServe HuggingFace runtime, vLLM).

Applied by the `serve-model` step of `mass-cycle` (its wait: mass_jobs/cluster/model_wait.py) and
deleted by its exit handler;
`examples/k8s/inferenceservice-base.yaml` is the same object with example values.
"""

from __future__ import annotations

from mass_jobs.k8s import labels as L
from mass_jobs.k8s import pods
from mass_jobs.k8s.manifests import MODEL_SA, MODEL_STEP
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.run.context import served_model_name
from mass_jobs.serving.backends import engine_args

# KServe webhook: InferenceService names must be DNS-1035 labels.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def isvc_name(run: str, gen: str) -> str:
    """The InferenceService's name, which is also the served model name (`--model_name`)."""

    return served_model_name(run, gen)


def predictor_names(name: str) -> list[str]:
    """What KServe's Standard mode names after the InferenceService: the predictor's Deployment and
    Service (`<name>-predictor`, a DNS-1035 label) and its `app` label value (`isvc.<name>-predictor`);
    each at most 63 characters."""
    return [f"{name}-predictor", f"isvc.{name}-predictor"]


def openai_base_url(name: str, namespace: str, cluster_domain: str = "cluster.local") -> str:
    """KServe's OpenAI routes on the predictor Service (port 80, prefix /openai); the cluster's DNS
    domain is a setting (kubelet --cluster-domain is not cluster.local everywhere)."""
    return f"http://{name}-predictor.{namespace}.svc.{cluster_domain}/openai/v1"


def runtime_args(s: ClusterSettings, name: str, dtype: str) -> list[str]:
    """The KServe HuggingFace runtime's arguments: the served name, the vLLM backend and the engine
    arguments a local `vllm serve` gets too (`mass_jobs.serving.backends.engine_args`)."""

    return [
        f"--model_name={name}",
        "--backend=vllm",
        *engine_args(
            tool_call_parser=s.tool_call_parser,
            reasoning_parser=s.reasoning_parser,
            max_model_len=s.max_model_len,
            dtype=dtype,
        ),
    ]


def inference_service(
    s: ClusterSettings, name: str, storage_uri: str, labels: dict[str, str], dtype: str = "bfloat16"
) -> dict:
    """`dtype`: the spec's model.dtype (the cycle passes validate's `dtype` output)."""
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            # Reachable inside the cluster only: without it KServe routes an external Ingress to the model.
            "labels": {**labels, "networking.kserve.io/visibility": "cluster-local"},
            "annotations": {
                # Standard (raw Deployment) mode: no Knative needed, no scale-to-zero mid-run.
                "serving.kserve.io/deploymentMode": "Standard",
            },
        },
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "maxReplicas": 1,
                "serviceAccountName": MODEL_SA,
                "labels": dict(labels),
                **pods.placement(s, "server"),
                "securityContext": pods.pod_security_context(),
                "model": {
                    "modelFormat": {"name": "huggingface"},
                    "runtime": "kserve-huggingfaceserver",
                    "storageUri": storage_uri,
                    "image": s.images.server,
                    "args": runtime_args(s, name, dtype),
                    "resources": pods.resources(s.server, s),
                    "securityContext": {**pods.container_security_context(), "readOnlyRootFilesystem": False},
                },
            }
        },
    }


def example_labels() -> dict[str, str]:
    return {L.RUN: "demo", L.GENERATION: "0", L.TASK: "", L.STEP: MODEL_STEP, L.EPISODE: "", **L.PART_OF}
