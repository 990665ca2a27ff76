"""What a review of the generated templates against Argo v4.1.2, KServe v0.20.0 and the training
operator v1.9 found, one test per finding: properties of the generated YAML (argo/, the chart
rendered by Helm) and unit tests of the CLI entries the containers call.

    .venv/bin/python -m pytest -q tests/test_k8s_review.py
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.k8s import argo as A
from mass_jobs.k8s import codegen, schemas
from mass_jobs.k8s.settings import ClusterSettings
from tests.fixtures.k8s import REPO, load_docs, render_chart, with_network


@pytest.fixture(scope="module")
def cycle():
    return load_docs(codegen.argo_files()["argo/mass-cycle.yaml"])[0]


def _t(doc):
    return {t["name"]: t for t in doc["spec"]["templates"]}


def _steps(t):
    return [s for group in t.get("steps") or [] for s in group]


def _order(doc):
    return [s["name"] for s in _steps(_t(doc)["cycle"])]


def _env(container) -> dict:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _chart_objects(values: dict) -> list[dict]:
    """The chart rendered by Helm's own engine with these values: every object."""
    return [
        d
        for name, text in render_chart(with_network(values)).items()
        if name.endswith(".yaml")
        for d in load_docs(text)
    ]


def _step_and_trainer_containers(doc):
    """(name, container, volumeMounts) of every step pod and every PyTorchJob replica."""
    for t in doc["spec"]["templates"]:
        if "container" in t and t["name"] != "agent-episode":
            yield t["name"], t["container"]
    for job in schemas.embedded_manifests(doc):
        for rtype, rs in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).items():
            for c in rs["template"]["spec"]["containers"]:
                yield f"PyTorchJob/{rtype}", c


# ---------------------------------------------------------------- collect/<task>/summary.json


def test_the_summary_is_written_by_its_own_step_between_collection_and_guard(cycle):
    order = _order(cycle)
    assert order.index("collect") < order.index("collect-summary") < order.index("guard") < order.index("rank")
    summary = _t(cycle)["collect-summary"]["container"]["args"]
    assert summary[0] == "collect" and summary[-2:] == ["--phase", "finish"] and "--episode" not in summary
    # prepare and ingest of one episode never summarize
    for name in ("collect-prepare", "collect-ingest"):
        assert "finish" not in _t(cycle)[name]["container"]["args"]


# ---------------------------------------------------------------- archives


def test_agent_artifacts_are_never_archived_or_unpacked_by_argo(cycle):
    agent = _t(cycle)["agent-episode"]
    arts = agent["inputs"]["artifacts"] + agent["outputs"]["artifacts"]
    assert len(arts) == 9 and all(a["archive"] == {"none": {}} for a in arts)
    paths = {a["path"] for a in arts}
    assert {"/in/workspace.tar.gz", "/out/workspace.tar.gz"} <= paths  # files, not directories
    assert all(a["optional"] for a in agent["outputs"]["artifacts"])


def test_mass_episode_unpacks_and_packs_the_store_archive(scripted_endpoint, tmp_path, make_store):
    """A one-entry workspace (which Argo's own unpacking would rename onto the path) round-trips:
    the output archive has the store's layout, so ingest stores bytes `get_dir` restores."""
    from mass_jobs.store.archive import write_dir_archive
    from mass_jobs.tools.testing.scripted_endpoint import Reply

    ep = scripted_endpoint({"orchestrator": [Reply.call("list_files", path="."), Reply.text("done")]})
    seed = tmp_path / "seed"
    (seed / "src").mkdir(parents=True)
    (seed / "src" / "main.py").write_text("print(1)\n")
    src = tmp_path / "in"
    src.mkdir()
    with open(src / "workspace.tar.gz", "wb") as f:
        write_dir_archive(seed, f)
    (src / "episode.json").write_text(
        json.dumps(
            {
                "prompt": "Look.",
                "endpoint": {"base_url": ep.base_url, "model": "scripted"},
                "limits": {"turns_per_agent": 3, "request_retries": 0},
                "sampling": {"max_output_tokens": 32},
                "harness": "builtin",
                "seed": 1,
                "files": {},
            }
        )
    )
    out = tmp_path / "out"
    assert cli_main(["episode", "--in", str(src), "--out", str(out)]) == 0
    assert (out / "workspace" / "src" / "main.py").read_text() == "print(1)\n"
    store = make_store("file")
    store.put_bytes("w.tar.gz", (out / "workspace.tar.gz").read_bytes())
    store.get_dir("w.tar.gz", tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in (tmp_path / "back").rglob("*")) == [
        "src",
        "src/main.py",
    ]
    (src / "workspace.tar.gz").write_bytes(b"not a tar")
    assert cli_main(["episode", "--in", str(src), "--out", str(tmp_path / "out2")]) == 2


# ---------------------------------------------------------------- one writable work dir


def test_every_step_and_trainer_pod_works_in_a_mounted_writable_dir():
    for doc in (
        load_docs(codegen.argo_files()["argo/mass-cycle.yaml"])[0],
        load_docs(codegen.example_files()["examples/k8s/pytorchjob-base.yaml"])[0],
    ):
        seen = 0
        templates = doc["spec"].get("templates") or []
        volumes = {
            t["name"]: {m["mountPath"] for m in t["container"].get("volumeMounts", [])}
            for t in templates
            if "container" in t
        }
        containers = (
            list(_step_and_trainer_containers(doc))
            if templates
            else [
                (r, c)
                for r, rs in doc["spec"]["pytorchReplicaSpecs"].items()
                for c in rs["template"]["spec"]["containers"]
            ]
        )
        for name, c in containers:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = volumes.get(name) or {m["mountPath"] for m in c["volumeMounts"]}
            env = _env(c)
            assert env["MASS_WORK_DIR"].startswith("/tmp/") and "/tmp" in mounts, name
            assert c["workingDir"] == "/tmp" and env["HOME"] == "/tmp", name
            seen += 1
        assert seen >= 2


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--spec", "s"],
        ["merge", "--spec", "s"],
        ["render", "sft", "--spec", "s"],
        ["evaluate", "--spec", "s"],
        ["run", "s"],
    ],
)
def test_every_work_dir_default_is_mass_work_dir(argv, monkeypatch):
    import argparse

    from mass_jobs.commands.cli import COMMANDS

    monkeypatch.setenv("MASS_WORK_DIR", "/tmp/work-here")
    import importlib

    parser = argparse.ArgumentParser()
    mod = importlib.import_module(COMMANDS[argv[0]][0])
    mod.add_arguments(parser)
    args, _ = parser.parse_known_args(argv[1:] + (["--gen", "0"] if argv[0] != "run" else []))
    assert args.work_dir == "/tmp/work-here"


# ---------------------------------------------------------------- qwen-code in the sandbox image


def test_qwen_code_is_found_on_the_path_without_mass_qwen_bin(tmp_path, monkeypatch):
    from mass_jobs.episodes import qwen_code

    fake = tmp_path / "bin" / "qwen"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("MASS_QWEN_BIN", raising=False)
    monkeypatch.setattr(qwen_code, "DEFAULT_BIN", tmp_path / "missing" / "qwen")
    monkeypatch.setenv("PATH", str(fake.parent))
    assert qwen_code.qwen_binary() == fake
    monkeypatch.setenv("PATH", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="qwen-code binary not found"):
        qwen_code.qwen_binary()


def test_the_agent_pod_names_the_qwen_binary_the_sandbox_image_installs(cycle):
    docker = (REPO / "images" / "sandbox.Dockerfile").read_text()
    link = re.search(r"ln -s \S+/cli\.js (\S+)", docker).group(1)
    env_line = re.search(r"^ENV .*MASS_QWEN_BIN=(\S+)", docker, re.M).group(1)
    # qwen-code runs in the qwen sidecar, a uid apart from the sandbox that runs its shell commands
    sidecars = {c["name"]: c for c in _t(cycle)["agent-episode"]["sidecars"]}
    assert link == env_line == _env(sidecars["qwen"])["MASS_QWEN_BIN"]
    assert sidecars["qwen"]["securityContext"]["runAsUser"] not in (
        1000,
        sidecars["sandbox"]["securityContext"]["runAsUser"],
    )
    assert sidecars["qwen"]["args"][-2:] == ["--shell-socket", "/sandbox/sandbox.sock"]


# ---------------------------------------------------------------- a failed agent pod


def test_an_agent_that_fails_is_retried_then_recorded_never_failing_the_generation(cycle):
    t = _t(cycle)
    retry = t["agent-episode"]["retryStrategy"]
    assert retry["retryPolicy"] == "Always" and int(retry["limit"]) >= 1
    assert "exitCode) != 2" in retry["expression"] and 'lastRetry.status == "Error"' in retry["expression"]
    ep = {s["name"]: s for s in _steps(t["collect-episode"])}
    assert ep["agent"]["continueOn"] == {"error": True, "failed": True}
    gate = "{{steps.prepare.outputs.parameters.agent}} == true"
    assert ep["agent"]["when"] == gate and ep["ingest"]["when"] == gate
    assert {"name": "agent-status", "value": "{{steps.agent.status}}"} in ep["ingest"]["arguments"]["parameters"]
    assert [p["name"] for p in t["collect-prepare"]["outputs"]["parameters"]] == ["agent", "rollout"]
    # search and evaluate rollouts alike: a lost agent pod is ingested as infra_error, never a failure
    for step in ("search", "evaluate"):
        ro = {s["name"]: s for s in _steps(t[f"{step}-rollout"])}
        assert ro["agent"]["template"] == "agent-episode" and ro["agent"]["continueOn"] == {
            "error": True,
            "failed": True,
        }
        assert {"name": "agent-status", "value": "{{steps.agent.status}}"} in ro["ingest"]["arguments"]["parameters"]
    assert "continueOn" not in str(_t(cycle)["cycle"])  # nothing else may fail silently


def test_ingest_records_a_lost_agent_as_infra_error(make_store, inner_spec, judging_endpoint, tmp_path):
    from mass_jobs.episodes.rollouts import episode_runner
    from mass_jobs.run.context import RunContext
    from mass_jobs.serving.llm import ModelClient
    from mass_jobs.steps.collect import CollectError, run_collect
    from mass_jobs.steps.search import run_search
    from tests.fixtures.inner_loop import add_episodes, episode

    store = make_store("file")
    spec = inner_spec(
        store,
        search={"iterations": 0},
        collection={"episodes": 2, "train_ranks": 1, "validation_rank": 2, "require_beats_reference": False},
        ranking={"comparisons_per_episode": 1},
    )
    ep = judging_endpoint()
    ctx = RunContext(spec, store)
    add_episodes(ep, episode(1), episode(5))
    run_search(
        ctx,
        0,
        "t1",
        ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0),
        episode_runner(spec, ep.endpoint),
    )
    out = run_collect(ctx, 0, "t1", None, episode=0, phase="prepare", endpoint=ep.endpoint)
    assert out["agent"] is True
    store.put_json(ctx.episode_output(0, "t1", 0, "status.json"), {"stale": True})
    run_collect(ctx, 0, "t1", None, episode=0, phase="prepare", endpoint=ep.endpoint)
    assert not store.exists(ctx.episode_output(0, "t1", 0, "status.json"))  # a re-prepare drops stale output
    with pytest.raises(CollectError, match="output is missing"):  # its pod is not over: awaited
        run_collect(ctx, 0, "t1", None, episode=0, phase="ingest", agent_status="Running")
    # Succeeded without output: its upload was cut short (a sidecar can end it early), as lost as a Failed pod's
    status = run_collect(ctx, 0, "t1", None, episode=0, phase="ingest", agent_status="Succeeded")
    assert status["outcome"] == "infra_error" and "deadline" in status["reason"] and "cut short" in status["reason"]
    assert run_collect(ctx, 0, "t1", None, episode=0, phase="prepare", endpoint=ep.endpoint)["agent"] is False
    with pytest.raises(CollectError, match="episode 1 is not collected"):
        run_collect(ctx, 0, "t1", None, phase="finish")


# ---------------------------------------------------------------- S3 endpoint and region


def test_step_and_trainer_pods_get_the_artifact_repositorys_s3_endpoint_and_region():
    for values, scheme_host, region in (
        ({}, "https://s3.amazonaws.com", "us-east-1"),
        (
            {"s3": {"endpoint": "minio.storage:9000", "insecure": True, "region": "eu-west-3"}},
            "http://minio.storage:9000",
            "eu-west-3",
        ),
    ):
        objs = _chart_objects(values)
        repo = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "artifact-repositories")
        s3 = yaml.safe_load(repo["data"]["default-v1"])["s3"]
        assert ("https://" if not s3["insecure"] else "http://") + s3["endpoint"] == scheme_host
        cycle = next(o for o in objs if o["kind"] == "WorkflowTemplate" and o["metadata"]["name"] == "mass-cycle")
        n = 0
        for name, c in _step_and_trainer_containers(cycle):
            env = _env(c)
            assert (env["AWS_ENDPOINT_URL"], env["AWS_REGION"], env["AWS_DEFAULT_REGION"]) == (
                scheme_host,
                region,
                region,
            ), name
            n += 1
        assert n >= 13


def test_the_store_follows_aws_endpoint_url_and_region(s3_env, monkeypatch):
    """What the env above does: a spec with no endpoint reaches the cluster's S3 (here moto)."""
    from mass_jobs.store import open_store

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env["endpoint_url"])
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    store = open_store(f"s3://{s3_env['bucket']}/env-check")
    assert store.spec.endpoint_url == s3_env["endpoint_url"] and store.spec.region == "eu-west-3"
    store.put_json("x.json", {"ok": 1})
    assert store.get_json("x.json") == {"ok": 1}


# ---------------------------------------------------------------- validate against the chart


def test_validate_is_given_the_charts_bucket_and_max_model_len():
    objs = _chart_objects({"s3": {"bucket": "lab-bucket"}, "model": {"maxModelLen": 65536}})
    cycle = next(o for o in objs if o["kind"] == "WorkflowTemplate" and o["metadata"]["name"] == "mass-cycle")
    args = _t(cycle)["validate"]["container"]["args"]
    assert args[args.index("--artifact-bucket") + 1] == "lab-bucket" and "--max-model-len=65536" in args
    isvc = next(o for o in schemas.embedded_manifests(cycle) if o["kind"] == "InferenceService" and "spec" in o)
    assert "--max-model-len=65536" in isvc["spec"]["predictor"]["model"]["args"]


def _spec_file(tmp_path, **over) -> str:
    from tests.fixtures.inner_loop import spec_document

    doc = spec_document("s3://runs/prefix", model={"base": "org/base-model@v2", "sampling": over.pop("sampling", {})})
    doc.update(over)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_validate_refuses_a_store_outside_the_artifact_bucket_and_lengths_vllm_rejects(tmp_path, capsys):
    path = _spec_file(tmp_path, sampling={"context_length": 65536, "max_output_tokens": 32768})
    assert cli_main(["validate", path, "--artifact-bucket", "mass-jobs", "--max-model-len", "32768"]) == 2
    err = capsys.readouterr().err
    assert "$.store.uri: expected a store in the artifact repository's bucket 'mass-jobs'" in err
    assert "found bucket 'runs'" in err
    assert "$.model.sampling.context_length: expected at most the server's max model length 32768" in err
    assert "found 65536" in err
    assert "$.model.sampling.max_output_tokens: expected less than the server's max model length 32768" in err
    assert cli_main(["validate", path, "--artifact-bucket", "runs", "--max-model-len", "65537"]) == 0


def test_validate_on_the_cluster_refuses_a_judge_the_evaluate_pod_would_serve(tmp_path, capsys):
    """evaluate's pods are CPU pods that serve nothing: judges must be external endpoints there."""
    judges = [
        {"name": "remote", "endpoint": "https://judge.example/v1", "model": "m", "seeds": [1]},
        {"name": "here", "endpoint": "local", "model": "org/judge", "seeds": [1]},
    ]
    path = _spec_file(tmp_path, judges=judges)
    assert cli_main(["validate", path, "--artifact-bucket", "runs"]) == 2
    err = capsys.readouterr().err
    assert "$.judges[1].endpoint: expected an external endpoint" in err and "found 'local' (judge 'here')" in err
    assert "judges[0]" not in err
    assert cli_main(["validate", path]) == 0  # locally a `local` judge is served by `mass evaluate`


# ---------------------------------------------------------------- the PyTorchJob


def test_the_training_job_is_named_from_the_run_and_replaced_not_duplicated(cycle):
    """A retry, `argo retry` and a resubmitted run (its stopped workflow's job still training) all
    replace the one job: named from the run, deleted in foreground (its pods gone) before a create."""
    t = _t(cycle)
    # one of the two creates runs: Master + Workers, or the Master alone for one replica
    assert [s["template"] for s in _steps(t["train"])] == [
        "train-delete-job",
        "train-job",
        "train-job-single",
        "train-wait",
    ]
    assert t["train"]["retryStrategy"]["limit"] == "3"
    delete = t["train-delete-job"]["resource"]
    assert delete["action"] == "delete" and "--ignore-not-found" in delete["flags"]
    assert "--cascade=foreground" in delete["flags"]
    for template in ("train-job", "train-job-single"):
        assert "retryStrategy" not in t[template]  # the pair retries, never a bare create
        create = t[template]["resource"]
        assert create["action"] == "create" and create["setOwnerReference"] is True
        named = [
            yaml.safe_load(schemas.substitute_examples(r["manifest"]))["metadata"]["name"] for r in (delete, create)
        ]
        assert named[0] == named[1] == "mass-demo-g3-train"
        assert "name: mass-{{workflow.parameters.run}}-g{{inputs.parameters.gen}}-train" in create["manifest"]
        assert "workflow.name" not in create["manifest"].split("labels:")[0]
        assert "retries" not in create["manifest"]
        job = yaml.safe_load(schemas.substitute_examples(create["manifest"]))
        assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
        assert int(t[template]["activeDeadlineSeconds"]) > 0


# ---------------------------------------------------------------- the InferenceService


def test_the_inference_service_is_owned_locked_released_after_rank_and_deadlined(cycle):
    t = _t(cycle)
    serve = t["serve-model-apply"]
    assert serve["resource"]["setOwnerReference"] is True and int(t["serve-model-wait"]["activeDeadlineSeconds"]) > 0
    assert t["cycle"]["synchronization"] == {"mutexes": [{"name": "mass-run-{{workflow.parameters.run}}"}]}
    order = _order(cycle)
    assert order.index("serve-model") == order.index("search") - 1
    assert order.index("release-model") == order.index("rank") + 1 < order.index("train")
    steps = {s["name"]: s for s in _steps(t["cycle"])}
    assert steps["release-model"]["template"] == "delete-model"
    assert steps["serve-model"]["when"] == "{{steps.validate.outputs.parameters.needs-model}} == true"
    assert cycle["spec"]["onExit"] == "exit-handler"  # and deleted on exit, whatever happened


def test_evaluate_serves_one_model_at_a_time_and_releases_it_however_its_round_ends(cycle):
    """The rounds the plan names run one by one, in order (a steps template's parallelism counts its
    active children); each round's model is deleted by the exit hook of its work, before the round,
    and so the next one, ends."""
    t = _t(cycle)
    assert t["evaluate"]["parallelism"] == 1
    plan, rounds, finish = [s for group in t["evaluate"]["steps"] for s in group]
    assert (plan["template"], rounds["template"], finish["template"]) == (
        "evaluate-plan",
        "evaluate-round",
        "evaluate-finish",
    )
    assert rounds["withParam"] == "{{steps.plan.outputs.parameters.rounds}}"
    served = "{{inputs.parameters.served-gen}}"
    [serving] = [s for group in t["evaluate-round"]["steps"] for s in group]
    assert serving["hooks"] == {
        "exit": {"template": "delete-model", "arguments": {"parameters": [{"name": "gen", "value": served}]}}
    }
    work = [s for group in t[serving["template"]]["steps"] for s in group]
    assert [s["name"] for s in work] == ["serve", "rollouts", "self-verdicts"]
    assert {p["name"]: p["value"] for p in work[0]["arguments"]["parameters"]}["gen"] == served
    # each part runs where the plan gave the round that part (L_0's first round rolls, its second judges);
    # prepare and its fan-out are skipped together (the fan-out reads prepare's output)
    assert [s.get("when") for s in work] == [
        None,
        "{{inputs.parameters.rolls}} == true",
        "{{inputs.parameters.judges}} == true",
    ]
    assert [s["name"] for group in t[work[1]["template"]]["steps"] for s in group] == ["prepare", "rollouts"]
    assert {p["name"]: p["value"] for p in rounds["arguments"]["parameters"]}["rolls"] == "{{item.rolls}}"


# ---------------------------------------------------------------- model URIs, cron, fan-out


def test_model_uris_are_what_kserve_downloads():
    from mass_jobs.run.generation_model import model_uri
    from mass_jobs.spec.load import validate_document
    from tests.fixtures.inner_loop import spec_document

    def spec(base):
        return validate_document(spec_document("s3://b/p", model={"base": base}))

    assert model_uri(spec("org/name@rev-1"), 0, "b", "p/inner") == "hf://org/name:rev-1"
    assert model_uri(spec("org/name"), 0, "b", "p/inner") == "hf://org/name"
    assert model_uri(spec("s3://b/models/base"), 0, "b", "p/inner") == "s3://b/models/base/"
    assert model_uri(spec("org/name"), 2, "b", "p/inner") == "s3://b/p/inner/gen-2/model/"


def test_a_finished_run_starts_no_gpu_and_no_model_server(cycle):
    run = load_docs(codegen.argo_files()["argo/mass-run.yaml"])[0]
    main = {s["name"]: s for s in _steps(_t(run)["main"])}
    assert main["generations"]["when"] == "{{steps.validate.outputs.parameters.run-done}} == false"
    steps = {s["name"]: s for s in _steps(_t(cycle)["cycle"])}
    for name in ("train", "evaluate"):  # the GPU pods
        assert steps[name]["when"] == f"{{{{steps.validate.outputs.parameters.done-{name}}}}} == false"
    outputs = {p["name"] for p in _t(cycle)["validate"]["outputs"]["parameters"]}
    assert {"needs-model", "run-done", "done-train", "done-evaluate"} <= outputs


def test_the_collect_fanout_is_bounded(cycle):
    t = _t(cycle)
    assert t["collect"]["parallelism"] == ClusterSettings().agent_parallelism == 16
    assert _steps(t["collect"])[0]["withParam"] == "{{inputs.parameters.episodes}}"
    objs = _chart_objects({"agent": {"parallelism": 4}})
    chart_cycle = next(o for o in objs if o["kind"] == "WorkflowTemplate" and o["metadata"]["name"] == "mass-cycle")
    assert _t(chart_cycle)["collect"]["parallelism"] == 4


def test_the_training_world_is_the_specs(cycle, tmp_path, s3_env):
    """sft.replicas pods x max(1, gpus_per_replica) processes, gpus_per_replica GPUs each: what the
    operator's WORLD_SIZE becomes is what the spec asked, not a chart value."""
    from tests.fixtures.inner_loop import spec_document

    t = _t(cycle)
    train = next(s for s in _steps(t["cycle"]) if s["name"] == "train")
    given = {p["name"]: p["value"] for p in train["arguments"]["parameters"]}
    for k in ("workers", "nproc", "gpus"):
        assert given[f"trainer-{k}"] == f"{{{{steps.validate.outputs.parameters.trainer-{k}}}}}"
    manifest = t["train-job"]["resource"]["manifest"]
    assert "replicas: {{inputs.parameters.trainer-workers}}" in manifest  # unquoted: an integer
    assert "nprocPerNode: '{{inputs.parameters.trainer-nproc}}'" in manifest
    assert manifest.count("nvidia.com/gpu: '{{inputs.parameters.trainer-gpus}}'") == 4  # 2 replicas x limits, requests
    for replicas, gpus, want in ((1, 0, ("0", "1", "0")), (3, 2, ("2", "2", "2"))):
        doc = spec_document(
            f"s3://{s3_env['bucket']}/world-{replicas}",
            sft={"replicas": replicas, "gpus_per_replica": gpus},
            model={"base": "org/tiny"},
        )
        doc["store"]["endpoint_url"] = s3_env["endpoint_url"]
        path = tmp_path / f"w{replicas}.yaml"
        path.write_text(yaml.safe_dump(doc))
        out = tmp_path / f"out{replicas}"
        assert cli_main(["validate", str(path), "--outputs", str(out), "--quiet"]) == 0
        assert tuple((out / f"trainer-{k}").read_text() for k in ("workers", "nproc", "gpus")) == want


def test_builder_default_settings_match_the_chart_defaults():
    values = yaml.safe_load((REPO / "charts" / "mass-jobs" / "values.yaml").read_text())
    s = ClusterSettings()
    assert values["agent"]["parallelism"] == s.agent_parallelism
    assert str(values["model"]["readyDeadlineSeconds"]) == s.serve_deadline_s
    assert str(values["resources"]["trainer"]["activeDeadlineSeconds"]) == s.train_deadline_s
    assert A.WORK_DIR.startswith("/tmp/")


def test_the_model_has_one_served_name_for_both_executors(cycle, make_store, inner_spec, tmp_path, s3_env, capsys):
    """Traces record the model name: the local inner loop serves L_g under the InferenceService's
    name, which validate ties to the spec (a wrong `-p run=` exits 2)."""
    from mass_jobs.k8s import serving
    from mass_jobs.run.context import RunContext
    from tests.fixtures.inner_loop import spec_document

    ctx = RunContext(inner_spec(make_store("file")), None)
    assert ctx.served_model(2) == serving.isvc_name("inner", "2") == "mass-inner-g2"
    for name in ("search-prepare", "search-finish"):
        args = _t(cycle)[name]["container"]["args"]
        assert args[args.index("--served-model") + 1] == serving.isvc_name(
            "{{workflow.parameters.run}}", "{{inputs.parameters.gen}}"
        )
    # evaluate's rounds name the InferenceService of the generation each serves the same way
    served = "{{inputs.parameters.served-gen}}"
    for name in ("evaluate-prepare", "evaluate-self-verdicts"):
        args = _t(cycle)[name]["container"]["args"]
        isvc = serving.isvc_name("{{workflow.parameters.run}}", served)
        assert args[args.index("--served-gen") + 1] == served
        assert args[args.index("--endpoint") + 1] == serving.openai_base_url(isvc, "{{workflow.namespace}}")
        assert args[args.index("--served-model") + 1] == isvc
    assert "--endpoint" not in _t(cycle)["evaluate-finish"]["container"]["args"]  # the panel's judges are external
    vargs = _t(cycle)["validate"]["container"]["args"]
    assert vargs[vargs.index("--run") + 1] == "{{workflow.parameters.run}}"
    doc = spec_document(f"s3://{s3_env['bucket']}/names", model={"base": "org/tiny"})
    doc["store"]["endpoint_url"] = s3_env["endpoint_url"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli_main(["validate", str(path), "--outputs", str(tmp_path / "o"), "--run", "other"]) == 2
    assert "--run: expected the spec's name 'inner'" in capsys.readouterr().err
    assert cli_main(["validate", str(path), "--outputs", str(tmp_path / "o"), "--run", "inner", "--quiet"]) == 0
