"""Pod labels and annotations: few, stable label keys an operator selects on.

`kubectl get pods -l mass-jobs.io/run=demo,mass-jobs.io/step=episode` lists a run's agent pods;
everything descriptive goes into `mass-jobs.io/*` annotations instead.
"""

from __future__ import annotations

from mass_jobs.k8s.settings import ClusterSettings, helm_block

PREFIX = "mass-jobs.io"
RUN, GENERATION, TASK, STEP, EPISODE = (f"{PREFIX}/{k}" for k in ("run", "generation", "task", "step", "episode"))
POD_LABEL_KEYS = (RUN, GENERATION, TASK, STEP, EPISODE)
PART_OF = {"app.kubernetes.io/part-of": "mass-jobs"}
# Argo lists a workflow's pods by this label; pods made by operators (PyTorchJob) carry it too.
ARGO_WORKFLOW = "workflows.argoproj.io/workflow"

RUN_PARAM = "{{workflow.parameters.run}}"
# Kueue admits what carries this label through the named LocalQueue of the object's namespace.
QUEUE = "kueue.x-k8s.io/queue-name"


def pod_labels(step: str, gen: str = "", task: str = "", episode: str = "") -> dict[str, str]:
    """The five pod labels; an empty value means "not per task/episode" (`-l mass-jobs.io/task=`)."""
    return {RUN: RUN_PARAM, GENERATION: gen, TASK: task, STEP: step, EPISODE: episode, **PART_OF}


def object_labels(component: str, chart: bool) -> dict[str, str]:
    """Labels of plain objects; in the chart they are merged with the chart's standard labels."""
    labels = {**PART_OF, "app.kubernetes.io/component": component}
    if chart:
        labels[helm_block('include "mass-jobs.labels" .')] = ""
    return labels


def queue_labels(s: ClusterSettings, plain_pod: bool = False) -> dict[str, str]:
    """The Kueue queue label of a GPU workload (a PyTorchJob, a predictor), or with `plain_pod` of an
    Argo step or agent pod, which Kueue admits only under its plain-pod integration
    (`kueue.podIntegration`); none when no queue is set. In the chart the label is a values block."""
    if s.chart:
        return {helm_block(f'include "mass-jobs.{"kueuePodLabel" if plain_pod else "kueueLabel"}" .'): ""}
    if s.kueue_queue and (s.kueue_pods or not plain_pod):
        return {QUEUE: s.kueue_queue}
    return {}


def truncate_name(name: str, limit: int = 63) -> str:
    """Kubernetes names and label values: at most 63 characters, never ending in '-'."""
    return name[:limit].rstrip("-.")
