"""The Argo compiler: WorkflowTemplates `mass-cycle` and `mass-run` and a CronWorkflow, built with hera.

`mass render argo --out argo/` writes them. Every container calls a `mass` CLI entry (the same
ones the local runner uses); parameters are small (URIs, ids) and data moves through S3: the
store for steps, Argo S3 artifacts for agent pods, which hold no store credentials.
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

from mass_jobs.k8s import labels as L
from mass_jobs.k8s import manifests as K
from mass_jobs.k8s import pods, serving, training
from mass_jobs.k8s.settings import ClusterSettings
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
OUTPUTS_DIR = "/tmp/outputs"

# What `mass validate SPEC --gen G --outputs DIR` writes (docs/architecture.md, CLI table).
VALIDATE_OUTPUTS = {
    "tasks": "train-tasks.json",  # JSON list of training task ids
    "episodes": "episodes.json",  # JSON list of {"task", "episode"}: the collect fan-out
    "iterations": "search-iterations",  # number of `--iteration` values (0..n-1)
    "model-uri": "model-uri",  # s3:// (or hf://) dir of the generation's model
    "generations": "generations",  # N of the run
    "store-prefix": "store-prefix",  # S3 key prefix of the run (<store prefix>/<run>) in the artifact bucket
}
EP_KEY = "{{inputs.parameters.store-prefix}}/gen-{{inputs.parameters.gen}}/collect/{{inputs.parameters.task}}/ep-{{inputs.parameters.episode}}"
MODEL_FLAGS = ["--endpoint", serving.openai_base_url(ISVC, NAMESPACE), "--served-model", ISVC]

# Retry what can pass on a second try; exit code 2 is a bad spec/input and never will.
STEP_RETRY = m.RetryStrategy(
    limit="3",
    retry_policy="Always",
    expression='lastRetry.status == "Error" or (lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2)',
    backoff=m.Backoff(duration="30s", factor="2", max_duration="30m"),
)
# Agent pods: an episode's own failure is data (status.json); only pod-level errors retry.
AGENT_RETRY = m.RetryStrategy(limit="3", retry_policy="OnError", backoff=m.Backoff(duration="10s", factor="2"))
RESOURCE_RETRY = m.RetryStrategy(limit="3", retry_policy="OnTransientError",
                                 backoff=m.Backoff(duration="30s", factor="2"))
TRAIN_RETRY = m.RetryStrategy(limit="3", retry_policy="Always", backoff=m.Backoff(duration="1m", factor="2"))


def _params(*names: str) -> list[Parameter]:
    return [Parameter(name=n) for n in names]


def _args(**values: str) -> list[Parameter]:
    return [Parameter(name=k.replace("_", "-"), value=v) for k, v in values.items()]


class _Builder:
    """Template factories that share the cluster settings."""

    def __init__(self, s: ClusterSettings):
        self.s = s

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
            env=[m.EnvVar(name="HOME", value="/tmp")],
            env_from=[m.EnvFromSource(secret_ref=m.SecretEnvSource(name=n, optional=(n != s.s3_secret)))
                      for n in secret_refs],
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
        """The sandboxed agent pod: inputs/outputs as Argo S3 artifacts, no store credentials,
        no token, egress limited by the `mass-agent-egress` NetworkPolicy."""
        s = self.s
        return Container(
            name="agent-episode",
            image=s.images.sandbox,
            command=["mass"],
            args=["episode", "--in", "/in", "--out", "/out"],
            # Key-only S3 artifacts: bucket, endpoint and credentials come from the artifact
            # repository and are used by Argo's init/wait containers only, never by `mass episode`.
            inputs=[*_params("gen", "task", "episode", "store-prefix"),
                    m.Artifact(name="episode-json", path="/in/episode.json", s3=m.S3Artifact(key=f"{EP_KEY}/input/episode.json")),
                    # a .tar.gz input is unpacked by Argo into the path
                    m.Artifact(name="workspace-in", path="/in/workspace", s3=m.S3Artifact(key=f"{EP_KEY}/input/workspace.tar.gz"))],
            outputs=[
                m.Artifact(name="trace", path="/out/trace.jsonl", archive=m.ArchiveStrategy(none=m.NoneStrategy()),
                           s3=m.S3Artifact(key=f"{EP_KEY}/output/trace.jsonl")),
                m.Artifact(name="status", path="/out/status.json", archive=m.ArchiveStrategy(none=m.NoneStrategy()),
                           s3=m.S3Artifact(key=f"{EP_KEY}/output/status.json")),
                m.Artifact(name="workspace-out", path="/out/workspace", archive=m.ArchiveStrategy(tar=m.TarStrategy()),
                           s3=m.S3Artifact(key=f"{EP_KEY}/output/workspace.tar.gz")),
            ],
            env=[m.EnvVar(name="HOME", value="/tmp")],
            resources=m.ResourceRequirements(**pods.resources(s.agent, s)),
            security_context=m.SecurityContext(**_sc(pods.container_security_context())),
            volumes=[m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource()),
                     m.Volume(name="out", empty_dir=m.EmptyDirVolumeSource())],
            volume_mounts=[m.VolumeMount(name="tmp", mount_path="/tmp"), m.VolumeMount(name="out", mount_path="/out")],
            active_deadline_seconds=s.agent_deadline_s,
            automount_service_account_token=False,
            labels=L.pod_labels(K.AGENT_STEP, gen=GEN, task=TASK, episode=EPISODE),
            annotations={f"{L.PREFIX}/spec": SPEC},
            retry_strategy=AGENT_RETRY,
        )

    # -------------------------------------------------------------- resources

    def serve_model(self) -> Resource:
        labels = {**L.pod_labels(K.MODEL_STEP, gen=GEN), L.ARGO_WORKFLOW: "{{workflow.name}}"}
        isvc = serving.inference_service(self.s, ISVC, "{{inputs.parameters.model-uri}}", labels)
        return Resource(
            name="serve-model",
            inputs=_params("gen", "model-uri"),
            action="apply",
            manifest=_manifest(isvc),
            success_condition=serving.READY,
            failure_condition=serving.FAILED,
            labels=L.pod_labels(K.MODEL_STEP, gen=GEN),
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

    def train(self) -> Resource:
        # A retry creates a fresh job (`-r<retries>`) that resumes from the last S3 checkpoint.
        name = f"mass-{RUN_ID}-g{GEN}-train-r{{{{retries}}}}"
        labels = {**L.pod_labels("train", gen=GEN), L.ARGO_WORKFLOW: "{{workflow.name}}"}
        job = training.pytorch_job(self.s, name, SPEC, GEN, labels)
        return Resource(
            name="train",
            inputs=_params("gen"),
            action="create",
            set_owner_reference=True,
            manifest=_manifest(job),
            success_condition=training.SUCCEEDED,
            failure_condition=training.FAILED,
            labels=L.pod_labels("train", gen=GEN),
            synchronization=_gpu_semaphore(),
            retry_strategy=TRAIN_RETRY,
        )

    # -------------------------------------------------------------- containers of the cycle

    def containers(self) -> list:
        s = self.s
        base = ["--spec", SPEC, "--gen", GEN]
        per_task = [*base, "--task", TASK]
        per_episode = [*per_task, "--episode", EPISODE]
        validate_outputs = [Parameter(name=k, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{f}"))
                            for k, f in VALIDATE_OUTPUTS.items()]
        return [
            self.step("validate", ["validate", SPEC, "--gen", GEN, "--outputs", OUTPUTS_DIR],
                      outputs=validate_outputs),
            self.step("search", ["search", *per_task, "--iteration", "{{inputs.parameters.iteration}}", *MODEL_FLAGS],
                      inputs=("gen", "task", "iteration"), task=TASK),
            # prepare writes <ep>/input/ in the store, ingest promotes <ep>/output/ (the agent's artifacts).
            self.step("collect-prepare", ["collect", *per_episode, "--phase", "prepare", *MODEL_FLAGS],
                      inputs=("gen", "task", "episode"), task=TASK, episode=EPISODE),
            self.agent(),
            self.step("collect-ingest", ["collect", *per_episode, "--phase", "ingest"],
                      inputs=("gen", "task", "episode"), task=TASK, episode=EPISODE),
            self.step("guard", ["guard", *per_task], inputs=("gen", "task"), task=TASK),
            self.step("rank", ["rank", *per_task, *MODEL_FLAGS], inputs=("gen", "task"), task=TASK),
            self.step("render-sft", ["render", "sft", *base]),
            self.step("select", ["select", *base]),
            self.step("merge", ["merge", *base], pod=s.merge),
            # Judge API keys come from an optional Secret as env (the spec names them: api_key_env).
            # Serves L_0, L_gen-1 and L_gen itself (GPU-sized pod, counted by the GPU semaphore).
            self.step("evaluate", ["evaluate", *base, "--work-dir", "/tmp/work"], env_from=(s.judge_secret,),
                      pod=s.server, gpu_semaphore=True),
            self.step("report", ["report", "--spec", SPEC], inputs=()),
        ]


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
    }


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


def _cycle_steps() -> Steps:
    """One generation; evaluate compares the merged L_gen+1 with L_0 and L_gen (it serves them itself)."""
    v = "{{steps.validate.outputs.parameters.%s}}"
    with Steps(name="cycle", inputs=_params("gen")) as cycle:
        Step(name="validate", template="validate", arguments=_args(gen=GEN))
        Step(name="serve-model", template="serve-model", arguments=_args(gen=GEN, model_uri=v % "model-uri"))
        Step(name="search", template="search-task", with_param=v % "tasks", when=f"{v % 'iterations'} > 0",
             arguments=_args(gen=GEN, task="{{item}}", iteration="0", iterations=v % "iterations"))
        Step(name="collect", template="collect-episode", with_param=v % "episodes",
             arguments=_args(gen=GEN, task="{{item.task}}", episode="{{item.episode}}",
                             store_prefix=v % "store-prefix"))
        Step(name="guard", template="guard", arguments=_args(gen=GEN, task="{{item}}"), with_param=v % "tasks")
        Step(name="rank", template="rank", arguments=_args(gen=GEN, task="{{item}}"), with_param=v % "tasks")
        for name in ("render-sft", "train", "select", "merge"):
            Step(name=name, template=name, arguments=_args(gen=GEN))
        Step(name="evaluate", template="evaluate", arguments=_args(gen=NEXT_GEN))
        Step(name="report", template="report")
    return cycle


def _search_loop() -> Steps:
    """Bounded recursion: one `mass search --iteration K` per call, then K+1 while K+1 < n."""
    nxt = "{{=asInt(inputs.parameters.iteration) + 1}}"
    with Steps(name="search-task", inputs=_params("gen", "task", "iteration", "iterations")) as loop:
        Step(name="iteration", template="search",
             when="{{inputs.parameters.iteration}} < {{inputs.parameters.iterations}}",
             arguments=_args(gen=GEN, task=TASK, iteration="{{inputs.parameters.iteration}}"))
        Step(name="next", template="search-task",
             when="{{=asInt(inputs.parameters.iteration) + 1 < asInt(inputs.parameters.iterations)}}",
             arguments=_args(gen=GEN, task=TASK, iteration=nxt, iterations="{{inputs.parameters.iterations}}"))
    return loop


def _collect_episode() -> Steps:
    """prepare (step pod, store access) -> agent pod (artifacts only) -> ingest (step pod)."""
    a = _args(gen=GEN, task=TASK, episode=EPISODE)
    with Steps(name="collect-episode", inputs=_params("gen", "task", "episode", "store-prefix")) as st:
        Step(name="prepare", template="collect-prepare", arguments=a)
        Step(name="agent", template="agent-episode",
             arguments=[*a, Parameter(name="store-prefix", value="{{inputs.parameters.store-prefix}}")])
        Step(name="ingest", template="collect-ingest", arguments=a)
    return st


def mass_cycle(s: ClusterSettings) -> dict:
    b = _Builder(s)
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
            Step(name="delete-model", template="delete-model", arguments=_args(gen="{{workflow.parameters.gen}}"))
        _cycle_steps()
        _search_loop()
        _collect_episode()
        b.containers()  # templates register themselves with the enclosing WorkflowTemplate
        b.serve_model()
        b.delete_model()
        b.train()
    d = wt.to_dict()
    # hera checks the pull policy against its enum; the chart's value is a Helm placeholder.
    for t in d["spec"]["templates"]:
        if "container" in t:
            t["container"]["imagePullPolicy"] = s.images.pull_policy
    return d


def mass_run(s: ClusterSettings) -> dict:
    """L0 -> L_N: the cycle per generation (bounded recursion); each cycle evaluates its merged model."""
    v = "{{steps.validate.outputs.parameters.%s}}"

    def cycle_ref(gen: str) -> dict:
        return dict(
            template_ref=m.TemplateRef(name=CYCLE, template="cycle"),
            arguments=_args(gen=gen),
            # The model server goes away after each generation, success or not.
            hooks={"exit": m.LifecycleHook(template_ref=m.TemplateRef(name=CYCLE, template="delete-model"),
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
            Step(name="generations", template="chain",
                 arguments=_args(gen="0", generations=v % "generations"))
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
