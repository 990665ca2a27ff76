"""Plain Kubernetes objects mass-jobs needs next to its WorkflowTemplates.

ServiceAccounts, RBAC, the agent NetworkPolicy, the artifact-repository and semaphore
ConfigMaps and Secret templates (keys only, never values). Written to `manifests/` and, with
Helm placeholders, into the chart (`mass render argo --manifests DIR --chart DIR`).
"""

from __future__ import annotations

from mass_jobs.k8s import labels as L
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.sandbox.egress_service import PORT as EGRESS_PORT

EXECUTOR_SA = "mass-executor"  # Argo's wait/init containers and resource templates
WORKFLOW_SA = "mass-workflow"  # main containers: no API rights, token not mounted
MODEL_SA = "mass-model"  # KServe storage initializer: reads the model from S3
SERVE_WAIT_SA = "mass-serve-wait"  # the serve step's wait: reads its InferenceService and predictor pods
ARTIFACT_REPOSITORIES = "artifact-repositories"
ARTIFACT_KEY = "default-v1"
SEMAPHORES = "mass-semaphores"
GPU_SEMAPHORE_KEY = "gpu-jobs"
AGENT_SEMAPHORE_KEY = "agent-pods"  # every agent pod of every run in the namespace (agent.parallelism)
AGENT_POLICY = "mass-agent-egress"
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# The agent pods' step label: the NetworkPolicy selects on it.
AGENT_STEP = "episode"
MODEL_STEP = "serve"
EGRESS_STEP = "egress-proxy"  # the run's egress proxy (a Deployment of each cycle, egress_proxy.py)
PREDICTOR_PORT = 8080  # container port behind the `<isvc>-predictor` Service (80)


def _meta(name: str, settings: ClusterSettings, component: str, **extra) -> dict:
    meta = {"name": name, "labels": L.object_labels(component, settings.chart), **extra}
    if settings.namespace:
        meta["namespace"] = settings.namespace
    return meta


def service_accounts(s: ClusterSettings) -> list[dict]:
    from mass_jobs.k8s.pods import pull_secrets

    def sa(name, component, **extra):
        return {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(name, s, component),
            **extra,
            **pull_secrets(s),
        }

    return [
        sa(EXECUTOR_SA, "executor"),
        # Workflow pods never see a token; Argo mounts the executor's into its own containers.
        sa(WORKFLOW_SA, "workflow", automountServiceAccountToken=False),
        sa(MODEL_SA, "model", automountServiceAccountToken=False, secrets=[{"name": s.s3_secret}]),
        # its token is mounted by the one template that runs as it (serve-model-wait): our code only
        sa(SERVE_WAIT_SA, "serve-wait", automountServiceAccountToken=False),
        # With automountServiceAccountToken false Argo reads the executor token from this Secret.
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": _meta(
                f"{EXECUTOR_SA}.service-account-token",
                s,
                "executor",
                annotations={"kubernetes.io/service-account.name": EXECUTOR_SA},
            ),
        },
    ]


def rbac(s: ClusterSettings) -> list[dict]:
    verbs = ["create", "get", "list", "watch", "patch", "delete"]
    executor = [
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
        # setOwnerReference sets blockOwnerDeletion: where OwnerReferencesPermissionEnforcement is on
        # (OpenShift) that needs update on the owner's finalizers
        {"apiGroups": ["argoproj.io"], "resources": ["workflows/finalizers"], "verbs": ["update"]},
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": verbs},
        {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": verbs},
        # each cycle's egress proxy (egress_proxy.py): its Deployment and Service
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["services"], "verbs": verbs},
        # a trainer job that never started: its Master's scheduling message, read before the job goes
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]
    # KServe says nothing of a predictor pod no node takes: the serve step's wait reads the pods
    # themselves (mass_jobs/cluster/model_wait.py), and may do nothing else
    serve_wait = [
        {"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    return [*_role(EXECUTOR_SA, s, "executor", executor), *_role(SERVE_WAIT_SA, s, "serve-wait", serve_wait)]


def _role(account: str, s: ClusterSettings, component: str, rules: list[dict]) -> list[dict]:
    """A Role named after the ServiceAccount it grants `rules` to, and its RoleBinding."""
    api = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{api}/v1", "kind": "Role", "metadata": _meta(account, s, component), "rules": rules},
        {
            "apiVersion": f"{api}/v1",
            "kind": "RoleBinding",
            "metadata": _meta(account, s, component),
            "roleRef": {"apiGroup": api, "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account}],
        },
    ]


def agent_network_policy(s: ClusterSettings) -> dict:
    """Agent pods: no ingress; egress to DNS, the model predictor and the run's egress proxy only (the
    proxy holds model-written code to the spec's execution.network and records it). The apiserver and S3
    egress of Argo's wait/init containers are separate policies (allows add up), because their
    peers are per cluster: see agent_api_server_policy, agent_api_server_cilium_policy, agent_s3_policy."""
    dns_ports = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    return _agent_policy(
        AGENT_POLICY,
        s,
        ["Ingress", "Egress"],
        [
            {"to": _listish(s.dns_peers), "ports": dns_ports},
            {
                "to": [{"podSelector": {"matchLabels": {L.STEP: MODEL_STEP}}}],
                "ports": [{"port": PREDICTOR_PORT, "protocol": "TCP"}],
            },
            {
                "to": [{"podSelector": {"matchLabels": {L.STEP: EGRESS_STEP}}}],
                "ports": [{"port": EGRESS_PORT, "protocol": "TCP"}],
            },
        ],
        ingress=[],
    )


def agent_api_server_policy(s: ClusterSettings) -> dict:
    """Egress to the kube-apiserver's endpoint IPs (NetworkPolicies never match the `kubernetes`
    Service ClusterIP: they see the destination after NAT)."""
    return _agent_policy(
        f"{AGENT_POLICY}-apiserver",
        s,
        ["Egress"],
        [{"to": _required(s.api_server_peers, "api_server_peers"), "ports": _listish(s.api_server_ports)}],
    )


def agent_api_server_cilium_policy(s: ClusterSettings) -> dict:
    """The Cilium form of agent_api_server_policy: the `kube-apiserver` entity, no IPs to keep."""
    return _cilium_policy(
        f"{AGENT_POLICY}-apiserver",
        s,
        [{"toEntities": ["kube-apiserver"], "toPorts": [{"ports": _listish(s.api_server_cilium_ports)}]}],
    )


def agent_s3_policy(s: ClusterSettings) -> dict:
    """Egress to the S3 endpoint of Argo's artifacts."""
    return _agent_policy(
        f"{AGENT_POLICY}-s3", s, ["Egress"], [{"to": _required(s.s3_peers, "s3_peers"), "ports": _listish(s.s3_ports)}]
    )


def agent_s3_fqdn_policy(s: ClusterSettings) -> dict:
    """The Cilium form of agent_s3_policy: the S3 endpoint by DNS name (toFQDNs), which follows the
    endpoint's changing IPs where a CIDR list falls behind. Cilium learns a name's addresses from
    the DNS answers its proxy sees, so the policy also sends the pods' DNS through it."""
    return _cilium_policy(
        f"{AGENT_POLICY}-s3",
        s,
        [
            {
                "toEndpoints": _listish(s.dns_cilium_endpoints),
                "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": [{"matchPattern": "*"}]}}],
            },
            {"toFQDNs": _required(s.s3_fqdns, "s3_fqdns"), "toPorts": [{"ports": _listish(s.s3_cilium_ports)}]},
        ],
    )


def _cilium_policy(name: str, s: ClusterSettings, egress: list[dict]) -> dict:
    """A CiliumNetworkPolicy of the agent pods' egress (cilium.io/v2)."""
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": _meta(name, s, "agent"),
        "spec": {"endpointSelector": {"matchLabels": {L.STEP: AGENT_STEP}}, "egress": egress},
    }


def _agent_policy(name: str, s: ClusterSettings, types: list[str], egress: list[dict], **extra) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(name, s, "agent"),
        "spec": {"podSelector": {"matchLabels": {L.STEP: AGENT_STEP}}, "policyTypes": types, **extra, "egress": egress},
    }


def _required(peers, field: str):
    # An egress rule with an empty `to` allows every destination: never render one.
    if not peers:
        raise ValueError(
            f"ClusterSettings.{field} is required: the NetworkPolicy peers of this cluster "
            "(an empty list would allow every destination)"
        )
    return _listish(peers)


def _listish(v):
    return v if isinstance(v, str) else [dict(x) for x in v]


# Where Argo keeps each pod's artifacts and, with archiveLogs, its `main-logs` (<prefix>/main.log).
ARTIFACT_KEY_FORMAT = "argo-artifacts/{{workflow.name}}/{{pod.name}}"


def artifact_repositories(s: ClusterSettings) -> dict:
    """The S3 artifact repository Argo uses for agent inputs/outputs (Argo reads its `data`)."""
    import yaml

    repo = {
        "archiveLogs": True,
        "s3": {
            "bucket": s.bucket,
            "endpoint": s.s3_endpoint,
            "insecure": s.s3_insecure,
            "region": s.s3_region,
            "keyFormat": ARTIFACT_KEY_FORMAT,
            "accessKeySecret": {"name": s.s3_secret, "key": S3_KEYS[0]},
            "secretKeySecret": {"name": s.s3_secret, "key": S3_KEYS[1]},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            ARTIFACT_REPOSITORIES,
            s,
            "artifacts",
            annotations={"workflows.argoproj.io/default-artifact-repository": ARTIFACT_KEY},
        ),
        "data": {ARTIFACT_KEY: yaml.safe_dump(repo, sort_keys=True, width=10**9)},
    }


def semaphores(s: ClusterSettings) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(SEMAPHORES, s, "semaphores"),
        "data": {GPU_SEMAPHORE_KEY: s.gpu_jobs, AGENT_SEMAPHORE_KEY: s.agent_pods},
    }


def secret_templates(s: ClusterSettings) -> list[dict]:
    """Secrets with their keys and empty values: fill them out of band (kubectl, external-secrets)."""
    s3 = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(
            s.s3_secret,
            s,
            "credentials",
            annotations={
                # KServe's storage initializer reads these from the Secret of the model's ServiceAccount.
                "serving.kserve.io/s3-endpoint": s.s3_endpoint,
                "serving.kserve.io/s3-usehttps": "0"
                if s.s3_insecure is True
                else "1"
                if s.s3_insecure is False
                else '@helm(ternary "0" "1" .Values.s3.insecure | quote)@',
                "serving.kserve.io/s3-region": s.s3_region,
            },
        ),
        "stringData": {k: "" for k in S3_KEYS},
    }
    judges = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(s.judge_secret, s, "credentials"),
        "stringData": {s.judge_keys: ""} if isinstance(s.judge_keys, str) else {k: "" for k in s.judge_keys},
    }
    return [s3, judges]
