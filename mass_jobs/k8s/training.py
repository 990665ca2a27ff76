"""The PyTorchJob that LoRA-fine-tunes one generation (`mass train` under torchrun).

Master + Workers, container `pytorch`; torchrun takes nodes, node rank, master address and
processes per node from the operator's injected `PET_*` env, so the command carries none of
them. Checkpoints go to the store (S3); `--resume` makes a retried job continue. The job is named
from the workflow and the generation (one per cycle, replaced by a retry), and `cleanPodPolicy:
Running` has the operator delete pods still running once the job ends (training-operator v1.9,
pkg/controller.v1/common/job.go, deletePodsAndServices), so a failed attempt leaves no worker holding GPUs.
"""

from __future__ import annotations

from mass_jobs.k8s import labels as L
from mass_jobs.k8s import pods
from mass_jobs.k8s.manifests import WORKFLOW_SA
from mass_jobs.k8s.settings import ClusterSettings

SUCCEEDED = "status.replicaStatuses.Master.succeeded > 0"
# The operator keeps one condition per type (Created, Running, Restarting, Succeeded, Suspended,
# Failed) in the order they first happened: Kueue's Suspended puts Failed at index 3. A selector key
# cannot search a list, so Failed is matched at every index it can hold (each clause is an OR).
CONDITION_TYPES = 6
FAILED = ",".join(
    [
        *(f"status.conditions.{i}.type == Failed" for i in range(CONDITION_TYPES)),
        "status.replicaStatuses.Master.failed > 0",
    ]
)


def started(queued: bool) -> str:
    """The job got past Created: a second condition exists (Running once the Master's pod runs, or
    Succeeded/Failed if it ended first), or under Kueue a third (Suspended comes second, and the
    operator updates it in place when Kueue admits the job). The operator keeps one condition per
    type in the order they first happened, and a selector key cannot search a list."""
    return f"status.conditions.{2 if queued else 1}.type"


# The Master pod's scheduling message (the scheduler's "0/N nodes are available: ..."), as kubectl's
# jsonpath reads it: empty once the pod is scheduled.
SCHEDULING_MESSAGE = '{.status.conditions[?(@.type=="PodScheduled")].message}'


def job_prefix(run: str) -> str:
    """What every trainer job of the run is named from (and its pods after it)."""
    return f"mass-{run}-g"


def job_name(run: str, gen: str, step: str) -> str:
    """One name per run, generation and trainer step: the job a resubmitted run replaces."""
    return f"{job_prefix(run)}{gen}-{step}"


def replica_names(job: str, workers: int) -> list[str]:
    """What the training operator names after the job: each replica's pod and its headless Service
    (`<job>-master-0`, `<job>-worker-<i>`). A Service name is a DNS-1035 label of at most 63
    characters; past it the operator cannot create the Service and the job hangs."""
    return [f"{job}-master-0", *(f"{job}-worker-{i}" for i in range(workers))]


def train_command(argv: list[str]) -> list[str]:
    """`torchrun --no-python mass <argv>`: the pipeline step's own CLI entry and arguments."""
    return ["torchrun", "--no-python", "mass", *argv]


def pytorch_job(
    s: ClusterSettings,
    name: str,
    argv: list[str],
    labels: dict[str, str],
    env: list[dict] | None = None,
    *,
    workers: int | str | None,
    nproc: str,
    gpus: str,
) -> dict:
    """The job of one training step. `workers` (Worker replicas besides the Master), `nproc`
    (processes per replica) and `gpus` (per replica) come from the spec's sft.replicas and
    gpus_per_replica (`mass validate --outputs`), so the operator's WORLD_SIZE = (1 + workers) x
    nproc (training-operator v1.9, pkg/controller.v1/pytorch/envvar.go) is the spec's world.
    `workers=None` (one replica): the Master alone, since the operator's webhook refuses a Worker
    replica spec with `replicas: 0` (pkg/webhooks/pytorch/pytorchjob_webhook.go)."""

    def replica(n):
        return {
            "replicas": n,
            # Argo retries the whole job; the operator must not restart pods on its own.
            "restartPolicy": "Never",
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": WORKFLOW_SA,
                    "automountServiceAccountToken": False,
                    **pods.placement(s, "trainer"),
                    "securityContext": pods.pod_security_context(),
                    "containers": [_container(s, argv, env, gpus)],
                    "volumes": [pods.scratch_volume(s, "trainer"), {"name": "shm", "emptyDir": {"medium": "Memory"}}],
                },
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        # the queue label on the job alone: Kueue admits the job as one Workload, never its pods
        "metadata": {"name": name, "labels": {**labels, **L.queue_labels(s)}},
        "spec": {
            "nprocPerNode": nproc,
            # The deadline counts from the operator's startTime, which it sets anew when Kueue admits
            # a suspended job: time in the queue is not training time.
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0, "activeDeadlineSeconds": s.job_deadline_s},
            "pytorchReplicaSpecs": {"Master": replica(1), **({} if workers is None else {"Worker": replica(workers)})},
        },
    }


def _container(s: ClusterSettings, argv: list[str], env: list[dict] | None, gpus: str) -> dict:
    return {
        "name": "pytorch",
        "image": s.images.trainer,
        "imagePullPolicy": s.images.pull_policy,
        "command": train_command(argv),
        "workingDir": "/tmp",
        "env": env or [{"name": "HOME", "value": "/tmp"}],
        "envFrom": [{"secretRef": {"name": s.s3_secret}}],
        "resources": _resources(s, gpus),
        "securityContext": pods.container_security_context(),
        "volumeMounts": pods.mounts(tmp="/tmp", shm="/dev/shm"),
    }


def _resources(s: ClusterSettings, gpus: str) -> dict:
    """The chart's per-replica CPU and memory; the spec's GPUs (requests = limits, Guaranteed QoS)."""
    amounts = {
        "cpu": s.trainer.cpu,
        "memory": s.trainer.memory,
        "ephemeral-storage": s.trainer.ephemeral,
        s.gpu_resource: gpus,
    }
    return {"limits": dict(amounts), "requests": dict(amounts)}


def operator_init_container_template() -> list[dict]:
    """The training operator's Worker init container (`init-pytorch`, waits for the Master's DNS
    name), hardened. The operator builds it from a Go template file
    (`--pytorch-init-container-template-file`); its built-in one has no securityContext, which Pod
    Security "restricted" rejects. `{{.InitContainerImage}}`, `{{.MasterAddr}}` and `{{.MaxTries}}`
    (--init-container-max-tries) are the operator's own placeholders: like its built-in one it gives
    up after MaxTries lookups, so a Master that never comes fails the Worker instead of hanging it."""
    return [
        {
            "name": "init-pytorch",
            "image": "{{.InitContainerImage}}",
            "imagePullPolicy": "IfNotPresent",
            "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}},
            "command": [
                "sh",
                "-c",
                "err=1; for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}}; then err=0; break; "
                "fi; echo waiting for master; sleep 2; done; exit $err",
            ],
            "securityContext": pods.executor_security_context(),
        }
    ]
