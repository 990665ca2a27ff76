"""argo/: drift against the generator, upstream schemas (strict), and the workflow's own invariants."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from mass_jobs.k8s import codegen, labels, schemas
from tests.fixtures.k8s import REPO, load_docs

ARGO_FILES = codegen.argo_files()
PARAM = re.compile(
    r"\{\{\s*(inputs|workflow)\.parameters\.([A-Za-z0-9_-]+)\s*\}\}|(inputs|workflow)\.parameters\.([A-Za-z0-9_-]+)"
)
STEP_OUT = re.compile(r"steps\.([A-Za-z0-9_-]+)\.outputs\.(parameters|artifacts)\.([A-Za-z0-9_-]+)")


@pytest.mark.parametrize("rel", sorted(ARGO_FILES))
def test_checked_in_file_matches_generator(rel, tmp_path):
    codegen.write({rel: ARGO_FILES[rel]}, tmp_path)
    assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), f"{rel} is stale: run `{codegen.RENDER}`"


def test_no_stray_files_in_argo_dir():
    on_disk = {f"argo/{p.name}" for p in (REPO / "argo").iterdir()}
    assert on_disk == set(ARGO_FILES)


def test_generation_is_deterministic_and_has_readable_headers():
    again = codegen.argo_files()
    assert again == ARGO_FILES
    for rel, text in ARGO_FILES.items():
        head = text.split("apiVersion:")[0]
        assert head.startswith("# ") and "Inputs" in head and "Outputs" in head and "mass render argo" in head, rel
        assert not re.search(r"20\d\d-\d\d-\d\d|/home/|/work/|/root/", text), rel


@pytest.mark.parametrize("name", ["mass-cycle", "mass-run", "mass-nightly"])
def test_validates_against_upstream_schemas_strictly(argo_docs, name):
    assert schemas.all_errors(argo_docs[name]) == []


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["spec"]["templates"][0].__setitem__("retrySrategy", {}), "'retrySrategy' was unexpected"),
        (lambda d: d["spec"].__setitem__("synchronization", {"semaphore": {}}), "'semaphore' was unexpected"),
        (lambda d: d["spec"]["templates"][-1].__setitem__("activeDeadlineSeconds", 3.5), "activeDeadlineSeconds"),
    ],
    ids=["typo-in-template", "v3-singular-semaphore", "deadline-not-int-or-string"],
)
def test_invalid_objects_are_rejected(argo_docs, mutate, expected):
    doc = copy.deepcopy(argo_docs["mass-cycle"])
    mutate(doc)
    assert any(expected in e for e in schemas.schema_errors(doc))


def test_cron_uses_v4_schedules_and_only_references_the_template(argo_docs):
    cron = argo_docs["mass-nightly"]
    assert cron["spec"]["schedules"] == ["0 3 * * 1"] and "schedule" not in cron["spec"]
    assert set(cron["spec"]["workflowSpec"]) == {"workflowTemplateRef", "arguments"}
    assert cron["spec"]["workflowSpec"]["workflowTemplateRef"]["name"] in argo_docs
    bad = copy.deepcopy(cron)
    bad["spec"]["schedule"] = "* * * * *"
    assert any("'schedule' was unexpected" in e for e in schemas.schema_errors(bad))


# ---------------------------------------------------------------- references


def _templates(doc):
    return {t["name"]: t for t in doc["spec"].get("templates", [])}


def _steps(t):
    return [s for group in t.get("steps") or [] for s in group]


def _target(argo_docs, doc, ref_holder):
    if "templateRef" in ref_holder:
        ref = ref_holder["templateRef"]
        return argo_docs[ref["name"]], _templates(argo_docs[ref["name"]])[ref["template"]]
    return doc, _templates(doc)[ref_holder["template"]]


def test_every_template_reference_resolves(argo_docs):
    checked = 0
    for doc in argo_docs.values():
        names = _templates(doc)
        for ref in (doc["spec"].get("entrypoint"), doc["spec"].get("onExit")):
            if ref:
                assert ref in names, (doc["metadata"]["name"], ref)
        for t in names.values():
            for step in _steps(t):
                holders = [step] + [h for h in (step.get("hooks") or {}).values()]
                for h in holders:
                    other, target = _target(argo_docs, doc, h)
                    assert target["name"] in _templates(other)
                    checked += 1
    assert checked == 72  # the hooks among them: the train step's two unstarted-job ones, evaluate's release


def _used_params(obj, scope: str) -> set[str]:
    found = set()
    text = str(obj)
    for m in PARAM.finditer(text):
        s, n = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        if s == scope:
            found.add(n)
    return found


def test_every_parameter_used_is_declared(argo_docs):
    for doc in argo_docs.values():
        if doc["kind"] != "WorkflowTemplate":
            continue
        declared_wf = {p["name"] for p in doc["spec"]["arguments"]["parameters"]}
        for t in _templates(doc).values():
            body = {k: v for k, v in t.items() if k != "name"}
            inputs = {p["name"] for p in (t.get("inputs") or {}).get("parameters", [])}
            # Step arguments are evaluated in the caller's scope: check the caller's inputs.
            assert _used_params(body, "inputs") <= inputs, (doc["metadata"]["name"], t["name"])
            assert _used_params(t, "workflow") <= declared_wf, (doc["metadata"]["name"], t["name"])
            step_names = {s["name"]: s for s in _steps(t)}
            for step in _steps(t):
                for kind_hook in [step] + list((step.get("hooks") or {}).values()):
                    other, target = _target(argo_docs, doc, kind_hook)
                    wanted = {p["name"] for p in (target.get("inputs") or {}).get("parameters", []) if "value" not in p}
                    given = {p["name"] for p in (kind_hook.get("arguments") or {}).get("parameters", [])}
                    assert given == wanted, (t["name"], step["name"], given, wanted)
                    # A template of another WorkflowTemplate reads the caller's workflow parameters.
                    reached = _reachable(argo_docs, other, target)
                    assert _used_params(reached, "workflow") <= declared_wf, (step["name"], reached)
                for m in STEP_OUT.finditer(str(step)):
                    src = step_names[m.group(1)]
                    _, src_t = _target(argo_docs, doc, src)
                    outs = {o["name"] for o in (src_t.get("outputs") or {}).get(m.group(2), [])}
                    assert m.group(3) in outs, (step["name"], m.group(0))


def _reachable(argo_docs, doc, template, seen=None) -> list:
    seen = seen if seen is not None else set()
    if (doc["metadata"]["name"], template["name"]) in seen:
        return []
    seen.add((doc["metadata"]["name"], template["name"]))
    out = [template]
    for step in _steps(template):
        for h in [step] + list((step.get("hooks") or {}).values()):
            other, target = _target(argo_docs, doc, h)
            out += _reachable(argo_docs, other, target, seen)
    return out


def test_search_is_bounded_recursion_and_collect_fans_out_over_task_episode(argo_docs):
    t = _templates(argo_docs["mass-cycle"])
    loop = _steps(t["search-task"])
    assert [s["template"] for s in loop] == ["search", "search-task"]
    assert "iterations" in loop[1]["when"] and "+ 1" in loop[1]["arguments"]["parameters"][2]["value"]
    # one iteration: prepare (proposal, agent inputs) -> agent pods -> ingest each -> judge and save
    assert [s["template"] for s in _steps(t["search"])] == ["search-prepare", "search-rollouts", "search-finish"]
    assert all("--iteration" in t[n]["container"]["args"] for n in ("search-prepare", "search-finish"))

    for name in (
        "search-prepare",
        "search-ingest",
        "search-finish",
    ):  # one phase each, in episodes.rollouts.Phase's words
        args = t[name]["container"]["args"]
        assert args.count("--phase") == 1 and args[args.index("--phase") + 1] == name.rpartition("-")[2]
    assert [s["template"] for s in _steps(t["search-rollout"])] == ["agent-episode", "search-ingest"]
    assert _steps(t["search-rollouts"])[0]["withParam"] == "{{inputs.parameters.rollouts}}"
    cycle = {s["name"]: s for s in _steps(t["cycle"])}
    assert cycle["search"]["withParam"].endswith("outputs.parameters.tasks}}")
    assert cycle["collect"]["arguments"]["parameters"][1]["value"].endswith("outputs.parameters.episodes}}")
    assert _steps(t["collect"])[0]["withParam"] == "{{inputs.parameters.episodes}}"
    assert [s["template"] for s in _steps(t["collect-episode"])] == [
        "collect-prepare",
        "agent-episode",
        "collect-ingest",
    ]
    order = [s["name"] for s in _steps(t["cycle"])]
    # the run's egress proxy (its Service and Deployment) is up before anything that runs agent
    # pods, and deleted after the cycle's last step
    assert order == [
        "validate",
        "egress-service",
        "egress",
        "serve-model",
        "search",
        "collect",
        "collect-summary",
        "guard",
        "rank",
        "release-model",
        "render",
        "train",
        "select",
        "merge",
        "evaluate",
        "report",
        "delete-egress",
    ]
    assert [g[0]["name"] for g in t["cycle"]["steps"]][1] == "egress-service"  # one group: side by side
    assert {cycle[n]["template"] for n in ("egress-service", "egress")} == {"egress-service", "egress-proxy"}
    assert t["egress-proxy"]["resource"]["successCondition"] == "status.readyReplicas > 0"
    # every agent step gets the Service's name, never a pod's address
    assert {
        p["value"]
        for s in _steps(t["cycle"])
        for p in (s.get("arguments") or {}).get("parameters", [])
        if p["name"] == "egress"
    } == {"egress-{{workflow.uid}}-{{inputs.parameters.gen}}.{{workflow.namespace}}.svc.cluster.local"}
    assert argo_docs["mass-cycle"]["spec"]["onExit"] == "exit-handler"
    assert _steps(t["exit-handler"])[0]["template"] == "delete-models"
    # the exit handler deletes every InferenceService a cycle may make (L_g, L_g+1 and L_0) and its proxy
    assert [(s["template"], s["arguments"]["parameters"][0]["value"]) for s in _steps(t["delete-models"])] == [
        ("delete-model", "{{inputs.parameters.gen}}"),
        ("delete-model", "{{=asInt(inputs.parameters.gen) + 1}}"),
        ("delete-model", "0"),
        ("delete-egress", "{{inputs.parameters.gen}}"),
    ]
    assert sorted(s["template"] for s in _steps(t["delete-egress"])) == [
        "delete-egress-deployment",
        "delete-egress-service",
    ]


# ---------------------------------------------------------------- pods


def _pod_templates(argo_docs):
    for doc in argo_docs.values():
        for t in doc["spec"].get("templates", []):
            if "container" in t:
                yield doc, t


def test_every_pod_has_labels_security_and_limits(argo_docs):
    n = 0
    for _doc, t in _pod_templates(argo_docs):
        assert set(labels.POD_LABEL_KEYS) <= set(t["metadata"]["labels"]), t["name"]
        assert t["metadata"]["labels"][labels.RUN] == "{{workflow.parameters.run}}"
        sc = t["container"]["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
        limits = t["container"]["resources"]["limits"]
        assert {"cpu", "memory"} <= set(limits), t["name"]
        assert all(isinstance(v, str) for v in limits.values())
        for side in t.get("sidecars", []):  # the agent pod's sandbox container: the same hardening
            assert side["securityContext"] == {
                **sc,
                "runAsUser": side["securityContext"]["runAsUser"],
                "runAsGroup": side["securityContext"]["runAsGroup"],
            }, side["name"]
            assert {"cpu", "memory"} <= set(side["resources"]["limits"]), side["name"]
        assert t["retryStrategy"]["limit"] == "3"
        n += 1
    assert n == 22  # the egress proxy is a Deployment (its pod: test_k8s_pod_security)
    for doc in argo_docs.values():
        spec = doc["spec"]
        if doc["kind"] == "WorkflowTemplate":
            assert spec["automountServiceAccountToken"] is False
            assert spec["executor"]["serviceAccountName"] == "mass-executor"
            assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["seccompProfile"]
            assert spec["podGC"]["strategy"] and spec["ttlStrategy"]["secondsAfterSuccess"] > 0


def test_agent_pod_is_sandboxed_and_holds_no_credentials(argo_docs):
    agent = _templates(argo_docs["mass-cycle"])["agent-episode"]
    assert agent["container"]["command"] + agent["container"]["args"] == [
        "mass",
        "episode",
        "--in",
        "/in",
        "--out",
        "/out",
        "--sandbox",
        "/sandbox/sandbox.sock",
        "--qwen",
        "/qwen/qwen.sock",
        "--qwen-uid",
        "3000",
        "--egress-proxy",
        "http://{{inputs.parameters.egress}}:3128",
        "--rollout",
        "{{inputs.parameters.rollout}}",
    ]
    assert {v["mountPath"] for v in agent["container"]["volumeMounts"]} == {"/tmp", "/out", "/sandbox", "/qwen"}
    sandbox, qwen = agent["sidecars"]
    assert sandbox["command"] + sandbox["args"] == [
        "mass",
        "sandbox-serve",
        "--socket",
        "/sandbox/sandbox.sock",
        "--workspace",
        "/workspace/ws",
    ]
    assert {v["mountPath"] for v in sandbox["volumeMounts"]} == {"/tmp", "/workspace", "/sandbox"}  # not /qwen
    assert qwen["command"] + qwen["args"] == [
        "mass",
        "sandbox-serve",
        "--socket",
        "/qwen/qwen.sock",
        "--workspace",
        "/workspace/ws",
        "--qwen-only",
        "--shell-socket",
        "/sandbox/sandbox.sock",
    ]
    assert {v["mountPath"] for v in qwen["volumeMounts"]} == {"/tmp", "/workspace", "/sandbox", "/qwen"}
    # three uids: the harness (the pod's), the sandbox's, qwen-code's; the two sidecars' /tmp are their own
    uids = [c["securityContext"].get("runAsUser") for c in (sandbox, qwen)]
    assert uids == [2000, 3000] and argo_docs["mass-cycle"]["spec"]["securityContext"]["runAsUser"] not in uids
    tmp = {c["name"]: next(v["name"] for v in c["volumeMounts"] if v["mountPath"] == "/tmp") for c in (sandbox, qwen)}
    assert tmp == {"sandbox": "sandbox-tmp", "qwen": "qwen-tmp"}
    assert agent["automountServiceAccountToken"] is False
    assert int(agent["activeDeadlineSeconds"]) > 3600
    assert "envFrom" not in agent["container"] and "secretKeyRef" not in str(agent)
    # Key-only S3 artifacts at the keys `mass collect --phase prepare|ingest` writes and reads:
    # bucket, endpoint and credentials come from the artifact repository (Argo's containers only).
    ep = "{{inputs.parameters.store-prefix}}/{{inputs.parameters.rollout}}"
    keys = {a["path"]: a["s3"] for a in agent["inputs"]["artifacts"] + agent["outputs"]["artifacts"]}
    assert keys == {
        "/in/episode.json": {"key": f"{ep}/input/episode.json"},
        "/in/workspace.tar.gz": {"key": f"{ep}/input/workspace.tar.gz"},
        "/in/episode.key": {"key": f"{ep}/input/episode.key"},  # input artifacts reach the main container only
        "/out/proof.json": {"key": f"{ep}/output/proof.json"},
        "/out/trace.jsonl": {"key": f"{ep}/output/trace.jsonl"},
        "/out/network.jsonl": {"key": f"{ep}/output/network.jsonl"},  # the egress proxy's records, where it ran
        "/out/status.json": {"key": f"{ep}/output/status.json"},
        "/out/workspace.tar.gz": {"key": f"{ep}/output/workspace.tar.gz"},
        "/out/checks.json": {"key": f"{ep}/output/checks.json"},
    }
    t = _templates(argo_docs["mass-cycle"])
    assert t["collect-prepare"]["container"]["args"][-8:-6] == ["--phase", "prepare"]
    # the agent pod's rollout dir is the one prepare names (relative to the run)
    episode = {s["name"]: s for s in _steps(t["collect-episode"])}
    assert {p["name"]: p["value"] for p in episode["agent"]["arguments"]["parameters"]}[
        "rollout"
    ] == "{{steps.prepare.outputs.parameters.rollout}}"
    assert "--endpoint" in t["collect-prepare"]["container"]["args"]
    assert t["collect-ingest"]["container"]["args"][-6:] == [
        "--phase",
        "ingest",
        "--agent-status",
        "{{inputs.parameters.agent-status}}",
        "--outputs",
        "/tmp/outputs",
    ]
    assert agent["metadata"]["labels"][labels.STEP] == "episode"


def test_resource_templates_wait_on_the_documented_conditions(argo_docs):
    t = _templates(argo_docs["mass-cycle"])
    train, wait = t["train-job"]["resource"], t["train-wait"]["resource"]
    # the model: applied, then waited for by a pod that reads its predictor's pods (the only one with a
    # token), failing at the pending bound, the ready deadline or a failed load; its pod outlives both
    assert [[s["template"] for s in group] for group in t["serve-model"]["steps"]] == [
        ["serve-model-apply"],
        ["serve-model-wait"],
    ]
    apply, serve_wait = t["serve-model-apply"], t["serve-model-wait"]
    assert apply["resource"]["action"] == "apply" and "successCondition" not in apply["resource"]
    assert serve_wait["container"]["args"] == [
        "serve-wait",
        "mass-{{workflow.parameters.run}}-g{{inputs.parameters.gen}}",
        "--pending-timeout=900",
        "--ready-timeout=3600",
    ]
    assert (serve_wait["serviceAccountName"], serve_wait["automountServiceAccountToken"]) == ("mass-serve-wait", True)
    assert serve_wait["container"]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert int(serve_wait["activeDeadlineSeconds"]) == 3600 + 300
    assert [n for n, x in t.items() if x.get("automountServiceAccountToken")] == ["serve-model-wait"]
    # the job started (its Master running) within the pending bound, then trained within its deadline
    assert (
        train["successCondition"] == "status.conditions.1.type" and int(t["train-job"]["activeDeadlineSeconds"]) == 900
    )
    assert (wait["action"], wait["successCondition"]) == ("get", "status.replicaStatuses.Master.succeeded > 0")
    assert train["failureCondition"] == wait["failureCondition"]
    assert t["train"]["synchronization"]["semaphores"][0]["configMapKeyRef"] == {
        "name": "mass-semaphores",
        "key": "gpu-jobs",
    }
    assert t["delete-model"]["resource"]["action"] == "delete"
    isvc, job = _created(argo_docs, "InferenceService"), _created(argo_docs, "PyTorchJob")
    assert isvc["metadata"]["name"] == "mass-demo-g3"
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert master["name"] == "pytorch"
    assert master["command"] == [
        "torchrun",
        "--no-python",
        "mass",
        "train",
        "--spec",
        "s3://mass-jobs/specs/demo.yaml",
        "--gen",
        "3",
        "--resume",
    ]
    for obj in (isvc["spec"]["predictor"], job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]):
        assert set(labels.POD_LABEL_KEYS) <= set(obj["labels"])
        assert obj["labels"][labels.ARGO_WORKFLOW] == "mass-run-abcde"


def _created(argo_docs, kind):
    """The object a create/apply resource template of mass-cycle makes (not a delete's reference)."""
    found = [o for o in schemas.embedded_manifests(argo_docs["mass-cycle"]) if o["kind"] == kind and "spec" in o]
    if kind == "PyTorchJob":  # Master + Workers, and the Master alone for one replica
        assert [sorted(o["spec"]["pytorchReplicaSpecs"]) for o in found] == [["Master", "Worker"], ["Master"]]
        return found[0]
    assert len(found) == 1, kind
    return found[0]


def test_webhook_rules_catch_what_schemas_miss(argo_docs):
    job = _created(argo_docs, "PyTorchJob")
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    assert schemas.schema_errors(bad) == []
    assert len(schemas.webhook_errors(bad)) == 2
    isvc = _created(argo_docs, "InferenceService")
    isvc["metadata"]["name"] = "Mass_Demo"
    assert schemas.webhook_errors(isvc) == ["InferenceService/Mass_Demo: name must match ^[a-z]([-a-z0-9]*[a-z0-9])?$"]


def test_longest_run_id_gives_valid_names():
    from mass_jobs.k8s import serving, training

    run = "r" * 40  # RunSpec.name max_length
    assert len(serving.isvc_name(run, "50")) <= 63
    # The job is named from the run (a resubmitted run replaces its stopped workflow's job).
    assert max(len(training.job_name(run, "50", step)) for step in ("train",)) <= 63
    assert labels.truncate_name("a-" * 40) == ("a-" * 40)[:63].rstrip("-")


def test_checked_in_yaml_parses_to_the_generated_objects():
    for rel, text in ARGO_FILES.items():
        assert load_docs((REPO / rel).read_text()) == load_docs(text)
    assert Path(REPO / "argo").is_dir()


def test_agent_pods_have_a_pending_bound_and_the_steps_around_them_the_semaphore(argo_docs):
    """An agent pod that never schedules (a GPU per episode on a cluster without a free one) fails at
    the pending bound, and its rollout is recorded infra_error, instead of holding a slot until its
    day-long deadline: the agent-pods semaphore is held by the steps that call the pod, so Argo
    counts only the scheduler's wait as the pod's Pending time."""
    t = _templates(argo_docs["mass-cycle"])
    agent = t["agent-episode"]
    assert agent["pendingTimeout"] == "900" and "synchronization" not in agent
    callers = [
        n
        for n, tmpl in t.items()
        for group in tmpl.get("steps") or ()
        for st in group
        if st.get("template") == "agent-episode"
    ]
    assert sorted(callers) == ["collect-episode", "evaluate-rollout", "guard-rollout", "search-rollout"]
    for name in callers:
        assert t[name]["synchronization"]["semaphores"][0]["configMapKeyRef"] == {
            "name": "mass-semaphores",
            "key": "agent-pods",
        }, name
