"""The agent-episode template: the one sandboxed pod every agent rollout runs in (search, collect,
guard checks, evaluate, panel selection), with its sidecars, artifacts and limits."""

from __future__ import annotations

from hera.workflows import Container
from hera.workflows import models as m

from mass_jobs.episodes import proof
from mass_jobs.k8s import labels as L
from mass_jobs.k8s import manifests as K
from mass_jobs.k8s import pods
from mass_jobs.k8s import prometheus as PM
from mass_jobs.k8s.argo_vocab import (
    AGENT_RETRY,
    AGENT_TEMPLATE,
    EGRESS_IN,
    EPISODE_KEYS,
    GEN,
    QWEN_DIR,
    QWEN_SOCKET,
    ROLLOUT,
    SANDBOX_DIR,
    SANDBOX_SOCKET,
    SPEC,
    TASK,
    container_security,
    input_params,
    no_archive,
)
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.pipeline import nodes as N
from mass_jobs.sandbox.egress_service import PORT as EGRESS_PORT


def agent_container(s: ClusterSettings) -> Container:
    """The sandboxed agent pod of every episode (search, collect, evaluate): inputs/outputs as
    Argo S3 artifacts under the rollout's dir, no store credentials, no token, egress limited
    by the `mass-agent-egress` NetworkPolicy (it selects the agent step label).

    Three uids: the main container (`mass episode --sandbox --qwen`) holds the recording proxy
    and writes /out; the `sandbox` sidecar (`mass sandbox-serve`, SANDBOX_UID) owns the
    workspace and runs every tool and shell command; the `qwen` sidecar (QWEN_UID) runs
    qwen-code on the same workspace volume, its shell commands forwarded to the sandbox. They
    share Unix sockets' emptyDirs and the loopback, nothing else: no code the model wrote can
    reach /out, qwen-code's environment (the proxy's token) or its pipes, and the proxy serves
    only the harness's and qwen-code's uids (see mass_jobs/episodes/sandbox_service.py). Argo stops the
    sidecars when the main container exits.

    Every artifact is `archive: none`: Argo's executor would otherwise untar a .tar.gz input
    and rename its single top-level entry onto the path, and tar an output directory under
    its own base name (argo-workflows workflow/executor/executor.go, loadArtifacts and
    stageArchiveFile, v4.1.2); `mass episode` unpacks and packs the store's own archive format.
    Outputs are optional: a pod killed at its deadline leaves none, ingest records that. Argo's
    /var/run/argo is shared by every container (0777, umask 0), so a sidecar can end the upload
    early through the main container's exit-code file: ingest accepts only outputs proof.json
    signs with the rollout's key (mass_jobs/episodes/proof.py)."""
    k = EPISODE_KEYS
    rollout = k.under_run(ROLLOUT)

    def key(where, name):
        return m.S3Artifact(key=where(rollout, name))

    sandbox = m.UserContainer(
        name="sandbox",
        image=s.images.sandbox,
        image_pull_policy=s.images.pull_policy,
        command=["mass"],
        args=["sandbox-serve", "--socket", SANDBOX_SOCKET, "--workspace", "/workspace/ws"],
        # each command's /tmp is a folder made here, beside the workspace on its volume (scratch.agent)
        env=[m.EnvVar(name="HOME", value="/tmp"), m.EnvVar(name="TMPDIR", value="/workspace")],
        working_dir="/tmp",
        resources=m.ResourceRequirements(**pods.resources(s.agent, s)),
        security_context=m.SecurityContext(**container_security(pods.sandbox_security_context())),
        volume_mounts=[
            m.VolumeMount(name="sandbox-tmp", mount_path="/tmp"),
            m.VolumeMount(name="workspace", mount_path="/workspace"),
            m.VolumeMount(name="sandbox", mount_path=SANDBOX_DIR),
        ],
    )
    qwen = m.UserContainer(
        name="qwen",
        image=s.images.sandbox,
        image_pull_policy=s.images.pull_policy,
        command=["mass"],
        args=[
            "sandbox-serve",
            "--socket",
            QWEN_SOCKET,
            "--workspace",
            "/workspace/ws",
            "--qwen-only",
            "--shell-socket",
            SANDBOX_SOCKET,
        ],
        env=[
            m.EnvVar(name="HOME", value="/tmp"),
            # qwen-code is on the sandbox image's PATH; name it so the harness never guesses.
            m.EnvVar(name="MASS_QWEN_BIN", value="/usr/local/bin/qwen"),
        ],
        working_dir="/tmp",
        resources=m.ResourceRequirements(**pods.resources(s.qwen, s)),
        security_context=m.SecurityContext(**container_security(pods.qwen_security_context())),
        volume_mounts=[
            m.VolumeMount(name="qwen-tmp", mount_path="/tmp"),
            m.VolumeMount(name="workspace", mount_path="/workspace"),
            m.VolumeMount(name="sandbox", mount_path=SANDBOX_DIR),
            m.VolumeMount(name="qwen", mount_path=QWEN_DIR),
        ],
    )
    return Container(
        name=AGENT_TEMPLATE,
        image=s.images.sandbox,
        command=["mass"],
        args=[
            *N.agent("/in", "/out"),
            "--sandbox",
            SANDBOX_SOCKET,
            "--qwen",
            QWEN_SOCKET,
            "--qwen-uid",
            str(pods.QWEN_UID),
            # used with execution.network only: the run's proxy knows this rollout by its key
            "--egress-proxy",
            f"http://{EGRESS_IN}:{EGRESS_PORT}",
            "--rollout",
            ROLLOUT,
        ],
        # Key-only S3 artifacts: bucket, endpoint and credentials come from the artifact
        # repository and are used by Argo's init/wait containers only, never by `mass episode`.
        inputs=[
            *input_params("gen", "task", "label", "rollout", "store-prefix", "egress"),
            m.Artifact(
                name="episode-json",
                path="/in/episode.json",
                archive=no_archive(),
                s3=key(k.agent_input, "episode.json"),
            ),
            m.Artifact(
                name="workspace-in",
                path="/in/workspace.tar.gz",
                archive=no_archive(),
                s3=key(k.agent_input, "workspace.tar.gz"),
            ),
            # the rollout's signing key: input artifacts reach the main container only, never a sidecar
            m.Artifact(
                name="episode-key", path=f"/in/{proof.KEY}", archive=no_archive(), s3=key(k.agent_input, proof.KEY)
            ),
        ],
        # checks.json: a guard's checks job (mass_jobs/sandbox/check_job.py) writes it instead of the others;
        # proof.json signs what the harness wrote, so ingest refuses anything else Argo uploads
        outputs=[
            m.Artifact(
                name=n.split(".")[0], path=f"/out/{n}", archive=no_archive(), optional=True, s3=key(k.agent_output, n)
            )
            for n in (*proof.EPISODE_OUTPUTS, *proof.CHECK_OUTPUTS, proof.PROOF)
        ],
        env=[m.EnvVar(name="HOME", value="/tmp")],
        working_dir="/tmp",
        resources=m.ResourceRequirements(**pods.resources(s.harness, s)),
        security_context=m.SecurityContext(**container_security(pods.container_security_context())),
        sidecars=[sandbox, qwen],
        # "workspace" becomes scratch.agent's volume where one is set (mass_jobs.k8s.argo)
        volumes=[
            m.Volume(name=n, empty_dir=m.EmptyDirVolumeSource())
            for n in ("tmp", "out", "sandbox", "sandbox-tmp", "workspace", "qwen", "qwen-tmp")
        ],
        volume_mounts=[
            m.VolumeMount(name="tmp", mount_path="/tmp"),
            m.VolumeMount(name="out", mount_path="/out"),
            m.VolumeMount(name="sandbox", mount_path=SANDBOX_DIR),
            m.VolumeMount(name="qwen", mount_path=QWEN_DIR),
        ],
        # the agent-pods semaphore is the calling steps' (argo_vocab.agent_semaphore), so that this
        # template's pendingTimeout counts the scheduler's wait alone
        active_deadline_seconds=s.agent_deadline_s,
        automount_service_account_token=False,
        metrics=PM.metrics(PM.step_duration(K.AGENT_STEP)),
        labels={
            **L.pod_labels(K.AGENT_STEP, gen=GEN, task=TASK, episode="{{inputs.parameters.label}}"),
            **L.queue_labels(s, plain_pod=True),
        },
        annotations={f"{L.PREFIX}/spec": SPEC},
        retry_strategy=AGENT_RETRY,
    )
