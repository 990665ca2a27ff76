"""Cluster settings the generated objects depend on, and their Helm counterparts.

`ClusterSettings()` holds the defaults written to `argo/` and `manifests/`. `helm_settings()`
returns the same structure whose leaves are Helm placeholders (`helm(...)`), so the chart
templates come from the very same builders; `yamlio.helmify` turns the placeholders into
`{{ ... }}` actions after the YAML is dumped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mass_jobs.serving.backends import REASONING_PARSER, TOOL_CALL_PARSER


def helm(expr: str) -> str:
    """A scalar that becomes the Helm action `{{ expr }}` in chart templates."""
    return f"@helm({expr})@"


def helm_yaml(expr: str) -> str:
    """A value that becomes `{{- toYaml expr | nindent N }}` (lists and maps from values)."""
    return f"@helm-yaml({expr})@"


def helm_block(expr: str) -> str:
    """A mapping key whose line becomes `{{- expr | nindent N }}` (merged label blocks)."""
    return f"@helm-block({expr})@"


@dataclass(frozen=True)
class Images:
    jobs: str = "ghcr.io/mass-jobs/jobs:0.1.0"
    sandbox: str = "ghcr.io/mass-jobs/sandbox:0.1.0"
    trainer: str = "ghcr.io/mass-jobs/trainer:0.1.0"
    server: str = "kserve/huggingfaceserver:v0.20.0-gpu"
    pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class Pod:
    cpu: str
    memory: str
    gpu: str = "0"
    ephemeral: str = "1Gi"  # ephemeral-storage: emptyDirs, logs and a model downloaded into the pod
    deadline_s: str | None = None  # activeDeadlineSeconds of a step pod: a step that hangs fails instead


# Classes of pods that are scheduled alike (values `scheduling.<class>`, named as `resources.<class>`):
# the trainer's and the model server's pods need the GPU pool, the others usually must stay off it.
SCHEDULING_CLASSES = ("step", "agent", "egress", "merge", "trainer", "server")


@dataclass(frozen=True)
class Placement:
    """Where one class of pods may run: the pod fields the scheduler reads. GPU pools are usually
    tainted (AKS, EKS node groups, Karpenter): a pod without the matching toleration never schedules."""

    node_selector: dict = field(default_factory=dict)
    tolerations: tuple = ()
    affinity: dict = field(default_factory=dict)
    priority_class: str = ""


# Classes whose working files (/tmp: models, checkpoints; an agent pod's workspace and its commands'
# /tmp) may live on a volume of their own (values `scratch.<class>`) instead of the node's disk;
# KServe owns the predictor's download folder.
SCRATCH_CLASSES = ("step", "merge", "trainer", "agent")
SCRATCH_VOLUMES = {"agent": "workspace"}  # the volume scratch.<class> is, where not the pod's "tmp"
# the serve step's wait pod outlives the wait's own ready deadline by this much: the wait, not the
# kubelet, says why the model was not served
SERVE_WAIT_MARGIN_S = 300


@dataclass(frozen=True)
class Scratch:
    """A class's /tmp: `size` "" is an emptyDir on the node's disk (counted in the pod's
    ephemeral-storage request); a size makes it a generic ephemeral volume, a PVC of
    `storage_class` ("" = the cluster's default) created with the pod and deleted with it."""

    size: str = ""
    storage_class: str = ""


@dataclass(frozen=True)
class ClusterSettings:
    # Object names are fixed (one install per namespace) so `argo submit --from
    # workflowtemplate/mass-cycle` and the RBAC below never depend on a release name.
    namespace: str | None = None
    images: Images = field(default_factory=Images)
    bucket: str = "mass-jobs"
    s3_endpoint: str = "s3.amazonaws.com"
    s3_insecure: bool = False
    s3_region: str = "us-east-1"
    s3_endpoint_url: str | None = None  # what step and trainer pods get as AWS_ENDPOINT_URL (from the two above)
    s3_secret: str = "mass-s3-credentials"
    judge_secret: str = "mass-judge-keys"
    judge_keys: tuple | str = ("JUDGE_API_KEY",)  # env names the spec's judges read (api_key_env)
    gpu_resource: str = "nvidia.com/gpu"
    gpu_jobs: str = "2"  # semaphore: GPU jobs (PyTorchJobs) running at once
    agent: Pod = Pod(
        cpu="1", memory="2Gi", ephemeral="5Gi"
    )  # an agent pod's sandbox container (the agents' tools and shells)
    qwen: Pod = Pod(cpu="1", memory="2Gi", ephemeral="2Gi")  # its qwen-code container
    harness: Pod = Pod(
        cpu="500m", memory="1Gi", ephemeral="2Gi"
    )  # its main container (the harness loop, the recording proxy)
    step: Pod = Pod(cpu="1", memory="4Gi", ephemeral="20Gi", deadline_s="21600")
    # A 27B bf16 model is 54 GB: merge holds the base and the merged copy, the others one copy.
    merge: Pod = Pod(cpu="4", memory="64Gi", ephemeral="160Gi", deadline_s="21600")
    server: Pod = Pod(cpu="8", memory="64Gi", gpu="1", ephemeral="80Gi")
    trainer: Pod = Pod(
        cpu="8", memory="64Gi", ephemeral="80Gi"
    )  # per replica; replicas and GPUs come from the spec's sft
    cluster_domain: str = "cluster.local"  # the kubelet's --cluster-domain: Service names end .svc.<it>
    dns_peers: tuple | str = ()  # NetworkPolicy peers of the cluster DNS (default: kube-dns in kube-system)
    max_model_len: str = "32768"
    tool_call_parser: str = TOOL_CALL_PARSER  # the local vllm backend default too
    reasoning_parser: str = REASONING_PARSER
    agent_deadline_s: str = "86400"  # episodes have no wall limit by default (upstream): a day per agent pod
    agent_parallelism: int | str = 16  # a fan-out's agent pods at once (an integer field of its template)
    agent_pods: str = "16"  # the same value as the agent-pods semaphore: agent pods at once in the namespace
    serve_deadline_s: str = "3600"  # the InferenceService must be Loaded within this
    train_deadline_s: str = "172800"  # one PyTorchJob attempt (resumes from its last checkpoint on retry)
    # Kueue: the LocalQueue GPU workloads (trainer jobs, predictors) are labelled with; "" = none.
    # `kueue_pods`: Argo's step and agent pods too (Kueue's plain-pod integration). A queued
    # object's wait counts against its Argo step's deadline, so the step gets `queue_wait_s` more.
    kueue_queue: str = ""
    kueue_pods: bool | str = False
    queue_wait_s: str = "86400"
    # Derived: the PyTorchJob's own deadline (an integer, counted from admission) and the Argo
    # steps' deadlines, which include the time queued.
    job_deadline_s: int | str = field(init=False)
    train_step_deadline_s: str = field(init=False)
    serve_step_deadline_s: str = field(init=False)
    # The serve step's wait (mass serve-wait): the model served within the ready deadline (plus the
    # queue's bound), a predictor pod held past the pending bound (plus the queue's; 0: none) fails
    # it; its pod's own deadline is a backstop SERVE_WAIT_MARGIN_S later.
    serve_ready_s: str = field(init=False)
    predictor_pending_s: str = field(init=False)
    schedules: tuple[str, ...] = ("0 3 * * 1",)
    cron_timezone: str = "UTC"
    cron_suspend: bool = True
    cron_spec: str = "s3://mass-jobs/specs/nightly.yaml"
    cron_run: str = "nightly"
    # Egress of agent pods to the kube-apiserver and S3 (Argo's wait/init containers): no default
    # peers, they are per cluster; the policy builders refuse to render without them.
    api_server_peers: tuple | str = ()
    api_server_ports: tuple | str = ()
    api_server_cilium_ports: tuple | str = ()  # the same ports in CiliumNetworkPolicy form (port as a string)
    s3_peers: tuple | str = ()
    s3_ports: tuple | str = ()
    # Cilium's FQDN form of the S3 egress (toFQDNs: matchName/matchPattern items) instead of s3_peers,
    # and the DNS endpoints whose answers Cilium's DNS proxy learns the names' addresses from.
    s3_fqdns: tuple | str = ()
    s3_cilium_ports: tuple | str = ()
    dns_cilium_endpoints: tuple | str = ()
    # Scheduling per class of pods (SCHEDULING_CLASSES), and the registry's pull Secrets, set on the
    # chart's ServiceAccounts so that every pod of the release (predictors and trainers included) has them.
    scheduling: dict = field(default_factory=lambda: {c: Placement() for c in SCHEDULING_CLASSES})
    image_pull_secrets: tuple = ()
    # Argo's pendingTimeout (v4): a pod of ours Pending this long (Unschedulable, an image that does
    # not pull) fails its step. Enough for an autoscaler to add a node; "0" = no bound. Templates
    # behind a semaphore are left out (Argo counts the wait for the lock as Pending), and under
    # Kueue's plain-pod integration the queue's bound is added (a gated pod is Pending).
    pending_timeout_s: str = "900"
    pod_pending_timeout: str = field(init=False)
    # The train step's first part: its job created and its Master running, within the pending
    # bound (plus the queue's); 0 = no bound: the training deadline.
    train_start_deadline_s: str = field(init=False)
    scratch: dict = field(default_factory=lambda: {c: Scratch() for c in SCRATCH_CLASSES})
    chart: bool = False  # True only for helm_settings(): builders add the chart's labels block

    def __post_init__(self):
        if self.chart:
            v, wait = ".Values", '(include "mass-jobs.queueWait" . | atoi)'
            derived = {
                "job_deadline_s": helm(f"{v}.resources.trainer.activeDeadlineSeconds"),
                "train_step_deadline_s": helm(f"add {v}.resources.trainer.activeDeadlineSeconds {wait} | quote"),
                "serve_step_deadline_s": helm(
                    f"add {v}.model.readyDeadlineSeconds {wait} {SERVE_WAIT_MARGIN_S} | quote"
                ),
                "serve_ready_s": helm(f"add {v}.model.readyDeadlineSeconds {wait}"),
                "predictor_pending_s": helm('include "mass-jobs.predictorPending" .'),
                "pod_pending_timeout": helm('include "mass-jobs.pendingTimeout" . | quote'),
                "train_start_deadline_s": helm('include "mass-jobs.trainStartDeadline" . | quote'),
            }
        else:
            wait = int(self.queue_wait_s) if self.kueue_queue else 0
            bound = int(self.pending_timeout_s)
            derived = {
                "job_deadline_s": int(self.train_deadline_s),
                "train_step_deadline_s": str(int(self.train_deadline_s) + wait),
                "serve_step_deadline_s": str(int(self.serve_deadline_s) + wait + SERVE_WAIT_MARGIN_S),
                "serve_ready_s": str(int(self.serve_deadline_s) + wait),
                "predictor_pending_s": str(bound + wait) if bound else "0",
                "pod_pending_timeout": str(bound + (wait if self.kueue_pods is True else 0)) if bound else "",
                "train_start_deadline_s": str(bound + wait) if bound else str(int(self.train_deadline_s) + wait),
            }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        if self.s3_endpoint_url is None:
            scheme = "http" if self.s3_insecure is True else "https"
            object.__setattr__(self, "s3_endpoint_url", f"{scheme}://{self.s3_endpoint}")
        for name, default in (("api_server_ports", API_SERVER_PORTS), ("s3_ports", S3_PORTS), ("dns_peers", DNS_PEERS)):
            if getattr(self, name) == ():
                object.__setattr__(self, name, default)
        for cilium, plain in (("api_server_cilium_ports", "api_server_ports"), ("s3_cilium_ports", "s3_ports")):
            if getattr(self, cilium) == () and not isinstance(getattr(self, plain), str):
                object.__setattr__(
                    self,
                    cilium,
                    tuple({"port": str(p["port"]), "protocol": p["protocol"]} for p in getattr(self, plain)),
                )
        if self.dns_cilium_endpoints == ():
            object.__setattr__(self, "dns_cilium_endpoints", DNS_CILIUM_ENDPOINTS)


DNS_PEERS = (
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    },
)
# kube-dns as Cilium labels its endpoints: FQDN policies need its answers to pass Cilium's DNS proxy.
DNS_CILIUM_ENDPOINTS = ({"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}},)
# The wait/init containers of an agent pod talk to the kube-apiserver (task results) and to S3
# (artifacts). NetworkPolicies match endpoint IPs after Service NAT, so the peers are per cluster
# and have no default (`kubectl get endpoints kubernetes`, the S3 endpoint's IPs); only ports do.
API_SERVER_PORTS = ({"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"})
S3_PORTS = ({"port": 443, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"})


# `helm template` without these values fails with the message (no quotes of the other kind inside).
_REQUIRED_API_SERVER = (
    '"network.apiServer.to is required (no default): the kube-apiserver endpoint IPs as ipBlock '
    'peers, see kubectl get endpoints kubernetes; or set network.cilium=true"'
)
_REQUIRED_S3 = (
    '"network.s3.to is required (no default): the S3 endpoint as ipBlock peers of its IPs, '
    'or a namespaceSelector/podSelector of an in-cluster MinIO"'
)


def helm_settings() -> ClusterSettings:
    """Settings whose leaves read `.Values` (see charts/mass-jobs/values.yaml)."""
    v = ".Values"
    return replace(
        ClusterSettings(),
        namespace=helm('include "mass-jobs.namespace" . | quote'),
        images=Images(
            jobs=helm(f"{v}.images.jobs | quote"),
            sandbox=helm(f"{v}.images.sandbox | quote"),
            trainer=helm(f"{v}.images.trainer | quote"),
            server=helm(f"{v}.images.server | quote"),
            pull_policy=helm(f"{v}.images.pullPolicy | quote"),
        ),
        bucket=helm(f"{v}.s3.bucket | quote"),
        s3_endpoint=helm(f"{v}.s3.endpoint | quote"),
        s3_insecure=helm(f"{v}.s3.insecure"),
        s3_region=helm(f"{v}.s3.region | quote"),
        s3_endpoint_url=helm(f'printf "%s://%s" (ternary "http" "https" {v}.s3.insecure) {v}.s3.endpoint | quote'),
        s3_secret=helm(f"{v}.s3.secretName | quote"),
        judge_secret=helm(f"{v}.judges.secretName | quote"),
        judge_keys=helm_block('include "mass-jobs.judgeKeys" .'),
        gpu_resource=helm(f"{v}.gpu.resourceName | quote"),
        gpu_jobs=helm(f"{v}.gpu.concurrentJobs | quote"),
        agent=_helm_pod("agent", gpu="optional"),
        qwen=_helm_pod("qwen"),
        harness=_helm_pod("harness"),
        step=_helm_pod("step", deadline=True),
        merge=_helm_pod("merge", deadline=True),
        server=_helm_pod("server", gpu=True),
        trainer=_helm_pod("trainer"),
        cluster_domain=helm(f"{v}.clusterDomain"),  # inside a URL: no quote
        dns_peers=helm_yaml(f"{v}.network.dns.to"),
        max_model_len=helm(f"{v}.model.maxModelLen"),  # inside an argument string: no quote
        tool_call_parser=helm(f"{v}.model.toolCallParser"),
        reasoning_parser=helm(f"{v}.model.reasoningParser"),
        agent_deadline_s=helm(f"{v}.agent.activeDeadlineSeconds | quote"),
        agent_parallelism=helm(f"{v}.agent.parallelism"),
        agent_pods=helm(f"{v}.agent.parallelism | quote"),
        serve_deadline_s=helm(f"{v}.model.readyDeadlineSeconds | quote"),
        train_deadline_s=helm(f"{v}.resources.trainer.activeDeadlineSeconds | quote"),
        kueue_queue=helm(f"{v}.kueue.queueName | quote"),
        kueue_pods=helm(f"{v}.kueue.podIntegration"),
        queue_wait_s=helm(f"{v}.kueue.maxQueueSeconds | quote"),
        schedules=helm_yaml(f"{v}.cron.schedules"),
        cron_timezone=helm(f"{v}.cron.timezone | quote"),
        cron_suspend=helm(f"{v}.cron.suspend"),
        cron_spec=helm(f"{v}.cron.spec | quote"),
        cron_run=helm(f"{v}.cron.run | quote"),
        api_server_peers=helm_yaml(f"(required {_REQUIRED_API_SERVER} {v}.network.apiServer.to)"),
        api_server_ports=helm_yaml(f"{v}.network.apiServer.ports"),
        api_server_cilium_ports=helm_yaml(
            '(include "mass-jobs.ciliumPorts" .Values.network.apiServer.ports | fromYamlArray)'
        ),
        s3_peers=helm_yaml(f"(required {_REQUIRED_S3} {v}.network.s3.to)"),
        s3_ports=helm_yaml(f"{v}.network.s3.ports"),
        s3_fqdns=helm_yaml(f"{v}.network.s3.fqdns"),
        s3_cilium_ports=helm_yaml('(include "mass-jobs.ciliumPorts" .Values.network.s3.ports | fromYamlArray)'),
        dns_cilium_endpoints=helm_yaml(f"{v}.network.dns.ciliumEndpoints"),
        chart=True,
    )


def _helm_pod(name: str, gpu: bool | str = False, deadline: bool = False) -> Pod:
    """`gpu`: True, the value's GPUs always requested; "optional", requested only when above 0 (a
    block, so that pods without one request no GPU resource a Kueue queue must cover)."""
    r = f".Values.resources.{name}"
    gpus = (
        helm_block(f'include "mass-jobs.gpus" (list {r}.gpu .Values.gpu.resourceName)') if gpu == "optional" else None
    )
    return Pod(
        cpu=helm(f"{r}.cpu | quote"),
        memory=helm(f"{r}.memory | quote"),
        gpu=gpus or (helm(f"{r}.gpu | quote") if gpu else "0"),
        ephemeral=helm(f"{r}.ephemeralStorage | quote"),
        deadline_s=helm(f"{r}.activeDeadlineSeconds | quote") if deadline else None,
    )


def values_settings(values: dict) -> ClusterSettings:
    """Concrete settings from chart values (charts/mass-jobs/values.yaml with a user's files merged
    over it): what `mass render argo --values` bakes into plain YAML, leaf for leaf as the chart does."""

    def get(dotted: str):
        node = values
        for part in dotted.split("."):
            node = node[part]
        return node

    def pod(name: str, gpu: bool = False) -> Pod:
        r = get(f"resources.{name}")
        deadline = r.get("activeDeadlineSeconds") if name in ("step", "merge") else None
        return Pod(
            cpu=str(r["cpu"]),
            memory=str(r["memory"]),
            gpu=str(r["gpu"]) if gpu else "0",
            ephemeral=str(r["ephemeralStorage"]),
            deadline_s=None if deadline is None else str(deadline),
        )

    net = values.get("network") or {}
    cron = values.get("cron") or {}
    base = ClusterSettings()
    sched = values.get("scheduling") or {}

    def placement(cls: str) -> Placement:
        v = sched.get(cls) or {}
        return Placement(
            node_selector=dict(v.get("nodeSelector") or {}),
            tolerations=tuple(v.get("tolerations") or ()),
            affinity=dict(v.get("affinity") or {}),
            priority_class=str(v.get("priorityClassName") or ""),
        )

    return replace(
        base,
        namespace=values.get("namespace") or None,
        images=Images(
            jobs=get("images.jobs"),
            sandbox=get("images.sandbox"),
            trainer=get("images.trainer"),
            server=get("images.server"),
            pull_policy=get("images.pullPolicy"),
        ),
        bucket=get("s3.bucket"),
        s3_endpoint=get("s3.endpoint"),
        s3_insecure=bool(get("s3.insecure")),
        s3_region=get("s3.region"),
        s3_endpoint_url=None,
        s3_secret=get("s3.secretName"),
        judge_secret=get("judges.secretName"),
        judge_keys=tuple(get("judges.keys")),
        gpu_resource=get("gpu.resourceName"),
        gpu_jobs=str(get("gpu.concurrentJobs")),
        agent=pod("agent", gpu=True),
        qwen=pod("qwen"),
        harness=pod("harness"),
        step=pod("step"),
        merge=pod("merge"),
        server=pod("server", gpu=True),
        trainer=pod("trainer"),
        cluster_domain=str(get("clusterDomain")),
        dns_peers=tuple((net.get("dns") or {}).get("to") or ()),
        max_model_len=str(get("model.maxModelLen")),
        tool_call_parser=get("model.toolCallParser"),
        reasoning_parser=get("model.reasoningParser"),
        agent_pods=str(get("agent.parallelism")),
        agent_deadline_s=str(get("agent.activeDeadlineSeconds")),
        agent_parallelism=int(get("agent.parallelism")),
        serve_deadline_s=str(get("model.readyDeadlineSeconds")),
        train_deadline_s=str(get("resources.trainer.activeDeadlineSeconds")),
        kueue_queue=str(get("kueue.queueName") or ""),
        kueue_pods=bool(get("kueue.podIntegration")),
        queue_wait_s=str(get("kueue.maxQueueSeconds")),
        schedules=tuple(cron.get("schedules", base.schedules)),
        cron_timezone=cron.get("timezone", base.cron_timezone),
        cron_suspend=bool(cron.get("suspend", base.cron_suspend)),
        cron_spec=cron.get("spec", base.cron_spec),
        cron_run=cron.get("run", base.cron_run),
        api_server_peers=tuple((net.get("apiServer") or {}).get("to") or ()),
        api_server_ports=tuple((net.get("apiServer") or {}).get("ports") or ()),
        s3_peers=tuple((net.get("s3") or {}).get("to") or ()),
        s3_ports=tuple((net.get("s3") or {}).get("ports") or ()),
        s3_fqdns=tuple((net.get("s3") or {}).get("fqdns") or ()),
        # Cilium's port lists follow the ports above (derived again, not the defaults' own)
        s3_cilium_ports=(),
        api_server_cilium_ports=(),
        dns_cilium_endpoints=tuple((net.get("dns") or {}).get("ciliumEndpoints") or ()),
        scheduling={c: placement(c) for c in SCHEDULING_CLASSES},
        image_pull_secrets=tuple(p["name"] for p in values.get("imagePullSecrets") or ()),
        pending_timeout_s=str(sched.get("pendingTimeoutSeconds", base.pending_timeout_s)),
        scratch={
            c: Scratch(size=str(v.get("size") or ""), storage_class=str(v.get("storageClass") or ""))
            for c in SCRATCH_CLASSES
            for v in [(values.get("scratch") or {}).get(c) or {}]
        },
    )
