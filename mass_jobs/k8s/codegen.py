"""Every generated Kubernetes file, as {relative path: text}, from one set of builders.

`argo_files()` -> argo/, `manifest_files()` -> manifests/ (only objects safe to apply as they
are), `example_files()` -> examples/k8s/ (reference objects with example values, Secret
templates, the per-cluster network policies and the Argo controller settings, all to read or
edit, never to apply blindly), `chart_files()` -> the chart's generated templates. Tests
regenerate these into a temporary dir and compare byte for byte; `write(files, root)` is what
`mass render argo` calls.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mass_jobs.k8s import argo, manifests, pods, serving, training
from mass_jobs.k8s.settings import ClusterSettings, helm_settings
from mass_jobs.k8s.yamlio import dump_docs, header, helmify
from mass_jobs.pipeline.table import trainer_step

RENDER = "mass render argo --out argo/ --manifests manifests/ --examples examples/k8s/ --chart charts/mass-jobs/"

_CYCLE_DOC = (
    "WorkflowTemplate mass-cycle: one MASS generation (L_gen -> L_gen+1).",
    [
        "Inputs (parameters): spec (s3:// URI of the run spec), run (the spec's name), gen (default 0).",
        "Steps (from mass_jobs/pipeline/table.py): validate -> serve-model (InferenceService, wait Loaded; only",
        "when a model step is not stored) -> search per task (bounded recursion over --iteration K) ->",
        "collect per task x episode (prepare, sandboxed agent pod, ingest; parallelism-bounded) ->",
        "collect-summary per task -> guard -> rank -> release-model -> render -> train (PyTorchJob,",
        "delete-then-create) -> select -> merge -> evaluate (L_gen+1 vs L_0 and L_gen) -> report;",
        "one cycle per run at a time (mutex); onExit deletes the InferenceService.",
        "Outputs: store objects under <store>/<run>/gen-<gen>/ and gen-<gen+1>/model/ (see docs/architecture.md).",
        "Submit: argo submit --from workflowtemplate/mass-cycle -p spec=s3://... -p run=NAME -p gen=0",
    ],
)
_RUN_DOC = (
    "WorkflowTemplate mass-run: a whole run, L0 -> L_N (each cycle evaluates the model it merged).",
    [
        "Inputs (parameters): spec (s3:// URI of the run spec), run (the spec's name).",
        "Steps: validate -> chain (mass-cycle/cycle for gen 0..N-1, bounded recursion); each",
        "generation's InferenceService is deleted on exit.",
        "Outputs: the run's store prefix, report/ included.",
        "Submit: argo submit --from workflowtemplate/mass-run -p spec=s3://... -p run=NAME",
    ],
)
_CRON_DOC = (
    "CronWorkflow mass-nightly: runs workflowtemplate/mass-run on a schedule (suspended by default).",
    [
        "Inputs: the spec URI and run name set below (chart values cron.spec / cron.run).",
        "Outputs: one mass-run Workflow per schedule tick; concurrencyPolicy Forbid.",
        "Enable: argo cron resume mass-nightly",
    ],
)


def _argo_docs(s: ClusterSettings, pipeline: str | None = None) -> dict[str, tuple[tuple, list[dict]]]:
    return {
        "mass-cycle.yaml": (_CYCLE_DOC, [argo.mass_cycle(s, pipeline)]),
        "mass-run.yaml": (_RUN_DOC, [argo.mass_run(s)]),
        "mass-nightly.yaml": (_CRON_DOC, [argo.cron(s)]),
    }


def _manifest_docs(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    """What `kubectl apply -f manifests/` installs: no workload, no Secret to fill, no cluster address."""
    return {
        "serviceaccounts.yaml": (
            (
                "ServiceAccounts: executor, workflow pods, model storage initializer.",
                ["The executor's token Secret is filled by Kubernetes (no value here)."],
            ),
            manifests.service_accounts(s),
        ),
        "rbac.yaml": (
            (
                "Role + RoleBinding of the Argo executor ServiceAccount.",
                [
                    "workflowtaskresults (create, patch); pytorchjobs, inferenceservices, and the egress proxy's",
                    "deployments and services for resource templates; pods (get): an unstarted trainer's",
                    "scheduling message.",
                ],
            ),
            manifests.rbac(s),
        ),
        "networkpolicy.yaml": (
            (
                "NetworkPolicy of the sandboxed agent pods (mass-jobs.io/step=episode).",
                [
                    "No ingress. Egress: DNS, the model predictor (8080) and the run's egress proxy",
                    "(3128, the egress-proxy Deployment of each cycle) only. Argo's wait/init",
                    "containers also need the kube-apiserver and S3: add those per cluster",
                    "(examples/k8s/networkpolicy-cluster-egress.yaml, or the chart's network.* values).",
                ],
            ),
            [manifests.agent_network_policy(s)],
        ),
        "artifact-repositories.yaml": (
            ("ConfigMap artifact-repositories: the S3 repository of Argo artifacts.", []),
            [manifests.artifact_repositories(s)],
        ),
        "semaphores.yaml": (
            ("ConfigMap mass-semaphores: how many GPU jobs (PyTorchJobs) run at once.", []),
            [manifests.semaphores(s)],
        ),
    }


_SECRETS_DOC = (
    "Secret templates: keys only, values empty; fill them out of band.",
    ["S3 credentials (also read by KServe's storage initializer) and judge API keys."],
)
_S3_POLICY_DOC = (
    "NetworkPolicy: agent pods may reach the S3 endpoint (Argo's artifacts).",
    ["Peers are per cluster (no default): the S3 endpoint's IPs, or a selector of an in-cluster MinIO."],
)
_API_POLICY_DOC = (
    "NetworkPolicy: agent pods may reach the kube-apiserver (Argo's task results).",
    [
        "Peers are per cluster (no default): the apiserver's endpoint IPs (`kubectl get endpoints",
        "kubernetes`); policies see destinations after Service NAT, never the ClusterIP.",
    ],
)
_S3_FQDN_DOC = (
    "CiliumNetworkPolicy: agent pods may reach the S3 endpoint by name (toFQDNs).",
    ["Instead of networkpolicy-s3 when network.s3.fqdns is set: no address ranges to keep up to date."],
)
_CILIUM_DOC = (
    "CiliumNetworkPolicy: agent pods may reach the kube-apiserver (the kube-apiserver entity).",
    ["The Cilium form of the apiserver egress: no IPs to keep up to date."],
)


def _chart_only_docs(s: ClusterSettings, only=None) -> dict[str, tuple[tuple, list[dict]]]:
    """The chart's conditional objects (`_CHART_CONDITIONS`); `only`: the names to build (a policy
    refuses to build without its peers, which only the selected ones have)."""
    build = {
        "networkpolicy-s3.yaml": lambda: (_S3_POLICY_DOC, [manifests.agent_s3_policy(s)]),
        "networkpolicy-apiserver.yaml": lambda: (_API_POLICY_DOC, [manifests.agent_api_server_policy(s)]),
        "ciliumnetworkpolicy-apiserver.yaml": lambda: (_CILIUM_DOC, [manifests.agent_api_server_cilium_policy(s)]),
        "ciliumnetworkpolicy-s3.yaml": lambda: (_S3_FQDN_DOC, [manifests.agent_s3_fqdn_policy(s)]),
        "secret-templates.yaml": lambda: (_SECRETS_DOC, manifests.secret_templates(s)),
    }
    return {name: make() for name, make in build.items() if only is None or name in only}


# Documentation address ranges (RFC 5737): they reach nothing, so an unedited example fails closed.
EXAMPLE_API_SERVER_PEERS = ({"ipBlock": {"cidr": "192.0.2.10/32"}}, {"ipBlock": {"cidr": "192.0.2.11/32"}})
EXAMPLE_S3_PEERS = ({"ipBlock": {"cidr": "198.51.100.0/24"}},)
EXAMPLE_S3_FQDNS = ({"matchName": "s3.us-east-1.amazonaws.com"}, {"matchPattern": "*.s3.us-east-1.amazonaws.com"})


def _example_docs(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    return {**_example_objects(s), **_example_policies(s), **_controller_settings()}


def _example_objects(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    """What mass-cycle creates, with example values, for reading."""
    labels = serving.example_labels()
    trainer = trainer_step()
    return {
        "inferenceservice-base.yaml": (
            (
                "InferenceService base: the object mass-cycle's serve-model step creates, with example values.",
                [
                    "HuggingFace runtime with vLLM: tool-call and reasoning parsers, max model length; model from S3.",
                    "For reading: mass-cycle creates and deletes it; applying it starts a GPU server.",
                ],
            ),
            [
                serving.inference_service(
                    s, serving.isvc_name("demo", "0"), "s3://mass-jobs/runs/demo/gen-0/model", labels
                )
            ],
        ),
        "pytorchjob-base.yaml": (
            (
                "PyTorchJob base: the object mass-cycle's train step creates, with example values.",
                [
                    "Master + Workers, container pytorch, torchrun from the operator's PET_* env running mass train.",
                    "For reading: mass-cycle creates and deletes it; applying it starts a GPU job.",
                ],
            ),
            [
                training.pytorch_job(
                    s,
                    training.job_name("demo", "0", trainer.name),
                    trainer.argv("s3://mass-jobs/specs/demo.yaml", 0),
                    {**labels, "mass-jobs.io/step": trainer.name},
                    env=argo.step_env_dicts(s),
                    workers=2,
                    nproc="2",
                    gpus="2",
                )
            ],
        ),
    }


def _example_policies(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    """Secret templates and the per-cluster network policies to fill in."""
    net = replace(s, api_server_peers=EXAMPLE_API_SERVER_PEERS, s3_peers=EXAMPLE_S3_PEERS)
    return {
        "secret-templates.yaml": (
            (_SECRETS_DOC[0], _SECRETS_DOC[1] + ["Applying this file unedited blanks Secrets of the same names."]),
            manifests.secret_templates(s),
        ),
        "networkpolicy-cluster-egress.yaml": (
            (
                "NetworkPolicies: agent pods may reach the kube-apiserver and S3 (Argo's wait/init containers).",
                [
                    "Replace the example CIDRs (documentation ranges that reach nothing) with this cluster's:",
                    "kubectl get endpoints kubernetes -o jsonpath='{.subsets[*].addresses[*].ip}' (each as IP/32), and",
                    "the S3 endpoint's IPs, or a namespaceSelector/podSelector for an in-cluster MinIO.",
                    "On Cilium, ciliumnetworkpolicy-apiserver.yaml replaces the apiserver policy.",
                ],
            ),
            [manifests.agent_api_server_policy(net), manifests.agent_s3_policy(net)],
        ),
        "ciliumnetworkpolicy-apiserver.yaml": (_CILIUM_DOC, [manifests.agent_api_server_cilium_policy(s)]),
        "ciliumnetworkpolicy-s3.yaml": (
            (
                _S3_FQDN_DOC[0],
                [
                    "On Cilium, instead of the S3 policy of networkpolicy-cluster-egress.yaml: AWS S3 in",
                    "us-east-1 by name (path- and virtual-host-style); replace the region with the bucket's.",
                ],
            ),
            [manifests.agent_s3_fqdn_policy(replace(s, s3_fqdns=EXAMPLE_S3_FQDNS))],
        ),
    }


def _controller_settings() -> dict[str, tuple[tuple, list[dict]]]:
    """Settings of the controllers the chart does not install: Argo's, the training operator's, KServe's."""
    return {
        "argo-controller-values.yaml": (
            (
                'Argo Workflows controller settings for Pod Security "restricted" (argo-workflows Helm chart values).',
                [
                    "Argo's init and wait containers (and the main container of resource templates) take their",
                    "securityContext from the controller's config, not from the WorkflowTemplate:",
                    "helm upgrade argo-workflows argo/argo-workflows -f argo-controller-values.yaml, or the same",
                    "block under `executor:` in the workflow-controller-configmap.",
                ],
            ),
            [{"executor": {"securityContext": pods.executor_security_context()}}],
        ),
        "training-operator-init-container.yaml": (
            (
                'Training operator (v1.9) template of the PyTorchJob Worker init container, hardened for "restricted".',
                [
                    "The built-in one has no securityContext. Mount this file into the operator and pass",
                    "--pytorch-init-container-template-file=<path>; {{.InitContainerImage}} and {{.MasterAddr}}",
                    "are filled by the operator.",
                ],
            ),
            [training.operator_init_container_template()],
        ),
        "kserve-storage-initializer-patch.yaml": (
            (
                'KServe: the storage-initializer init container\'s securityContext, for Pod Security "restricted", and its memory.',
                [
                    "KServe merges the ClusterStorageContainer that serves s3:// into the storage initializer it",
                    "injects; KServe installs one named `default`:",
                    "kubectl patch clusterstoragecontainer default --type merge --patch-file kserve-storage-initializer-patch.yaml",
                    "Its memory: KServe's default limit is 1Gi, and a download of tens of GB from S3 goes through",
                    "the page cache, which counts against it: at 1Gi the writeback throttles the download.",
                ],
            ),
            [
                {
                    "spec": {
                        "container": {
                            "name": "storage-initializer",
                            "resources": pods.STORAGE_INITIALIZER_RESOURCES,
                            "securityContext": pods.executor_security_context(),
                        }
                    }
                }
            ],
        ),
    }


def _render(docs: dict, prefix: str, command: str) -> dict[str, str]:
    return {
        f"{prefix}{name}": header(title, lines, command) + dump_docs(objs)
        for name, ((title, lines), objs) in docs.items()
    }


def argo_files(
    settings: ClusterSettings | None = None, command: str = "mass render argo --out argo/", pipeline: str | None = None
) -> dict[str, str]:
    return _render(_argo_docs(settings or ClusterSettings(), pipeline), "argo/", command)


def manifest_files(
    settings: ClusterSettings | None = None, command: str = "mass render argo --manifests manifests/"
) -> dict[str, str]:
    return _render(_manifest_docs(settings or ClusterSettings()), "manifests/", command)


def example_files(
    settings: ClusterSettings | None = None, command: str = "mass render argo --examples examples/k8s/"
) -> dict[str, str]:
    return _render(_example_docs(settings or ClusterSettings()), "examples/k8s/", command)


# Chart templates installed only when a value switches them on.
_CHART_CONDITIONS = {
    "secret-templates.yaml": ".Values.secretTemplates.create",
    "mass-nightly.yaml": ".Values.cron.enabled",
    "networkpolicy-apiserver.yaml": "not .Values.network.cilium",
    "ciliumnetworkpolicy-apiserver.yaml": ".Values.network.cilium",
    "networkpolicy-s3.yaml": "not .Values.network.s3.fqdns",
    "ciliumnetworkpolicy-s3.yaml": ".Values.network.s3.fqdns",
}


def chart_files() -> dict[str, str]:
    s = helm_settings()
    out = {}
    for name, text in _render(
        {**_manifest_docs(s), **_chart_only_docs(s), **_argo_docs(s)}, "", "mass render argo --chart charts/mass-jobs/"
    ).items():
        body = helmify(text)
        if name in _CHART_CONDITIONS:
            body = f"{{{{- if {_CHART_CONDITIONS[name]} }}}}\n{body}{{{{- end }}}}\n"
        out[f"charts/mass-jobs/templates/{name}"] = body
    return out


def values_policy_files(settings: ClusterSettings, values: dict, prefix: str, command: str) -> dict[str, str]:
    """What the chart installs beside the manifests for these values, as plain YAML: the network
    policies its `network.*` values select (Cilium's when `network.cilium`, the FQDN S3 policy when
    `network.s3.fqdns`), and the Secret templates when `secretTemplates.create`. The same
    conditions as the chart's templates (`_CHART_CONDITIONS`)."""
    net = values.get("network") or {}
    cilium, fqdns = net.get("cilium") is True, bool((net.get("s3") or {}).get("fqdns"))
    on = {
        "networkpolicy-apiserver.yaml": not cilium,
        "ciliumnetworkpolicy-apiserver.yaml": cilium,
        "networkpolicy-s3.yaml": not fqdns,
        "ciliumnetworkpolicy-s3.yaml": fqdns,
        "secret-templates.yaml": (values.get("secretTemplates") or {}).get("create") is True,
    }
    return _render(_chart_only_docs(settings, only={name for name, yes in on.items() if yes}), prefix, command)


def write(files: dict[str, str], root: Path) -> list[Path]:
    """Write files under root; returns the paths written (sorted)."""
    written = []
    for rel, text in sorted(files.items()):
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
