"""The Argo templates' shared vocabulary: template and parameter names, the expressions steps pass
each other, the retry strategies (what may pass on a second try), and small model builders."""

from __future__ import annotations

from hera.workflows import Parameter
from hera.workflows import models as m

from mass_jobs.k8s import manifests as K
from mass_jobs.k8s import serving
from mass_jobs.run.context import RunContext

CYCLE = "mass-cycle"
RUN = "mass-run"
CRON = "mass-nightly"

SPEC = "{{workflow.parameters.spec}}"
RUN_ID = "{{workflow.parameters.run}}"
GEN = "{{inputs.parameters.gen}}"
TASK = "{{inputs.parameters.task}}"
EPISODE = "{{inputs.parameters.episode}}"
NAMESPACE = "{{workflow.namespace}}"
ISVC = serving.isvc_name(RUN_ID, GEN)
NEXT_GEN = "{{=asInt(inputs.parameters.gen) + 1}}"
OUTPUTS_DIR = "/tmp/outputs"
WORK_DIR = "/tmp/work"  # MASS_WORK_DIR of every step and trainer pod: the root filesystem is read-only
V = "{{steps.validate.outputs.parameters.%s}}"

# What `mass validate SPEC --gen G --outputs DIR` writes (docs/architecture.md, CLI table).
VALIDATE_OUTPUTS = {
    "tasks": "train-tasks.json",  # JSON list of training task ids
    "episodes": "episodes.json",  # JSON list of {"task", "episode"}: the collect fan-out
    "iterations": "search-iterations",  # number of `--iteration` values (0..n-1)
    "model-uri": "model-uri",  # s3:// dir (trailing '/') or hf:// id of the generation's model
    "dtype": "dtype",  # the spec's model.dtype: the served weights' dtype (vLLM --dtype)
    "generations": "generations",  # N of the run
    "store-prefix": "store-prefix",  # S3 key prefix of the run (<store prefix>/<run>) in the artifact bucket
    "trainer-workers": "trainer-workers",  # PyTorchJob Worker replicas: sft.replicas - 1
    "trainer-nproc": "trainer-nproc",  # processes per replica: max(1, sft.gpus_per_replica)
    "trainer-gpus": "trainer-gpus",  # GPUs per replica: sft.gpus_per_replica
    "needs-model": "needs-model",  # "true" when a step that calls the model is not stored yet
    "run-done": "run-done",  # "true" when every step of every generation and the report are stored
}
# Keys of one episode's agent artifacts: the same layout RunContext gives the steps.
EPISODE_KEYS = RunContext.template("{{inputs.parameters.store-prefix}}")
# the run's egress proxy (egress_proxy.py): its Service's host, passed down to the agent pods
EGRESS_IN = "{{inputs.parameters.egress}}"
EGRESS_TEMPLATE = "egress-proxy"
ROLLOUT = "{{inputs.parameters.rollout}}"  # a rollout's dir relative to the run (prepare lists them)
AGENT_TEMPLATE = "agent-episode"
SERVE_WAIT = "serve-model-wait"  # the serve step's pod that waits for the model (mass serve-wait)
SANDBOX_DIR = "/sandbox"  # the emptyDir both containers of an agent pod mount: the socket, nothing else
SANDBOX_SOCKET = f"{SANDBOX_DIR}/sandbox.sock"
QWEN_DIR = "/qwen"  # the emptyDir of the harness and qwen-code containers only: qwen-code's socket
QWEN_SOCKET = f"{QWEN_DIR}/qwen.sock"
ROLLOUTS_PARAM = "{{steps.prepare.outputs.parameters.rollouts}}"

# Retry what can pass on a second try; exit code 2 is a bad spec/input and never will, nor will a pod
# that sat Pending past its pendingTimeout (Argo's message "timeout"): the cluster would not fit it again.
STEP_RETRY = m.RetryStrategy(
    limit="3",
    retry_policy="Always",
    expression='lastRetry.status == "Error" or (lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2 '
    'and lastRetry.message != "timeout")',
    backoff=m.Backoff(duration="30s", factor="2"),  # no maxDuration: it is a deadline on every attempt
)
# Agent pods: `mass episode` exits 1 on infra_error (model endpoint or harness down), and a pod may be
# evicted or hit its deadline: retry those; 2 (a bad episode.json) never passes, nor does a pod no node
# took within its pendingTimeout. The collect step continues on a failed agent (continueOn) and ingest
# records it as an infra_error episode.
AGENT_RETRY = m.RetryStrategy(
    limit="3",
    retry_policy="Always",
    expression='lastRetry.status == "Error" or (lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2 '
    'and lastRetry.message != "timeout")',
    backoff=m.Backoff(duration="10s", factor="2"),
)
RESOURCE_RETRY = m.RetryStrategy(
    limit="3", retry_policy="OnTransientError", backoff=m.Backoff(duration="30s", factor="2")
)
TRAIN_RETRY = m.RetryStrategy(limit="3", retry_policy="Always", backoff=m.Backoff(duration="1m", factor="2"))


def input_params(*names: str) -> list[Parameter]:
    return [Parameter(name=n) for n in names]


def step_args(**values: str) -> list[Parameter]:
    return [Parameter(name=k.replace("_", "-"), value=v) for k, v in values.items()]


def no_archive() -> m.ArchiveStrategy:
    return m.ArchiveStrategy(none=m.NoneStrategy())


def agent_semaphore() -> m.Synchronization:
    """The agent-pods semaphore, held by the steps around an agent pod (never by the pod's own
    template: Argo would count the wait for it as the pod's Pending time)."""
    return m.Synchronization(
        semaphores=[
            m.SemaphoreRef(config_map_key_ref=m.ConfigMapKeySelector(name=K.SEMAPHORES, key=K.AGENT_SEMAPHORE_KEY))
        ]
    )


def gpu_semaphore() -> m.Synchronization:
    return m.Synchronization(
        semaphores=[
            m.SemaphoreRef(config_map_key_ref=m.ConfigMapKeySelector(name=K.SEMAPHORES, key=K.GPU_SEMAPHORE_KEY))
        ]
    )


def container_security(d: dict) -> dict:
    """Container security context dict -> hera model kwargs."""
    return {
        "allow_privilege_escalation": d["allowPrivilegeEscalation"],
        "read_only_root_filesystem": d["readOnlyRootFilesystem"],
        "run_as_non_root": d["runAsNonRoot"],
        "capabilities": m.Capabilities(drop=d["capabilities"]["drop"]),
        "seccomp_profile": m.SeccompProfile(type=d["seccompProfile"]["type"]),
        **({"run_as_user": d["runAsUser"], "run_as_group": d["runAsGroup"]} if "runAsUser" in d else {}),
    }
