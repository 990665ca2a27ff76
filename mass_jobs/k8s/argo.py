"""The Argo compiler: WorkflowTemplates `mass-cycle` and `mass-run` and a CronWorkflow, built with hera
from the pipeline table (`mass_jobs.pipeline.table.PIPELINE`).

`mass render argo --out argo/` writes them. Every container calls a `mass` CLI entry (the same
ones the local runner uses); parameters are small (URIs, ids) and data moves through S3: the
store for steps, Argo S3 artifacts for agent pods, which hold no store credentials.

How a step of the table becomes templates, by its shape (`pipeline.SHAPES`): `Container` -> one
container (`Trainer` -> delete-then-create of a PyTorchJob); `TaskFanout` -> a container fanned out
over the training tasks, `TaskRollouts` its prepare -> agent pods -> finish; `Recursion` -> bounded
recursion `<step>-task` over `--iteration K`; `GenerationRollouts` -> its rounds one at a time
(serve, prepare -> agent pods -> self-verdicts, release), then finish; `EpisodeFanout` -> a fan-out
(at most `agent_parallelism` at once) of `<step>-episode` = prepare (step pod) -> agent pod ->
ingest (step pod), then `<step>-summary` per task. The generation's InferenceService is created
before the first step that uses the model, only when one of those is not stored yet, and deleted
right after the last of them (and on exit).

The names and retries all templates share are `argo_vocab`, the Steps templates that order them
`argo_flow`, the sandboxed agent pod `agent_template`.
"""

from __future__ import annotations

from dataclasses import replace

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

from mass_jobs.episodes.rollouts import ROLLOUTS_OUTPUT, ROUNDS_OUTPUT
from mass_jobs.k8s import egress_proxy as EP
from mass_jobs.k8s import labels as L
from mass_jobs.k8s import manifests as K
from mass_jobs.k8s import pods, serving, training
from mass_jobs.k8s import prometheus as PM
from mass_jobs.k8s.agent_template import agent_container
from mass_jobs.k8s.argo_flow import (
    cycle_step,
    delete_models_steps,
    episode_fanout,
    episode_steps,
    recursion,
    rollout_steps,
)
from mass_jobs.k8s.argo_vocab import (
    AGENT_TEMPLATE,
    CRON,
    CYCLE,
    EGRESS_IN,
    EGRESS_TEMPLATE,
    EPISODE,
    GEN,
    ISVC,
    NAMESPACE,
    OUTPUTS_DIR,
    RESOURCE_RETRY,
    ROLLOUTS_PARAM,
    RUN,
    RUN_ID,
    SERVE_WAIT,
    SPEC,
    STEP_RETRY,
    TASK,
    TRAIN_RETRY,
    VALIDATE_OUTPUTS,
    WORK_DIR,
    V,
    container_security,
    gpu_semaphore,
    input_params,
    step_args,
)
from mass_jobs.k8s.settings import SCRATCH_CLASSES, SCRATCH_VOLUMES, ClusterSettings, Pod, helm
from mass_jobs.k8s.yamlio import _Dumper
from mass_jobs.pipeline import nodes as N
from mass_jobs.pipeline import table as P

# the serve step's wait: a small pod (an interpreter and the Kubernetes client) polling the API
WAIT_POD = Pod(cpu="100m", memory="512Mi", ephemeral="1Gi")


class _Builder:
    """Template factories that share the cluster settings."""

    def __init__(self, s: ClusterSettings, pipeline: str | None = None):
        """`pipeline`: "module:NAME" of a pipeline other than the shipped one; the cycle's validate
        step, which reads every step's done flag, is handed the same reference."""
        if pipeline is not None and not isinstance(pipeline, str):
            raise ValueError(
                f"pipeline: expected module:NAME (the cycle's validate step imports it), got {type(pipeline).__name__}"
            )
        self.s, self.pipeline = s, pipeline
        self.steps = P.steps(pipeline)
        self.parallelism: dict[str, int | str] = {}  # template name -> parallelism

    def step_env(self) -> list[m.EnvVar]:
        """Every step and trainer pod: a writable work dir and the store's S3 endpoint and region
        (the spec may leave them to the environment; boto3 reads AWS_ENDPOINT_URL / AWS_REGION)."""
        s = self.s
        return [
            m.EnvVar(name="HOME", value="/tmp"),
            m.EnvVar(name="MASS_WORK_DIR", value=WORK_DIR),
            m.EnvVar(name="AWS_ENDPOINT_URL", value=s.s3_endpoint_url),
            m.EnvVar(name="AWS_REGION", value=s.s3_region),
            m.EnvVar(name="AWS_DEFAULT_REGION", value=s.s3_region),
        ]

    # -------------------------------------------------------------- containers

    def jobs_pod(self, pod) -> dict:
        """What every pod of the jobs image has: `mass` in a read-only root with a writable /tmp, the
        step env, its size, and its deadline (a step that hangs fails instead of holding the run)."""
        return dict(
            image=self.s.images.jobs,
            command=["mass"],
            env=self.step_env(),
            working_dir="/tmp",
            resources=m.ResourceRequirements(**pods.resources(pod, self.s)),
            active_deadline_seconds=pod.deadline_s,
            security_context=m.SecurityContext(**container_security(pods.container_security_context())),
            volumes=[m.Volume(name="tmp", empty_dir=m.EmptyDirVolumeSource())],
            volume_mounts=[m.VolumeMount(name="tmp", mount_path="/tmp")],
        )

    def step(
        self,
        name: str,
        args: list[str],
        *,
        inputs=("gen",),
        task: str = "",
        episode: str = "",
        outputs=None,
        pod=None,
        env_from=(),
        label: str | None = None,
        gpu_semaphore=False,
        metrics=(),
    ) -> Container:
        """A step pod: store credentials from the S3 Secret, the jobs image, the step retry, its
        duration metric (and `metrics`, more of them)."""
        s = self.s
        if (gauge := PM.generation_gauge(name, with_gen="gen" in inputs)) is not None:
            # the step writes its gauge's value under --outputs; Argo reads it as an output parameter
            param = PM.GAUGES[name][0]
            args = [*args, "--outputs", OUTPUTS_DIR]
            outputs = [*(outputs or []), Parameter(name=param, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{param}"))]
            metrics = (*metrics, gauge)
        secret_refs = [s.s3_secret, *env_from]
        return Container(
            name=name,
            args=args,
            inputs=input_params(*inputs),
            outputs=outputs or None,
            env_from=[
                m.EnvFromSource(secret_ref=m.SecretEnvSource(name=n, optional=(n != s.s3_secret))) for n in secret_refs
            ],
            **self.jobs_pod(pod or s.step),
            labels={
                **L.pod_labels(label or name, gen=GEN if "gen" in inputs else "", task=task, episode=episode),
                **L.queue_labels(s, plain_pod=True),
            },
            annotations={f"{L.PREFIX}/spec": SPEC},
            retry_strategy=STEP_RETRY,
            synchronization=gpu_semaphore() if gpu_semaphore else None,
            metrics=PM.metrics(PM.step_duration(name), *metrics),
        )

    @staticmethod
    def ingest_metrics(step: str) -> dict:
        """An ingest step's outcome (an output parameter, "unknown" when the step wrote none: a
        checks job has no episode outcome) and the episode counter that reads it."""
        return {
            "outputs": [
                Parameter(
                    name=PM.OUTCOME, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{PM.OUTCOME}", default="unknown")
                )
            ],
            "metrics": (PM.episode_outcomes(step),),
        }

    def rollouts(self, sd: P.StepDef, ingest: list[str], inputs: tuple[str, ...]) -> None:
        """`<step>-ingest`, `<step>-rollout` (agent pod -> ingest) and `<step>-rollouts`, the fan-out
        over what `<step>-prepare` listed (at most `agent_parallelism` at once)."""
        task = TASK if "task" in inputs else ""
        self.step(
            f"{sd.name}-ingest",
            ingest,
            inputs=(*inputs, "rollout", "agent-status"),
            task=task,
            **self.ingest_metrics(sd.name),
        )
        rollout_steps(sd.name, inputs)
        with Steps(name=f"{sd.name}-rollouts", inputs=input_params(*inputs, "rollouts", "store-prefix", "egress")):
            own = {n: "{{inputs.parameters.%s}}" % n for n in inputs}
            Step(
                name="rollout",
                template=f"{sd.name}-rollout",
                with_param="{{inputs.parameters.rollouts}}",
                arguments=[
                    *(Parameter(name=n, value=v) for n, v in own.items()),
                    *step_args(
                        rollout="{{item.rollout}}",
                        model_gen="{{item.gen}}",
                        item_task="{{item.task}}",
                        label="{{item.label}}",
                        store_prefix="{{inputs.parameters.store-prefix}}",
                        egress=EGRESS_IN,
                    ),
                ],
            )
        self.parallelism[f"{sd.name}-rollouts"] = self.s.agent_parallelism

    # -------------------------------------------------------------- resources

    def serve_model(self) -> None:
        """serve-model: apply the InferenceService, then wait in a pod of our own until it serves
        (`mass serve-wait`). KServe reports a predictor no node takes as it reports a model loading,
        so the wait reads the predictor's pods and fails at the pending bound naming the scheduler's
        message, not at the ready deadline."""
        labels = {**L.pod_labels(K.MODEL_STEP, gen=GEN), L.ARGO_WORKFLOW: "{{workflow.name}}", **L.queue_labels(self.s)}
        isvc = serving.inference_service(
            self.s, ISVC, "{{inputs.parameters.model-uri}}", labels, dtype="{{inputs.parameters.dtype}}"
        )
        Resource(
            name="serve-model-apply",
            inputs=input_params("gen", "model-uri", "dtype"),
            action="apply",
            # Owned by the workflow: `argo terminate` / delete garbage-collects the GPU predictor.
            set_owner_reference=True,
            manifest=_manifest(isvc),
            labels=L.pod_labels(K.MODEL_STEP, gen=GEN),
            active_deadline_seconds=self.s.step.deadline_s,
            retry_strategy=RESOURCE_RETRY,
        )
        s = self.s
        Container(
            name=SERVE_WAIT,
            args=[
                "serve-wait",
                ISVC,
                f"--pending-timeout={s.predictor_pending_s}",
                f"--ready-timeout={s.serve_ready_s}",
            ],
            inputs=input_params("gen"),
            # no store credentials: it reads the API server alone
            **self.jobs_pod(replace(WAIT_POD, deadline_s=s.serve_step_deadline_s)),
            # the one pod with an API token: it reads the InferenceService and lists pods, nothing else
            service_account_name=K.SERVE_WAIT_SA,
            automount_service_account_token=True,
            # the wait's last line (why the model is not served) becomes Argo's node message
            termination_message_policy="FallbackToLogsOnError",
            labels={**L.pod_labels("serve-model", gen=GEN), **L.queue_labels(s, plain_pod=True)},
            # a pod lost with its node is retried; a wait that failed (exit 2) said why, and waiting
            # again would end the same way
            retry_strategy=STEP_RETRY,
            metrics=PM.metrics(PM.step_duration("serve-model")),
        )
        with Steps(name="serve-model", inputs=input_params("gen", "model-uri", "dtype")):
            Step(
                name="apply",
                template="serve-model-apply",
                arguments=step_args(
                    gen=GEN, model_uri="{{inputs.parameters.model-uri}}", dtype="{{inputs.parameters.dtype}}"
                ),
            )
            Step(name="wait", template=SERVE_WAIT, arguments=step_args(gen=GEN))

    def deletion(self, name: str, api: str, kind: str, obj: str, label: str) -> Resource:
        """A resource template deleting one object of the cycle; an absent one is no error."""
        ref = {"apiVersion": api, "kind": kind, "metadata": {"name": obj}}
        return Resource(
            name=name,
            inputs=input_params("gen"),
            action="delete",
            flags=["--ignore-not-found"],
            manifest=_manifest(ref),
            labels=L.pod_labels(label, gen=GEN),
            retry_strategy=RESOURCE_RETRY,
            active_deadline_seconds=self.s.step.deadline_s,
        )

    def delete_model(self) -> Resource:
        return self.deletion("delete-model", "serving.kserve.io/v1beta1", "InferenceService", ISVC, "delete-model")

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
            inputs=input_params("gen"),
            action="delete",
            # --wait (kubectl's default) waits for the job object only; foreground cascade makes it
            # wait until the job's pods are gone too, so the old Master cannot write a checkpoint
            # after the new job starts.
            flags=["--ignore-not-found", "--cascade=foreground"],
            manifest=_manifest(ref),
            labels=L.pod_labels(sd.name, gen=GEN),
            retry_strategy=RESOURCE_RETRY,
            active_deadline_seconds=self.s.step.deadline_s,  # a delete whose pods never go fails
        )
        # One replica: the Master alone (the operator's webhook refuses `Worker.replicas: 0`).
        single = training.pytorch_job(
            self.s, name, sd.argv(SPEC, GEN), labels, env=_env_dicts(self.step_env()), **{**sizes, "workers": None}
        )
        started = (
            helm('include "mass-jobs.jobStarted" .') if self.s.chart else training.started(bool(self.s.kueue_queue))
        )
        # Created, then started: the operator's Master runs (or the job already ended). A job whose
        # pods stay Pending (taints, no free GPU, a disk no node has) never gets there and fails this
        # step at the pending bound (plus the queue's, under Kueue), not at the training deadline.
        for suffix, text, inputs in (
            ("job", manifest, params),
            ("job-single", _manifest(single), tuple(p for p in params if p != "trainer-workers")),
        ):
            Resource(
                name=f"{sd.name}-{suffix}",
                inputs=input_params(*inputs),
                action="create",
                set_owner_reference=True,
                manifest=text,
                success_condition=started,
                failure_condition=training.FAILED,
                labels=L.pod_labels(sd.name, gen=GEN),
                active_deadline_seconds=self.s.train_start_deadline_s,
            )
        # A job whose start failed and that never started goes at once: left, its Pending pods would
        # start training unobserved once a node frees (under Kueue, an admitted job also holds its
        # quota). Its Master's scheduling message is read first, into the node's outputs (argo get).
        # A job that ended by itself (Failed) is kept: its pods hold the logs.
        Resource(
            name=f"{sd.name}-unstarted-job",
            inputs=input_params("gen"),
            action="get",
            manifest=_manifest(ref),
            success_condition=f"!{started}",
            failure_condition=started,
            labels=L.pod_labels(sd.name, gen=GEN),
            retry_strategy=RESOURCE_RETRY,
            active_deadline_seconds=self.s.step.deadline_s,
        )
        master = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": training.replica_names(name, 0)[0]}}
        Resource(
            name=f"{sd.name}-scheduling",
            inputs=input_params("gen"),
            action="get",
            manifest=_manifest(master),
            outputs=[Parameter(name="scheduler", value_from=m.ValueFrom(json_path=training.SCHEDULING_MESSAGE))],
            labels=L.pod_labels(sd.name, gen=GEN),
            active_deadline_seconds=self.s.step.deadline_s,
        )
        with Steps(name=f"{sd.name}-unstarted", inputs=input_params("gen")):
            Step(
                name="unstarted",
                template=f"{sd.name}-unstarted-job",
                arguments=step_args(gen=GEN),
                continue_on=m.ContinueOn(failed=True),
            )
            kept = "{{steps.unstarted.status}} == Succeeded"
            # no Master pod (a job Kueue never admitted) is no reason to keep the job
            Step(
                name="scheduling",
                template=f"{sd.name}-scheduling",
                arguments=step_args(gen=GEN),
                when=kept,
                continue_on=m.ContinueOn(failed=True),
            )
            Step(name="delete-job", template=f"{sd.name}-delete-job", arguments=step_args(gen=GEN), when=kept)

        def unstarted_hook(step: str) -> dict:
            """Once the start step `step` failed (its bound passed), the unstarted job goes."""
            failed = " || ".join(f"steps['{step}'].status == '{phase}'" for phase in ("Failed", "Error"))
            return {
                "exit": m.LifecycleHook(
                    template=f"{sd.name}-unstarted",
                    expression=failed,
                    arguments=m.Arguments(parameters=[m.Parameter(name="gen", value=GEN)]),
                )
            }

        # then trained: the job's own deadline counts from its admission
        Resource(
            name=f"{sd.name}-wait",
            inputs=input_params("gen"),
            action="get",
            manifest=_manifest(ref),
            success_condition=training.SUCCEEDED,
            failure_condition=training.FAILED,
            labels=L.pod_labels(sd.name, gen=GEN),
            active_deadline_seconds=self.s.train_step_deadline_s,
            metrics=PM.metrics(PM.step_duration(f"{sd.name}-job")),
        )
        # the GPU-jobs semaphore is held from the delete to the end of training, across attempts
        with Steps(
            name=sd.name, inputs=input_params(*params), retry_strategy=TRAIN_RETRY, synchronization=gpu_semaphore()
        ):
            Step(name="delete-job", template=f"{sd.name}-delete-job", arguments=step_args(gen=GEN))
            workers = "{{inputs.parameters.trainer-workers}}"
            Step(
                name="job",
                template=f"{sd.name}-job",
                when=f"{workers} > 0",
                hooks=unstarted_hook("job"),
                arguments=[Parameter(name=p, value="{{inputs.parameters.%s}}" % p) for p in params],
            )
            Step(
                name="job-single",
                template=f"{sd.name}-job-single",
                when=f"{workers} == 0",
                hooks=unstarted_hook("job-single"),
                arguments=[
                    Parameter(name=p, value="{{inputs.parameters.%s}}" % p) for p in params if p != "trainer-workers"
                ],
            )
            Step(name="wait", template=f"{sd.name}-wait", arguments=step_args(gen=GEN))

    # -------------------------------------------------------------- the table's steps

    def egress_proxy(self) -> None:
        """The run's egress proxy (`mass egress-serve`, egress_proxy.py): its Service and its Deployment,
        applied by the cycle before its first step (the Deployment's step waits for a ready pod), and
        `delete-egress`, which the cycle's last step and its exit handler run."""
        for name, obj, ready in (
            ("egress-service", EP.service(self.s), None),
            (EGRESS_TEMPLATE, EP.deployment(self.s, _env_dicts(self.step_env())), EP.READY),
        ):
            Resource(
                name=name,
                inputs=input_params("gen"),
                action="apply",
                set_owner_reference=True,
                manifest=_manifest(obj),
                success_condition=ready,
                labels=L.pod_labels(name, gen=GEN),
                retry_strategy=RESOURCE_RETRY,
                active_deadline_seconds=EP.READY_S if ready else self.s.step.deadline_s,
            )
        for kind, api in (("Deployment", "apps/v1"), ("Service", "v1")):
            self.deletion(f"delete-egress-{kind.lower()}", api, kind, EP.NAME, "delete-egress")
        with Steps(name="delete-egress", inputs=input_params("gen")) as st:
            with st.parallel():
                for kind in ("deployment", "service"):
                    Step(name=kind, template=f"delete-egress-{kind}", arguments=step_args(gen=GEN))

    def validate(self) -> Container:
        names = {
            **VALIDATE_OUTPUTS,
            **{P.done_output(sd.name): P.done_output(sd.name) for sd in P.generation_steps(self.steps)},
        }
        outputs = [Parameter(name=k, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{f}")) for k, f in names.items()]
        # The chart's values the preflight checks: validate refuses a spec the cluster cannot run.
        chart = [f"--chart-value={key}={value}" for key, value in self.chart_values().items()]
        own = ["--pipeline", self.pipeline] if self.pipeline else []
        return self.step(
            "validate",
            [
                "validate",
                SPEC,
                "--gen",
                GEN,
                "--outputs",
                OUTPUTS_DIR,
                *own,
                "--run",
                RUN_ID,
                "--artifact-bucket",
                self.s.bucket,
                # one argument: the chart's value is an unquoted Helm action
                f"--max-model-len={self.s.max_model_len}",
                *chart,
            ],
            # the judge Secret as evaluate's finish mounts it: a key it lacks fails here,
            # in the cycle's first minute, not at the first verdict after training
            outputs=outputs,
            env_from=(self.s.judge_secret,),
        )

    def chart_values(self) -> dict[str, str]:
        """Chart values (dotted keys) the validate step hands the preflight (mass_jobs/k8s/preflight.py)."""
        s = self.s
        keys = helm('join "," .Values.judges.keys') if s.chart else ",".join(s.judge_keys)
        return {
            "model.toolCallParser": s.tool_call_parser,
            "model.reasoningParser": s.reasoning_parser,
            "agent.activeDeadlineSeconds": helm(".Values.agent.activeDeadlineSeconds")
            if s.chart
            else s.agent_deadline_s,
            "judges.keys": keys,
        }

    def phases(self, sd: P.StepDef, model: list[str]) -> N.Phases:
        """The step's command lines by phase, with this template's placeholders."""
        item = {P.Recursion: "{{inputs.parameters.iteration}}", P.EpisodeFanout: EPISODE}.get(type(sd.shape), "")
        return N.phases(
            sd.shape,
            sd.argv(SPEC, GEN, TASK),
            item=item,
            model=model,
            outputs=OUTPUTS_DIR,
            agent_status="{{inputs.parameters.agent-status}}",
            rollout="{{inputs.parameters.rollout}}",
        )

    def templates_of(self, sd: P.StepDef) -> None:
        """The templates of one table step (they register with the enclosing WorkflowTemplate)."""
        s = self.s
        model = N.model_flags(serving.openai_base_url(ISVC, NAMESPACE, self.s.cluster_domain), ISVC) if sd.model else []
        ph = self.phases(sd, model)
        match sd.shape:
            case P.Recursion(agent=True):
                # prepare (proposal, agent inputs) -> agent pods -> ingest each -> judge and save
                self.agent_block(sd, ph, ("gen", "task", "iteration"))
                recursion(sd.name)
            case P.Recursion():
                self.step(sd.name, ph.run, inputs=("gen", "task", "iteration"), task=TASK)
                recursion(sd.name, agent=False)
            case P.EpisodeFanout():
                # prepare writes the agent's input in the store and says whether an agent pod must run.
                self.step(
                    f"{sd.name}-prepare",
                    ph.prepare,
                    inputs=("gen", "task", "episode"),
                    task=TASK,
                    episode=EPISODE,
                    outputs=[
                        Parameter(name=n, value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{n}"))
                        for n in ("agent", "rollout")
                    ],
                )
                self.step(
                    f"{sd.name}-ingest",
                    ph.ingest,
                    inputs=("gen", "task", "episode", "agent-status"),
                    task=TASK,
                    episode=EPISODE,
                    **self.ingest_metrics(sd.name),
                )
                self.step(f"{sd.name}-summary", ph.last, inputs=("gen", "task"), task=TASK)
                episode_steps(sd.name)
                episode_fanout(sd.name, s.agent_parallelism)
                # set on the dict: hera wants an int, the chart's value is a Helm placeholder
                self.parallelism[sd.name] = s.agent_parallelism
            case P.Trainer():
                self.trainer(sd)
            case P.TaskRollouts():
                # prepare (the jobs, listed) -> agent pods -> ingest each -> finish with their results
                self.agent_block(sd, ph, ("gen", "task"))
            case P.TaskFanout():
                self.step(sd.name, ph.run, inputs=("gen", "task"), task=TASK)
            case P.Container(once_per_run=True):
                self.step(sd.name, ph.run, inputs=())
            case P.GenerationRollouts():
                self.generation_rollouts(sd)
            case P.Container():
                self.step(sd.name, ph.run, pod=getattr(s, sd.resources))

    def agent_block(self, sd: P.StepDef, ph: N.Phases, inputs: tuple[str, ...]) -> None:
        """Every agent fan-out of the cycle, by the episodes' one protocol (episodes.rollouts.Phase):
        prepare (step pod: writes the agent pods' inputs, lists them) -> its agent pods (ingested one
        by one) -> finish (step pod: works with their stored results)."""
        task = TASK if "task" in inputs else ""
        own = {n: "{{inputs.parameters.%s}}" % n for n in inputs}
        self.step(
            f"{sd.name}-prepare",
            ph.prepare,
            inputs=inputs,
            task=task,
            outputs=[Parameter(name="rollouts", value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{ROLLOUTS_OUTPUT}"))],
        )
        fanout = tuple(n for n in inputs if n in ("gen", "task"))
        self.rollouts(sd, ph.ingest, fanout)
        self.step(f"{sd.name}-finish", ph.finish, inputs=inputs, task=task)
        args = step_args(**{n.replace("-", "_"): v for n, v in own.items()})
        with Steps(name=sd.name, inputs=input_params(*inputs, "store-prefix", "egress")):
            Step(name="prepare", template=f"{sd.name}-prepare", arguments=args)
            Step(
                name="rollouts",
                template=f"{sd.name}-rollouts",
                arguments=step_args(
                    **{n: own[n] for n in fanout},
                    rollouts=ROLLOUTS_PARAM,
                    store_prefix="{{inputs.parameters.store-prefix}}",
                    egress=EGRESS_IN,
                ),
            )
            Step(name="finish", template=f"{sd.name}-finish", arguments=args)

    def generation_rollouts(self, sd: P.StepDef) -> None:
        """evaluate of G, one model served at a time (steps.evaluate.serve_order): plan -> each round
        in order (serve L_h -> prepare its missing rollouts -> their agent pods -> its self-verdicts
        once every pair is stored; then, however that ended, release) -> finish (the panel). A GPU quota that fits one
        predictor serves the run, and no predictor holds its GPU while another waits for admission.
        The step pods are CPU pods: the judges are external endpoints."""
        served = "{{inputs.parameters.served-gen}}"
        isvc = serving.isvc_name(RUN_ID, served)
        ph = self.phases(
            sd, N.round_flags(served, serving.openai_base_url(isvc, NAMESPACE, self.s.cluster_domain), isvc)
        )
        self.step(
            f"{sd.name}-plan",
            ph.plan,
            outputs=[Parameter(name="rounds", value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{ROUNDS_OUTPUT}"))],
        )
        self.step(
            f"{sd.name}-prepare",
            ph.prepare,
            inputs=("gen", "served-gen"),
            outputs=[Parameter(name="rollouts", value_from=m.ValueFrom(path=f"{OUTPUTS_DIR}/{ROLLOUTS_OUTPUT}"))],
        )
        self.rollouts(sd, ph.ingest, ("gen",))
        self.step(f"{sd.name}-self-verdicts", ph.finish, inputs=("gen", "served-gen"))
        # judge API keys come from an optional Secret (the spec names them: api_key_env)
        self.step(f"{sd.name}-finish", ph.last, env_from=(self.s.judge_secret,))
        self.rounds(sd, served)

    def rounds(self, sd: P.StepDef, served: str) -> None:
        """evaluate's Steps templates: the plan's rounds in order, each serving L_h for the part of
        the work the plan gave it, then releasing it; then the panel."""
        where = {"store_prefix": "{{inputs.parameters.store-prefix}}", "egress": EGRESS_IN}
        round_inputs = ("gen", "served-gen", "model-uri", "dtype", "rolls", "judges", "store-prefix", "egress")
        self.serving(sd, served, where, round_inputs)
        # the round's model goes however its work ended; the round (and so the next one) ends after
        # its exit hook, so no two rounds' predictors overlap
        release = m.LifecycleHook(
            template="delete-model", arguments=m.Arguments(parameters=[m.Parameter(name="gen", value=served)])
        )
        with Steps(name=f"{sd.name}-round", inputs=input_params(*round_inputs)):
            Step(
                name="serving",
                template=f"{sd.name}-serving",
                hooks={"exit": release},
                arguments=[Parameter(name=n, value="{{inputs.parameters.%s}}" % n) for n in round_inputs],
            )
        with Steps(name=sd.name, inputs=input_params("gen", "store-prefix", "egress")):
            Step(name="plan", template=f"{sd.name}-plan", arguments=step_args(gen=GEN))
            Step(
                name="round",
                template=f"{sd.name}-round",
                with_param="{{steps.plan.outputs.parameters.rounds}}",
                arguments=step_args(
                    gen=GEN,
                    served_gen="{{item.gen}}",
                    model_uri="{{item.model-uri}}",
                    dtype="{{item.dtype}}",
                    rolls="{{item.rolls}}",
                    judges="{{item.judges}}",
                    **where,
                ),
            )
            Step(name="finish", template=f"{sd.name}-finish", arguments=step_args(gen=GEN))
        # one round at a time, in the plan's order: a steps template's parallelism counts its active
        # children, and Argo starts a group's items in their order
        self.parallelism[sd.name] = 1

    def serving(self, sd: P.StepDef, served: str, where: dict, round_inputs: tuple[str, ...]) -> None:
        """One round with L_h served: its rollouts, its self-verdicts, each only where the plan says."""
        # prepare and its fan-out in a template of their own: a `when` on the pair skips both, where
        # a skipped prepare beside its fan-out would leave the fan-out's reference to its output
        # unresolved, which Argo requeues forever
        with Steps(
            name=f"{sd.name}-round-rollouts", inputs=input_params("gen", "served-gen", "store-prefix", "egress")
        ):
            Step(name="prepare", template=f"{sd.name}-prepare", arguments=step_args(gen=GEN, served_gen=served))
            Step(
                name="rollouts",
                template=f"{sd.name}-rollouts",
                arguments=step_args(gen=GEN, rollouts=ROLLOUTS_PARAM, **where),
            )
        # a round runs only the part the plan gave it: L_0's first round at generation 1 judges
        # nothing yet, its second rolls nothing out
        with Steps(name=f"{sd.name}-serving", inputs=input_params(*round_inputs)):
            Step(
                name="serve",
                template="serve-model",
                arguments=step_args(
                    gen=served, model_uri="{{inputs.parameters.model-uri}}", dtype="{{inputs.parameters.dtype}}"
                ),
            )
            Step(
                name="rollouts",
                template=f"{sd.name}-round-rollouts",
                when="{{inputs.parameters.rolls}} == true",
                arguments=step_args(gen=GEN, served_gen=served, **where),
            )
            Step(
                name="self-verdicts",
                template=f"{sd.name}-self-verdicts",
                when="{{inputs.parameters.judges}} == true",
                arguments=step_args(gen=GEN, served_gen=served),
            )

    def cycle(self) -> Steps:
        """One generation in table order, behind a per-run mutex (one InferenceService name per run)."""
        gen_steps = P.generation_steps(self.steps)
        model_steps = [i for i, sd in enumerate(gen_steps) if sd.model]
        first_model, last_model = (model_steps[0], model_steps[-1]) if model_steps else (-1, -1)
        sync = m.Synchronization(mutexes=[m.Mutex(name=f"mass-run-{RUN_ID}")])
        with Steps(name="cycle", inputs=input_params("gen"), synchronization=sync) as cycle:
            Step(name="validate", template="validate", arguments=step_args(gen=GEN))
            with cycle.parallel():
                Step(name="egress-service", template="egress-service", arguments=step_args(gen=GEN))
                Step(name="egress", template=EGRESS_TEMPLATE, arguments=step_args(gen=GEN))
            egress = EP.host(self.s)
            for i, sd in enumerate(gen_steps):
                if i == first_model:
                    Step(
                        name="serve-model",
                        template="serve-model",
                        when=f"{V % 'needs-model'} == true",
                        arguments=step_args(gen=GEN, model_uri=V % "model-uri", dtype=V % "dtype"),
                    )
                cycle_step(sd, egress)
                if i == last_model:  # its last user is done: free the GPU before training
                    Step(name="release-model", template="delete-model", arguments=step_args(gen=GEN))
            for sd in P.run_steps(self.steps):
                cycle_step(sd, egress)
            Step(name="delete-egress", template="delete-egress", arguments=step_args(gen=GEN))
        return cycle


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
            run_as_non_root=ps["runAsNonRoot"],
            run_as_user=ps["runAsUser"],
            run_as_group=ps["runAsGroup"],
            fs_group=ps["fsGroup"],
            seccomp_profile=m.SeccompProfile(type="RuntimeDefault"),
        ),
        artifact_repository_ref=m.ArtifactRepositoryRef(config_map=K.ARTIFACT_REPOSITORIES, key=K.ARTIFACT_KEY),
        pod_gc=m.PodGC(strategy="OnPodSuccess", delete_delay_duration="10m"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=86400, seconds_after_failure=604800),
        workflow_metadata=m.WorkflowMetadata(
            labels_from={L.RUN: m.LabelValueFrom(expression="workflow.parameters.run")}
        ),
    )


def scheduling_class(template: str, steps) -> str:
    """A pod template's scheduling class (values scheduling.<class>): the agent pods', else the
    resources its step declares (step, merge). The trainer's, the server's and the egress proxy's
    pods are the PyTorchJob's, the InferenceService's and the Deployment's (training.py, serving.py,
    egress_proxy.py)."""
    if template == AGENT_TEMPLATE:
        return "agent"
    return next((sd.resources for sd in steps if sd.name == template), "step")


def mass_cycle(s: ClusterSettings, pipeline: str | None = None) -> dict:
    b = _Builder(s, pipeline)
    with WorkflowTemplate(
        name=CYCLE,
        entrypoint="main",
        on_exit="exit-handler",
        arguments=[
            Parameter(name="spec", description="s3:// URI of the run spec"),
            Parameter(name="run", description="the spec's name (pod label, model name)"),
            Parameter(name="gen", value="0", description="generation to run: L_gen -> L_gen+1"),
        ],
        **_workflow_defaults(s),
    ) as wt:
        with Steps(name="main"):
            Step(name="cycle", template="cycle", arguments=step_args(gen="{{workflow.parameters.gen}}"))
        with Steps(name="exit-handler"):
            Step(name="delete-models", template="delete-models", arguments=step_args(gen="{{workflow.parameters.gen}}"))
        b.cycle()
        b.validate()
        b.egress_proxy()
        for sd in b.steps:
            b.templates_of(sd)  # templates register themselves with the enclosing WorkflowTemplate
        agent_container(s)
        b.serve_model()
        b.delete_model()
        delete_models_steps()
    d = wt.to_dict()
    for t in d["spec"]["templates"]:
        if "container" in t:
            # hera checks the pull policy against its enum; the chart's value is a Helm placeholder.
            t["container"]["imagePullPolicy"] = s.images.pull_policy
            cls = scheduling_class(t["name"], b.steps)
            t.update(pods.placement(s, cls))
            if cls in SCRATCH_CLASSES:
                vol = SCRATCH_VOLUMES.get(cls, "tmp")
                t["volumes"] = [
                    pods.scratch_volume(s, cls, vol) if v["name"] == vol else v for v in t.get("volumes", [])
                ]
            if "readinessProbe" in t["container"]:
                t["container"]["readinessProbe"]["httpGet"]["port"] = t["container"]["ports"][0]["name"]
        if ("container" in t or "resource" in t) and "synchronization" not in t and s.pod_pending_timeout:
            # a pod Pending this long (Unschedulable, an image that never pulls) fails its step; behind
            # a semaphore Argo would count the wait for the lock too
            t["pendingTimeout"] = s.pod_pending_timeout
        if t["name"] in b.parallelism:
            t["parallelism"] = b.parallelism[t["name"]]
    return d


def mass_run(s: ClusterSettings) -> dict:
    """L0 -> L_N: the cycle per generation (bounded recursion); each cycle evaluates its merged model."""

    def cycle_ref(gen: str) -> dict:
        return dict(
            template_ref=m.TemplateRef(name=CYCLE, template="cycle"),
            arguments=step_args(gen=gen),
            # The model server goes away after each generation, success or not.
            hooks={
                "exit": m.LifecycleHook(
                    template_ref=m.TemplateRef(name=CYCLE, template="delete-models"),
                    arguments=m.Arguments(parameters=[m.Parameter(name="gen", value=gen)]),
                )
            },
        )

    with WorkflowTemplate(
        name=RUN,
        entrypoint="main",
        arguments=[
            Parameter(name="spec", description="s3:// URI of the run spec"),
            Parameter(name="run", description="the spec's name (pod label, model name)"),
        ],
        **_workflow_defaults(s),
    ) as wt:
        with Steps(name="main"):
            Step(
                name="validate",
                template_ref=m.TemplateRef(name=CYCLE, template="validate"),
                arguments=step_args(gen="0"),
            )
            # A finished run (a scheduled re-submission) does nothing and starts no GPU.
            Step(
                name="generations",
                template="chain",
                when=f"{V % 'run-done'} == false",
                arguments=step_args(gen="0", generations=V % "generations"),
            )
        with Steps(name="chain", inputs=input_params("gen", "generations")):
            Step(name="cycle", **cycle_ref(GEN))
            Step(
                name="next",
                template="chain",
                when="{{=asInt(inputs.parameters.gen) + 1 < asInt(inputs.parameters.generations)}}",
                arguments=step_args(
                    gen="{{=asInt(inputs.parameters.gen) + 1}}", generations="{{inputs.parameters.generations}}"
                ),
            )
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
