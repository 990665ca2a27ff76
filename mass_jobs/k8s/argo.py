"""The Argo compiler: WorkflowTemplates `mass-cycle` and `mass-run` and a CronWorkflow, built with hera
from the pipeline table (`mass_jobs.pipeline.PIPELINE`).

`mass render argo --out argo/` writes them. Every container calls a `mass` CLI entry (the same
ones the local runner uses); parameters are small (URIs, ids) and data moves through S3: the
store for steps, Argo S3 artifacts for agent pods, which hold no store credentials.

How a step of the table becomes templates, by scope: `generation` and `run` -> one container
(a `trainer` step -> delete-then-create of a PyTorchJob); `task` -> a container fanned out over the
training tasks; `iteration` -> bounded recursion `<step>-task` over `--iteration K`; `episode` ->
a fan-out (at most `agent_parallelism` at once) of `<step>-episode` = prepare (step pod) -> agent
pod -> ingest (step pod), then `<step>-summary` per task. The generation's InferenceService is
created before the first step that uses the model, only when one of those is not stored yet, and
deleted right after the last of them (and on exit).
"""

from __future__ import annotations

import yaml
from hera.workflows import (
    Container,
    CronWorkflow,
    Parameter,
    Resource,
    Step,
    Steps,
    WorkflowTemplate,
)
from hera.workflows import models as m

from mass_jobs import pipeline as P
from mass_jobs.context import RunContext
from mass_jobs.k8s import labels as L
from mass_jobs.k8s import manifests as K
from mass_jobs.k8s import pods, serving, training
from mass_jobs.k8s.settings import ClusterSettings, helm
from mass_jobs.k8s.yamlio import _Dumper

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
PREV_GEN = "{{=asInt(inputs.parameters.gen) - 1}}"
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
ROLLOUT = "{{inputs.parameters.rollout}}"  # a rollout's dir relative to the run (prepare lists them)
AGENT_TEMPLATE = "agent-episode"
SANDBOX_DIR = "/sandbox"  # the emptyDir both containers of an agent pod mount: the socket, nothing else
SANDBOX_SOCKET = f"{SANDBOX_DIR}/sandbox.sock"
QWEN_DIR = "/qwen"  # the emptyDir of the harness and qwen-code containers only: qwen-code's socket
QWEN_SOCKET = f"{QWEN_DIR}/qwen.sock"
ROLLOUTS_PARAM = "{{steps.prepare.outputs.parameters.rollouts}}"

# Retry what can pass on a second try; exit code 2 is a bad spec/input and never will.
STEP_RETRY = m.RetryStrategy(
    limit="3",
    retry_policy="Always",
    expression='lastRetry.status == "Error" or (lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2)',
    backoff=m.Backoff(duration="30s", factor="2"),  # no maxDuration: it is a deadline on every attempt
)
# Agent pods: `mass episode` exits 1 on infra_error (model endpoint or harness down), and a pod may be
# evicted or hit its deadline: retry those; 2 (a bad episode.json) never passes. The collect step
# continues on a failed agent (continueOn) and ingest records it as an infra_error episode.
AGENT_RETRY = m.RetryStrategy(
    limit="3",
    retry_policy="Always",
    expression='lastRetry.status == "Error" or (lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2)',
    backoff=m.Backoff(duration="10s", factor="2"),
)
RESOURCE_RETRY = m.RetryStrategy(limit="3", retry_policy="OnTransientError",
                                 backoff=m.Backoff(duration="30s", factor="2"))
TRAIN_RETRY = m.RetryStrategy(limit="3", retry_policy="Always", backoff=m.Backoff(duration="1m", factor="2"))


def _params(*names: str) -> list[Parameter]:
    return [Parameter(name=n) for n in names]


def _args(**values: str) -> list[Parameter]:
    return [Parameter(name=k.replace("_", "-"), value=v) for k, v in values.items()]


def _none_archive() -> m.ArchiveStrategy:
    return m.ArchiveStrategy(none=m.NoneStrategy())


class _Builder:
    """Template factories that share the cluster settings."""

    def __init__(self, s: ClusterSettings, pipeline=None):
        self.s = s
        self.steps = P.steps(pipeline)
        self.parallelism: dict[str, int | str] = {}  # template name -> parallelism

    def step_env(self) -> list[m.EnvVar]:
        """Every step and trainer pod: a writable work dir and the store's S3 endpoint and region
        (the spec may leave them to the environment; boto3 reads AWS_ENDPOINT_URL / AWS_REGION)."""
        s = self.s
        return [m.EnvVar(name="HOME", value="/tmp"), m.EnvVar(name="MASS_WORK_DIR", value=WORK_DIR),
                m.EnvVar(name="AWS_ENDPOINT_URL", value=s.s3_endpoint_url),
                m.EnvVar(name="AWS_REGION", value=s.s3_region), m.EnvVar(name="AWS_DEFAULT_REGION", value=s.s3_region)]

    # -------------------------------------------------------------- containers

    def step(self, name: str, args: list[str], *, inputs=("gen",), task: str = "", episode: str = "",
             outputs=None, pod=None, env_from=(), label: str | None = None, gpu_semaphore=False) -> Container:
        """A step pod: store credentials from the S3 Secret, the jobs image, the step retry."""
        s = self.s
        secret_refs = [s.s3_secret, *env_from]
        return Container(
            name=name,
            image=s.images.jobs,
            command=["mass"],
            args=args,
            inputs=_params(*inputs),
            outputs=outputs or None,
            env=self.step_env(),
            env_from=[m.EnvFromSource(secret_ref=m.SecretEnvSource(name=n, optional=(n != s.s3_secret)))
                      for n in secret_refs],
            working_dir="/tmp",
            resources=m.ResourceRequirements(**pods.resources(pod or s.step, s)),
            security_context=m.SecurityContext(**_sc(pods.container_security_context())),
            volumes=[m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource())],
            volume_mounts=[m.VolumeMount(name="tmp", mount_path="/tmp")],
            labels=L.pod_labels(label or name, gen=GEN if "gen" in inputs else "", task=task, episode=episode),
            annotations={f"{L.PREFIX}/spec": SPEC},
            retry_strategy=STEP_RETRY,
            synchronization=_gpu_semaphore() if gpu_semaphore else None,
        )

    def agent(self) -> Container:
        """The sandboxed agent pod of every episode (search, collect, evaluate): inputs/outputs as
        Argo S3 artifacts under the rollout's dir, no store credentials, no token, egress limited
        by the `mass-agent-egress` NetworkPolicy (it selects the agent step label).

        Three uids: the main container (`mass episode --sandbox --qwen`) holds the recording proxy
        and writes /out; the `sandbox` sidecar (`mass sandbox-serve`, SANDBOX_UID) owns the
        workspace and runs every tool and shell command; the `qwen` sidecar (QWEN_UID) runs
        qwen-code on the same workspace volume, its shell commands forwarded to the sandbox. They
        share Unix sockets' emptyDirs and the loopback, nothing else: no code the model wrote can
        reach /out, qwen-code's environment (the proxy's token) or its pipes, and the proxy serves
        only the harness's and qwen-code's uids (see mass_jobs/sandbox_service.py). Argo stops the
        sidecars when the main container exits.

        Every artifact is `archive: none`: Argo's executor would otherwise untar a .tar.gz input
        and rename its single top-level entry onto the path, and tar an output directory under
        its own base name (argo-workflows workflow/executor/executor.go, loadArtifacts and
        stageArchiveFile, v4.1.2); `mass episode` unpacks and packs the store's own archive format.
        Outputs are optional: a pod killed at its deadline leaves none, ingest records that."""
        s = self.s
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
            env=[m.EnvVar(name="HOME", value="/tmp")],
            working_dir="/tmp",
            resources=m.ResourceRequirements(**pods.resources(s.agent, s)),
            security_context=m.SecurityContext(**_sc(pods.sandbox_security_context())),
            volume_mounts=[m.VolumeMount(name="sandbox-tmp", mount_path="/tmp"),
                           m.VolumeMount(name="workspace", mount_path="/workspace"),
                           m.VolumeMount(name="sandbox", mount_path=SANDBOX_DIR)],
        )
        qwen = m.UserContainer(
            name="qwen",
            image=s.images.sandbox,
            image_pull_policy=s.images.pull_policy,
            command=["mass"],
            args=["sandbox-serve", "--socket", QWEN_SOCKET, "--workspace", "/workspace/ws", "--qwen-only",
                  "--shell-socket", SANDBOX_SOCKET],
            env=[m.EnvVar(name="HOME", value="/tmp"),
                 # qwen-code is on the sandbox image's PATH; name it so the harness never guesses.
                 m.EnvVar(name="MASS_QWEN_BIN", value="/usr/local/bin/qwen")],
            working_dir="/tmp",
            resources=m.ResourceRequirements(**pods.resources(s.agent, s)),
            security_context=m.SecurityContext(**_sc(pods.qwen_security_context())),
            volume_mounts=[m.VolumeMount(name="qwen-tmp", mount_path="/tmp"),
                           m.VolumeMount(name="workspace", mount_path="/workspace"),
                           m.VolumeMount(name="sandbox", mount_path=SANDBOX_DIR),
                           m.VolumeMount(name="qwen", mount_path=QWEN_DIR)],
        )
        return Container(
            name=AGENT_TEMPLATE,
            image=s.images.sandbox,
            command=["mass"],
            args=["episode", "--in", "/in", "--out", "/out", "--sandbox", SANDBOX_SOCKET, "--qwen", QWEN_SOCKET,
                  "--qwen-uid", str(pods.QWEN_UID)],
            # Key-only S3 artifacts: bucket, endpoint and credentials come from the artifact
            # repository and are used by Argo's init/wait containers only, never by `mass episode`.
            inputs=[*_params("gen", "task", "label", "rollout", "store-prefix"),
                    m.Artifact(name="episode-json", path="/in/episode.json", archive=_none_archive(),
                               s3=key(k.agent_input, "episode.json")),
                    m.Artifact(name="workspace-in", path="/in/workspace.tar.gz", archive=_none_archive(),
                               s3=key(k.agent_input, "workspace.tar.gz"))],
            # checks.json: a guard's checks job (mass_jobs/check_job.py) writes it instead of the others
            outputs=[m.Artifact(name=n.split(".")[0], path=f"/out/{n}", archive=_none_archive(), optional=True,
                                s3=key(k.agent_output, n))
                     for n in ("trace.jsonl", "status.json", "workspace.tar.gz", "checks.json")],
            env=[m.EnvVar(name="HOME", value="/tmp")],
            working_dir="/tmp",
            resources=m.ResourceRequirements(**pods.resources(s.harness, s)),
            security_context=m.SecurityContext(**_sc(pods.container_security_context())),
            sidecars=[sandbox, qwen],
            volumes=[m.Volume(name=n, empty_dir=m.EmptyDirVolumeSource())
                     for n in ("tmp", "out", "sandbox", "sandbox-tmp", "workspace", "qwen", "qwen-tmp")],
            volume_mounts=[m.VolumeMount(name="tmp", mount_path="/tmp"), m.VolumeMount(name="out", mount_path="/out"),
                           m.VolumeMount(name="sandbox", mount_path=SANDBOX_DIR),
                           m.VolumeMount(name="qwen", mount_path=QWEN_DIR)],
            active_deadline_seconds=s.agent_deadline_s,
            # a fan-out's parallelism bounds one task's rollouts; this bounds them all (agent.parallelism)
            synchronization=m.Synchronization(semaphores=[m.SemaphoreRef(
                config_map_key_ref=m.ConfigMapKeySelector(name=K.SEMAPHORES, key=K.AGENT_SEMAPHORE_KEY))]),
            automount_service_account_token=False,
            labels=L.pod_labels(K.AGENT_STEP, gen=GEN, task=TASK, episode="{{inputs.parameters.label}}"),
            annotations={f"{L.PREFIX}/spec": SPEC},
            retry_strategy=AGENT_RETRY,
        )

    def rollouts(self, sd: P.StepDef, ingest_argv: list[str], inputs: tuple[str, ...]) -> None:
        """`<step>-ingest`, `<step>-rollout` (agent pod -> ingest) and `<step>-rollouts`, the fan-out
        over what `<step>-prepare` listed (at most `agent_parallelism` at once)."""
        task = TASK if "task" in inputs else ""
        self.step(f"{sd.name}-ingest", [*ingest_argv, "--phase", "ingest", "--rollout", "{{inputs.parameters.rollout}}",
                                       "--agent-status", "{{inputs.parameters.agent-status}}"],
                  inputs=(*inputs, "rollout", "agent-status"), task=task)
        _rollout(sd.name, inputs)
        with Steps(name=f"{sd.name}-rollouts", inputs=_params(*inputs, "rollouts", "store-prefix")):
            own = {n: "{{inputs.parameters.%s}}" % n for n in inputs}
            Step(name="rollout", template=f"{sd.name}-rollout", with_param="{{inputs.parameters.rollouts}}",
                 arguments=[*(Parameter(name=n, value=v) for n, v in own.items()),
                            *_args(rollout="{{item.rollout}}", model_gen="{{item.gen}}", item_task="{{item.task}}",
                                   label="{{item.label}}", store_prefix="{{inputs.parameters.store-prefix}}")])
        self.parallelism[f"{sd.name}-rollouts"] = self.s.agent_parallelism

    # -------------------------------------------------------------- resources

    def serve_model(self) -> Resource:
        labels = {**L.pod_labels(K.MODEL_STEP, gen=GEN), L.ARGO_WORKFLOW: "{{workflow.name}}"}
        isvc = serving.inference_service(self.s, ISVC, "{{inputs.parameters.model-uri}}", labels,
                                         dtype="{{inputs.parameters.dtype}}")
        return Resource(
            name="serve-model",
            inputs=_params("gen", "model-uri", "dtype"),
            action="apply",
            # Owned by the workflow: `argo terminate` / delete garbage-collects the GPU predictor.
            set_owner_reference=True,
            manifest=_manifest(isvc),
            success_condition=serving.READY,
            failure_condition=serving.FAILED,
            labels=L.pod_labels(K.MODEL_STEP, gen=GEN),
            active_deadline_seconds=self.s.serve_deadline_s,
            retry_strategy=RESOURCE_RETRY,
        )

    def delete_model(self) -> Resource:
        ref = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": ISVC}}
        return Resource(
            name="delete-model",
            inputs=_params("gen"),
            action="delete",
            flags=["--ignore-not-found"],
            manifest=_manifest(ref),
            labels=L.pod_labels("delete-model", gen=GEN),
            retry_strategy=RESOURCE_RETRY,
        )

    def trainer(self, sd: P.StepDef) -> None:
        """A trainer step: delete any job of an earlier attempt, then create one (a retry of the
        pair resumes from the last stored checkpoint). The job is named from the run, never from the
        workflow or `{{retries}}`: a retry, `argo retry` and a resubmitted run (its stopped workflow's
        job still training) all find and replace the one job that writes the run's checkpoints."""
        name = training.job_name(RUN_ID, GEN, sd.name)
        labels = {**L.pod_labels(sd.name, gen=GEN), L.ARGO_WORKFLOW: "{{workflow.name}}"}
        sizes = {k: "{{inputs.parameters.trainer-%s}}" % k for k in ("workers", "nproc", "gpus")}
        job = training.pytorch_job(self.s, name, sd.argv(SPEC, GEN), labels, env=_env_dicts(self.step_env()), **sizes)
        ref = {"apiVersion": job["apiVersion"], "kind": job["kind"], "metadata": {"name": name}}
        # replicas is an integer: its placeholder must not be quoted in the manifest text
        manifest = _manifest(job).replace(f"replicas: '{sizes['workers']}'", f"replicas: {sizes['workers']}")
        params = ("gen", "trainer-workers", "trainer-nproc", "trainer-gpus")
        Resource(
            name=f"{sd.name}-delete-job",
            inputs=_params("gen"),
            action="delete",
            # --wait (kubectl's default) waits for the job object only; foreground cascade makes it
            # wait until the job's pods are gone too, so the old Master cannot write a checkpoint
            # after the new job starts.
            flags=["--ignore-not-found", "--cascade=foreground"],
            manifest=_manifest(ref),
            labels=L.pod_labels(sd.name, gen=GEN),
            retry_strategy=RESOURCE_RETRY,
        )
        # One replica: the Master alone (the operator's webhook refuses `Worker.replicas: 0`).
        single = training.pytorch_job(self.s, name, sd.argv(SPEC, GEN), labels, env=_env_dicts(self.step_env()),
                                      **{**sizes, "workers": None})
        for suffix, text, inputs in (("job", manifest, params),
                                     ("job-single", _manifest(single), tuple(p for p in params if p != "trainer-workers"))):
            Resource(
                name=f"{sd.name}-{suffix}",
                inputs=_params(*inputs),
                action="create",
                set_owner_reference=True,
                manifest=text,
                success_condition=training.SUCCEEDED,
                failure_condition=training.FAILED,
                labels=L.pod_labels(sd.name, gen=GEN),
                synchronization=_gpu_semaphore(),
                active_deadline_seconds=self.s.train_deadline_s,
            )
        with Steps(name=sd.name, inputs=_params(*params), retry_strategy=TRAIN_RETRY):
            Step(name="delete-job", template=f"{sd.name}-delete-job", arguments=_args(gen=GEN))
            workers = "{{inputs.parameters.trainer-workers}}"
            Step(name="job", template=f"{sd.name}-job", when=f"{workers} > 0",
                 arguments=[Parameter(name=p, value="{{inputs.parameters.%s}}" % p) for p in params])
            Step(name="job-single", template=f"{sd.name}-job-single", when=f"{workers} == 0",
                 arguments=[Parameter(name=p, value="{{inputs.parameters.%s}}" % p) for p in params
                            if p != "trainer-workers"])

    # -------------------------------------------------------------- the table's steps

    def validate(self) -> Container:
        names = {**VALIDATE_OUTPUTS, **{P.done_output(sd.name): P.done_output(sd.name) for sd in self.steps
                                         if sd.scope != "run"}}
        outputs = [Parameter(name=k, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{f}")) for k, f in names.items()]
        # The chart's values the preflight checks: validate refuses a spec the cluster cannot run.
        chart = [f"--chart-value={key}={value}" for key, value in self.chart_values().items()]
        return self.step("validate", ["validate", SPEC, "--gen", GEN, "--outputs", OUTPUTS_DIR, "--run", RUN_ID,
                                      "--artifact-bucket", self.s.bucket,
                                      # one argument: the chart's value is an unquoted Helm action
                                      f"--max-model-len={self.s.max_model_len}", *chart],
                         outputs=outputs)

    def chart_values(self) -> dict[str, str]:
        """Chart values (dotted keys) the validate step hands the preflight (mass_jobs/preflight.py)."""
        s = self.s
        keys = helm('join "," .Values.judges.keys') if s.chart else ",".join(s.judge_keys)
        return {"model.toolCallParser": s.tool_call_parser, "model.reasoningParser": s.reasoning_parser,
                "agent.activeDeadlineSeconds": helm(".Values.agent.activeDeadlineSeconds") if s.chart
                else s.agent_deadline_s, "judges.keys": keys}

    def templates_of(self, sd: P.StepDef) -> None:
        """The templates of one table step (they register with the enclosing WorkflowTemplate)."""
        s = self.s
        model = ["--endpoint", serving.openai_base_url(ISVC, NAMESPACE, self.s.cluster_domain),
                 "--served-model", ISVC] if sd.model else []
        rollouts_out = [Parameter(name="rollouts", value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/rollouts"))]
        if sd.scope == "iteration" and sd.pod == "agent":
            # prepare (proposal, agent inputs) -> agent pods -> ingest each -> judge and save
            argv = [*sd.argv(SPEC, GEN, TASK), "--iteration", "{{inputs.parameters.iteration}}"]
            self.step(f"{sd.name}-prepare", [*argv, "--phase", "prepare", *model, "--outputs", OUTPUTS_DIR],
                      inputs=("gen", "task", "iteration"), task=TASK, outputs=rollouts_out)
            self.rollouts(sd, sd.argv(SPEC, GEN, TASK), ("gen", "task"))
            self.step(f"{sd.name}-finish", [*argv, "--agent-pods", *model], inputs=("gen", "task", "iteration"), task=TASK)
            it = _args(gen=GEN, task=TASK, iteration="{{inputs.parameters.iteration}}")
            with Steps(name=sd.name, inputs=_params("gen", "task", "iteration", "store-prefix")):
                Step(name="prepare", template=f"{sd.name}-prepare", arguments=it)
                Step(name="rollouts", template=f"{sd.name}-rollouts",
                     arguments=_args(gen=GEN, task=TASK, rollouts=ROLLOUTS_PARAM,
                                     store_prefix="{{inputs.parameters.store-prefix}}"))
                Step(name="finish", template=f"{sd.name}-finish", arguments=it)
            _recursion(sd.name)
        elif sd.scope == "iteration":
            self.step(sd.name, [*sd.argv(SPEC, GEN, TASK), "--iteration", "{{inputs.parameters.iteration}}", *model],
                      inputs=("gen", "task", "iteration"), task=TASK)
            _recursion(sd.name, agent=False)
        elif sd.scope == "episode":
            argv = [*sd.argv(SPEC, GEN, TASK), "--episode", EPISODE]
            # prepare writes the agent's input in the store and says whether an agent pod must run.
            self.step(f"{sd.name}-prepare", [*argv, "--phase", "prepare", *model, "--outputs", OUTPUTS_DIR],
                      inputs=("gen", "task", "episode"), task=TASK, episode=EPISODE,
                      outputs=[Parameter(name=n, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{n}"))
                               for n in ("agent", "rollout")])
            self.step(f"{sd.name}-ingest", [*argv, "--phase", "ingest", "--agent-status", "{{inputs.parameters.agent-status}}"],
                      inputs=("gen", "task", "episode", "agent-status"), task=TASK, episode=EPISODE)
            self.step(f"{sd.name}-summary", [*sd.argv(SPEC, GEN, TASK), "--phase", "summarize"],
                      inputs=("gen", "task"), task=TASK)
            _episode(sd.name)
            _episode_fanout(sd.name, s.agent_parallelism)
            # set on the dict: hera wants an int, the chart's value is a Helm placeholder
            self.parallelism[sd.name] = s.agent_parallelism
        elif sd.pod == "trainer":
            self.trainer(sd)
        elif sd.scope == "task" and sd.pod == "agent":
            # prepare (the jobs, listed) -> agent pods -> ingest each -> finish with their results
            argv = sd.argv(SPEC, GEN, TASK)
            self.step(f"{sd.name}-prepare", [*argv, "--phase", "prepare", *model, "--outputs", OUTPUTS_DIR],
                      inputs=("gen", "task"), task=TASK, outputs=rollouts_out)
            self.rollouts(sd, argv, ("gen", "task"))
            self.step(f"{sd.name}-finish", [*argv, "--agent-pods", *model], inputs=("gen", "task"), task=TASK)
            a = _args(gen=GEN, task=TASK)
            with Steps(name=sd.name, inputs=_params("gen", "task", "store-prefix")):
                Step(name="prepare", template=f"{sd.name}-prepare", arguments=a)
                Step(name="rollouts", template=f"{sd.name}-rollouts",
                     arguments=_args(gen=GEN, task=TASK, rollouts=ROLLOUTS_PARAM,
                                     store_prefix="{{inputs.parameters.store-prefix}}"))
                Step(name="finish", template=f"{sd.name}-finish", arguments=a)
        elif sd.scope == "task":
            self.step(sd.name, [*sd.argv(SPEC, GEN, TASK), *model], inputs=("gen", "task"), task=TASK)
        elif sd.scope == "run":
            self.step(sd.name, [*sd.argv(SPEC, GEN), *model], inputs=())
        elif sd.pod == "agent":
            self.generation_rollouts(sd)
        else:
            self.step(sd.name, [*sd.argv(SPEC, GEN), *model], pod=getattr(s, sd.resources))

    def generation_rollouts(self, sd: P.StepDef) -> None:
        """A generation step whose episodes run in agent pods against InferenceServices of the
        generations it names (evaluate of G: L_0, L_G-1, L_G), created and deleted here like the
        generation's own model: plan (which to serve) -> serve -> prepare -> agent pods -> ingest
        each -> finish -> release. The step pods are CPU pods: the judges are external endpoints."""
        flags = []
        for g in ("0", PREV_GEN, GEN):  # evaluate of G compares L_G with L_0 and L_G-1
            isvc = serving.isvc_name(RUN_ID, g)
            flags += ["--generation-endpoint", g, serving.openai_base_url(isvc, NAMESPACE, self.s.cluster_domain), isvc]
        argv = sd.argv(SPEC, GEN)
        self.step(f"{sd.name}-plan", [*argv, "--phase", "plan", "--outputs", OUTPUTS_DIR],
                  outputs=[Parameter(name="models", value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/models"))])
        self.step(f"{sd.name}-prepare", [*argv, "--phase", "prepare", *flags, "--outputs", OUTPUTS_DIR],
                  outputs=[Parameter(name="rollouts", value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/rollouts"))])
        self.rollouts(sd, argv, ("gen",))
        # judge API keys come from an optional Secret (the spec names them: api_key_env)
        self.step(f"{sd.name}-finish", [*argv, "--agent-pods", *flags], env_from=(self.s.judge_secret,))
        served = "{{steps.plan.outputs.parameters.models}}"
        with Steps(name=sd.name, inputs=_params("gen", "store-prefix")):
            Step(name="plan", template=f"{sd.name}-plan", arguments=_args(gen=GEN))
            # the agent inputs name the InferenceServices' URLs: they exist before prepare runs
            Step(name="serve", template="serve-model", with_param=served,
                 arguments=_args(gen="{{item.gen}}", model_uri="{{item.model-uri}}", dtype="{{item.dtype}}"))
            Step(name="prepare", template=f"{sd.name}-prepare", arguments=_args(gen=GEN))
            Step(name="rollouts", template=f"{sd.name}-rollouts",
                 arguments=_args(gen=GEN, rollouts=ROLLOUTS_PARAM, store_prefix="{{inputs.parameters.store-prefix}}"))
            Step(name="finish", template=f"{sd.name}-finish", arguments=_args(gen=GEN))
            Step(name="release", template="delete-model", with_param=served, arguments=_args(gen="{{item.gen}}"))

    def cycle(self) -> Steps:
        """One generation in table order, behind a per-run mutex (one InferenceService name per run)."""
        gen_steps = [sd for sd in self.steps if sd.scope != "run"]
        model_steps = [i for i, sd in enumerate(gen_steps) if sd.model]
        first_model, last_model = (model_steps[0], model_steps[-1]) if model_steps else (-1, -1)
        sync = m.Synchronization(mutexes=[m.Mutex(name=f"mass-run-{RUN_ID}")])
        with Steps(name="cycle", inputs=_params("gen"), synchronization=sync) as cycle:
            Step(name="validate", template="validate", arguments=_args(gen=GEN))
            for i, sd in enumerate(gen_steps):
                if i == first_model:
                    Step(name="serve-model", template="serve-model", when=f"{V % 'needs-model'} == true",
                         arguments=_args(gen=GEN, model_uri=V % "model-uri", dtype=V % "dtype"))
                _cycle_step(sd)
                if i == last_model:  # its last user is done: free the GPU before training
                    Step(name="release-model", template="delete-model", arguments=_args(gen=GEN))
            for sd in self.steps:
                if sd.scope == "run":
                    _cycle_step(sd)
        return cycle


def _cycle_step(sd: P.StepDef) -> None:
    done = f"{V % P.done_output(sd.name)} == false"
    if sd.scope == "iteration":
        Step(name=sd.name, template=f"{sd.name}-task", with_param=V % "tasks", when=f"{V % 'iterations'} > 0",
             arguments=_args(gen=GEN, task="{{item}}", iteration="0", iterations=V % "iterations",
                             **({"store_prefix": V % "store-prefix"} if sd.pod == "agent" else {})))
    elif sd.scope == "episode":
        Step(name=sd.name, template=sd.name,
             arguments=_args(gen=GEN, episodes=V % "episodes", store_prefix=V % "store-prefix"))
        Step(name=f"{sd.name}-summary", template=f"{sd.name}-summary", with_param=V % "tasks",
             arguments=_args(gen=GEN, task="{{item}}"))
    elif sd.scope == "task":
        Step(name=sd.name, template=sd.name, with_param=V % "tasks",
             arguments=_args(gen=GEN, task="{{item}}", **({"store_prefix": V % "store-prefix"} if sd.pod == "agent" else {})))
    elif sd.scope == "run":
        Step(name=sd.name, template=sd.name)
    else:
        # GPU pods and InferenceServices start only when the step is not stored yet (a finished run
        # costs no GPU).
        gpu = sd.pod in ("trainer", "server", "agent")
        sizes = {k.replace("-", "_"): V % k for k in ("trainer-workers", "trainer-nproc", "trainer-gpus")}
        extra = sizes if sd.pod == "trainer" else ({"store_prefix": V % "store-prefix"} if sd.pod == "agent" else {})
        Step(name=sd.name, template=sd.name, when=done if gpu else None,
             arguments=_args(gen=NEXT_GEN if sd.gen_offset else GEN, **extra))


def _recursion(name: str, agent: bool = True) -> Steps:
    """Bounded recursion: one iteration K per call (`mass <step> --iteration K`, or its prepare ->
    agent pods -> finish), then K+1 while K+1 < n."""
    nxt = "{{=asInt(inputs.parameters.iteration) + 1}}"
    sp = {"store_prefix": "{{inputs.parameters.store-prefix}}"} if agent else {}
    with Steps(name=f"{name}-task", inputs=_params("gen", "task", "iteration", "iterations",
                                                    *(["store-prefix"] if agent else []))) as loop:
        Step(name="iteration", template=name,
             when="{{inputs.parameters.iteration}} < {{inputs.parameters.iterations}}",
             arguments=_args(gen=GEN, task=TASK, iteration="{{inputs.parameters.iteration}}", **sp))
        Step(name="next", template=f"{name}-task",
             when="{{=asInt(inputs.parameters.iteration) + 1 < asInt(inputs.parameters.iterations)}}",
             arguments=_args(gen=GEN, task=TASK, iteration=nxt, iterations="{{inputs.parameters.iterations}}", **sp))
    return loop


def _episode(name: str) -> Steps:
    """prepare (step pod, store access) -> agent pod (artifacts only) -> ingest (step pod).

    The agent runs only when prepare says so (not for a skipped task or a stored episode); a failed
    agent (retries spent, deadline) does not fail the generation: ingest, told the agent step's
    phase, records infra_error."""
    a = _args(gen=GEN, task=TASK, episode=EPISODE)
    agent = "{{steps.prepare.outputs.parameters.agent}} == true"
    with Steps(name=f"{name}-episode", inputs=_params("gen", "task", "episode", "store-prefix")) as st:
        Step(name="prepare", template=f"{name}-prepare", arguments=a)
        Step(name="agent", template=AGENT_TEMPLATE, when=agent, continue_on=m.ContinueOn(failed=True, error=True),
             arguments=_args(gen=GEN, task=TASK, label=EPISODE, rollout="{{steps.prepare.outputs.parameters.rollout}}",
                             store_prefix="{{inputs.parameters.store-prefix}}"))
        Step(name="ingest", template=f"{name}-ingest", when=agent,
             arguments=[*a, Parameter(name="agent-status", value="{{steps.agent.status}}")])
    return st


def _rollout(name: str, inputs: tuple[str, ...]) -> Steps:
    """One listed rollout: its agent pod (a failed one, retries spent, does not fail the step), then
    `<step>-ingest`, told the agent's phase (no output after Failed/Error: an infra_error episode)."""
    own = {n: "{{inputs.parameters.%s}}" % n for n in inputs}
    with Steps(name=f"{name}-rollout", inputs=_params(*inputs, "rollout", "model-gen", "item-task", "label",
                                                       "store-prefix")) as st:
        Step(name="agent", template=AGENT_TEMPLATE, continue_on=m.ContinueOn(failed=True, error=True),
             arguments=_args(gen="{{inputs.parameters.model-gen}}", task="{{inputs.parameters.item-task}}",
                             label="{{inputs.parameters.label}}", rollout=ROLLOUT,
                             store_prefix="{{inputs.parameters.store-prefix}}"))
        Step(name="ingest", template=f"{name}-ingest",
             arguments=[*(Parameter(name=n, value=v) for n, v in own.items()),
                        *_args(rollout=ROLLOUT, agent_status="{{steps.agent.status}}")])
    return st


def _episode_fanout(name: str, parallelism) -> Steps:
    """All episodes of the generation, at most `parallelism` at once (one predictor serves them).

    A steps template's `parallelism` counts its active children of type Pod, Steps or DAG, so each
    collect-episode (a Steps node: prepare, agent, ingest) takes one slot (argo-workflows v4.1.2
    workflow/controller/operator.go, checkParallelism and countActiveChildren). It is an integer
    field, not a parameter, hence a chart value rather than the spec's execution.concurrency."""
    with Steps(name=name, inputs=_params("gen", "episodes", "store-prefix")) as st:
        Step(name="episode", template=f"{name}-episode", with_param="{{inputs.parameters.episodes}}",
             arguments=_args(gen=GEN, task="{{item.task}}", episode="{{item.episode}}",
                             store_prefix="{{inputs.parameters.store-prefix}}"))
    return st


def _delete_models() -> Steps:
    """Every InferenceService a cycle of generation g may have made: L_g (the inner loop), and
    L_0 and L_g+1 (evaluate); absent ones are no error. The exit handler's, success or not."""
    with Steps(name="delete-models", inputs=_params("gen")) as st:
        with st.parallel():
            for name, gen in (("gen", GEN), ("next", NEXT_GEN), ("base", "0")):
                Step(name=name, template="delete-model", arguments=_args(gen=gen))
    return st


def _gpu_semaphore() -> m.Synchronization:
    return m.Synchronization(semaphores=[m.SemaphoreRef(
        config_map_key_ref=m.ConfigMapKeySelector(name=K.SEMAPHORES, key=K.GPU_SEMAPHORE_KEY))])


def _sc(d: dict) -> dict:
    """Container security context dict -> hera model kwargs."""
    return {
        "allow_privilege_escalation": d["allowPrivilegeEscalation"],
        "read_only_root_filesystem": d["readOnlyRootFilesystem"],
        "run_as_non_root": d["runAsNonRoot"],
        "capabilities": m.Capabilities(drop=d["capabilities"]["drop"]),
        "seccomp_profile": m.SeccompProfile(type=d["seccompProfile"]["type"]),
        **({"run_as_user": d["runAsUser"], "run_as_group": d["runAsGroup"]} if "runAsUser" in d else {}),
    }


def step_env_dicts(s: ClusterSettings) -> list[dict]:
    """The step pods' env as plain dicts (for the PyTorchJob base in manifests/)."""
    return _env_dicts(_Builder(s).step_env())


def _env_dicts(env: list[m.EnvVar]) -> list[dict]:
    return [{"name": e.name, "value": e.value} for e in env]


def _manifest(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=True, width=10**9, default_flow_style=False)


def _workflow_defaults(s: ClusterSettings) -> dict:
    ps = pods.pod_security_context()
    return dict(
        namespace=s.namespace,
        labels=L.object_labels("workflow", s.chart),
        service_account_name=K.WORKFLOW_SA,
        automount_service_account_token=False,
        executor=m.ExecutorConfig(service_account_name=K.EXECUTOR_SA),
        security_context=m.PodSecurityContext(
            run_as_non_root=ps["runAsNonRoot"], run_as_user=ps["runAsUser"], run_as_group=ps["runAsGroup"],
            fs_group=ps["fsGroup"], seccomp_profile=m.SeccompProfile(type="RuntimeDefault")),
        artifact_repository_ref=m.ArtifactRepositoryRef(config_map=K.ARTIFACT_REPOSITORIES, key=K.ARTIFACT_KEY),
        pod_gc=m.PodGC(strategy="OnPodSuccess", delete_delay_duration="10m"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=604800),
        workflow_metadata=m.WorkflowMetadata(labels_from={
            L.RUN: m.LabelValueFrom(expression="workflow.parameters.run")}),
    )


def mass_cycle(s: ClusterSettings, pipeline=None) -> dict:
    b = _Builder(s, pipeline)
    with WorkflowTemplate(
        name=CYCLE,
        entrypoint="main",
        on_exit="exit-handler",
        arguments=[Parameter(name="spec", description="s3:// URI of the run spec"),
                   Parameter(name="run", description="the spec's name (pod label, model name)"),
                   Parameter(name="gen", value="0", description="generation to run: L_gen -> L_gen+1")],
        **_workflow_defaults(s),
    ) as wt:
        with Steps(name="main"):
            Step(name="cycle", template="cycle", arguments=_args(gen="{{workflow.parameters.gen}}"))
        with Steps(name="exit-handler"):
            Step(name="delete-models", template="delete-models", arguments=_args(gen="{{workflow.parameters.gen}}"))
        b.cycle()
        b.validate()
        for sd in b.steps:
            b.templates_of(sd)  # templates register themselves with the enclosing WorkflowTemplate
        b.agent()
        b.serve_model()
        b.delete_model()
        _delete_models()
    d = wt.to_dict()
    for t in d["spec"]["templates"]:
        if "container" in t:
            # hera checks the pull policy against its enum; the chart's value is a Helm placeholder.
            t["container"]["imagePullPolicy"] = s.images.pull_policy
        if t["name"] in b.parallelism:
            t["parallelism"] = b.parallelism[t["name"]]
    return d


def mass_run(s: ClusterSettings) -> dict:
    """L0 -> L_N: the cycle per generation (bounded recursion); each cycle evaluates its merged model."""

    def cycle_ref(gen: str) -> dict:
        return dict(
            template_ref=m.TemplateRef(name=CYCLE, template="cycle"),
            arguments=_args(gen=gen),
            # The model server goes away after each generation, success or not.
            hooks={"exit": m.LifecycleHook(template_ref=m.TemplateRef(name=CYCLE, template="delete-models"),
                                           arguments=m.Arguments(parameters=[m.Parameter(name="gen", value=gen)]))},
        )

    with WorkflowTemplate(
        name=RUN,
        entrypoint="main",
        arguments=[Parameter(name="spec", description="s3:// URI of the run spec"),
                   Parameter(name="run", description="the spec's name (pod label, model name)")],
        **_workflow_defaults(s),
    ) as wt:
        with Steps(name="main"):
            Step(name="validate", template_ref=m.TemplateRef(name=CYCLE, template="validate"),
                 arguments=_args(gen="0"))
            # A finished run (a scheduled re-submission) does nothing and starts no GPU.
            Step(name="generations", template="chain", when=f"{V % 'run-done'} == false",
                 arguments=_args(gen="0", generations=V % "generations"))
        with Steps(name="chain", inputs=_params("gen", "generations")):
            Step(name="cycle", **cycle_ref(GEN))
            Step(name="next", template="chain",
                 when="{{=asInt(inputs.parameters.gen) + 1 < asInt(inputs.parameters.generations)}}",
                 arguments=_args(gen="{{=asInt(inputs.parameters.gen) + 1}}",
                                 generations="{{inputs.parameters.generations}}"))
    return wt.to_dict()


def cron(s: ClusterSettings) -> dict:
    """A schedule for `mass-run`; it only references the template (suspended until configured)."""
    with CronWorkflow(
        name=CRON,
        namespace=s.namespace,
        labels=L.object_labels("schedule", s.chart),
        schedules=["0 0 * * *"],  # replaced below: the settings may hold a Helm placeholder
        timezone=s.cron_timezone,
        concurrency_policy="Forbid",
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=3,
        workflow_template_ref=m.WorkflowTemplateRef(name=RUN),
        arguments=[Parameter(name="spec", value=s.cron_spec), Parameter(name="run", value=s.cron_run)],
    ) as cw:
        pass
    d = cw.to_dict()
    d["spec"]["schedules"] = s.schedules if isinstance(s.schedules, str) else list(s.schedules)
    d["spec"]["suspend"] = s.cron_suspend
    return d
