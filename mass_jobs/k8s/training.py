"""The PyTorchJob that LoRA-fine-tunes one generation (`mass train` under torchrun).

Master + Workers, container `pytorch`; torchrun takes nodes, node rank, master address and
processes per node from the operator's injected `PET_*` env, so the command carries none of
them. Checkpoints go to the store (S3); `--resume` makes a retried job continue.
"""

from __future__ import annotations

from mass_jobs.k8s import pods
from mass_jobs.k8s.manifests import WORKFLOW_SA
from mass_jobs.k8s.settings import ClusterSettings

SUCCEEDED = "status.replicaStatuses.Master.succeeded > 0"
# Conditions run [Created, Running|Restarting, Succeeded|Failed]; each failure clause is an OR.
FAILED = "status.conditions.1.type == Failed,status.conditions.2.type == Failed,status.replicaStatuses.Master.failed > 0"


def train_command(spec: str, gen: str) -> list[str]:
    return ["torchrun", "--no-python", "mass", "train", "--spec", spec, "--gen", gen, "--resume"]


def pytorch_job(s: ClusterSettings, name: str, spec: str, gen: str, labels: dict[str, str]) -> dict:
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
                    "securityContext": pods.pod_security_context(),
                    "containers": [{
                        "name": "pytorch",
                        "image": s.images.trainer,
                        "imagePullPolicy": s.images.pull_policy,
                        "command": train_command(spec, gen),
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "envFrom": [{"secretRef": {"name": s.s3_secret}}],
                        "resources": pods.resources(s.trainer, s),
                        "securityContext": pods.container_security_context(),
                        "volumeMounts": pods.mounts(tmp="/tmp", shm="/dev/shm"),
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
                },
            },
        }

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "nprocPerNode": s.trainer.gpu,
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 0},
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(s.trainer_workers)},
        },
    }
