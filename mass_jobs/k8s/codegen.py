"""Every generated Kubernetes file, as {relative path: text}, from one set of builders.

`argo_files()` -> argo/, `manifest_files()` -> manifests/, `chart_files()` -> the chart's
generated templates. Tests regenerate these into a temporary dir and compare byte for byte;
`write(files, root)` is what `mass render argo` calls.
"""

from __future__ import annotations

from pathlib import Path

from mass_jobs.k8s import argo, manifests, serving, training
from mass_jobs.pipeline import by_name
from mass_jobs.k8s.settings import ClusterSettings, helm_settings
from mass_jobs.k8s.yamlio import dump_docs, header, helmify

RENDER = "mass render argo --out argo/ --manifests manifests/ --chart charts/mass-jobs/"

_CYCLE_DOC = (
    "WorkflowTemplate mass-cycle: one MASS generation (L_gen -> L_gen+1).",
    [
        "Inputs (parameters): spec (s3:// URI of the run spec), run (the spec's name), gen (default 0).",
        "Steps (from mass_jobs/pipeline.py): validate -> serve-model (InferenceService, wait Loaded; only",
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


def _argo_docs(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    return {
        "mass-cycle.yaml": (_CYCLE_DOC, [argo.mass_cycle(s)]),
        "mass-run.yaml": (_RUN_DOC, [argo.mass_run(s)]),
        "mass-nightly.yaml": (_CRON_DOC, [argo.cron(s)]),
    }


def _manifest_docs(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    return {
        "serviceaccounts.yaml": (("ServiceAccounts: executor, workflow pods, model storage initializer.",
                                  ["The executor's token Secret is filled by Kubernetes (no value here)."]),
                                 manifests.service_accounts(s)),
        "rbac.yaml": (("Role + RoleBinding of the Argo executor ServiceAccount.",
                       ["workflowtaskresults (create, patch); pytorchjobs and inferenceservices for resource templates."]),
                      manifests.rbac(s)),
        "networkpolicy.yaml": (("NetworkPolicy of the sandboxed agent pods (mass-jobs.io/step=episode).",
                                ["No ingress. Egress: DNS, the model predictor (8080), and for Argo's wait/init",
                                 "containers the kube-apiserver and the S3 endpoint (set these CIDRs per cluster)."]),
                               [manifests.agent_network_policy(s)]),
        "artifact-repositories.yaml": (("ConfigMap artifact-repositories: the S3 repository of Argo artifacts.", []),
                                       [manifests.artifact_repositories(s)]),
        "semaphores.yaml": (("ConfigMap mass-semaphores: how many GPU jobs (PyTorchJobs) run at once.", []),
                            [manifests.semaphores(s)]),
        "secret-templates.yaml": (("Secret templates: keys only, values empty; fill them out of band.",
                                   ["S3 credentials (also read by KServe's storage initializer) and judge API keys."]),
                                  manifests.secret_templates(s)),
    }


def _base_docs(s: ClusterSettings) -> dict[str, tuple[tuple, list[dict]]]:
    labels = serving.example_labels()
    return {
        "inferenceservice-base.yaml": (
            ("InferenceService base: the object mass-cycle's serve-model step creates, with example values.",
             ["HuggingFace runtime with vLLM: tool-call and reasoning parsers, max model length; model from S3."]),
            [serving.inference_service(s, serving.isvc_name("demo", "0"), "s3://mass-jobs/runs/demo/gen-0/model",
                                       labels)]),
        "pytorchjob-base.yaml": (
            ("PyTorchJob base: the object mass-cycle's train step creates, with example values.",
             ["Master + Workers, container pytorch, torchrun from the operator's PET_* env running mass train."]),
            [training.pytorch_job(s, training.job_name("mass-run-abcde", "0"),
                                  by_name("train").argv("s3://mass-jobs/specs/demo.yaml", 0),
                                  {**labels, "mass-jobs.io/step": "train"}, env=argo.step_env_dicts(s),
                                  workers=2, nproc="2", gpus="2")]),
    }


def _render(docs: dict, prefix: str, command: str) -> dict[str, str]:
    return {f"{prefix}{name}": header(title, lines, command) + dump_docs(objs)
            for name, ((title, lines), objs) in docs.items()}


def argo_files() -> dict[str, str]:
    return _render(_argo_docs(ClusterSettings()), "argo/", "mass render argo --out argo/")


def manifest_files() -> dict[str, str]:
    s = ClusterSettings()
    return _render({**_manifest_docs(s), **_base_docs(s)}, "manifests/", "mass render argo --manifests manifests/")


# Chart templates installed only when a value switches them on.
_CHART_CONDITIONS = {
    "secret-templates.yaml": ".Values.secretTemplates.create",
    "mass-nightly.yaml": ".Values.cron.enabled",
}


def chart_files() -> dict[str, str]:
    s = helm_settings()
    out = {}
    for name, text in _render({**_manifest_docs(s), **_argo_docs(s)}, "", "mass render argo --chart charts/mass-jobs/").items():
        body = helmify(text)
        if name in _CHART_CONDITIONS:
            body = f"{{{{- if {_CHART_CONDITIONS[name]} }}}}\n{body}{{{{- end }}}}\n"
        out[f"charts/mass-jobs/templates/{name}"] = body
    return out


def write(files: dict[str, str], root: Path) -> list[Path]:
    """Write files under root; returns the paths written (sorted)."""
    written = []
    for rel, text in sorted(files.items()):
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
