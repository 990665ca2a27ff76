"""An agent step added by declaration alone (tests/probe_step.py: its rollouts, where its result goes,
what it makes of them) runs as the shipped agent steps do: in-process, under the argv handler (its
CLI entry in the cluster's phases around `mass episode` subprocesses with no store credential) and
on the executor (the cycle `mass render argo --pipeline` compiles from it), and stores the same."""

from __future__ import annotations

import json

import pytest
import yaml

from mass_jobs.commands.cli import main
from mass_jobs.episodes.agent_step import declared
from mass_jobs.k8s import argo, schemas
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.pipeline.runner import Runner
from mass_jobs.spec.load import validate_document
from mass_jobs.store import FileStore, read_manifest
from tests import probe_step
from tests.fixtures.argo_cluster import CI_SPEC, REPO, cluster, one_generation, run_store, timeless  # noqa: F401

PIPELINE = "tests.probe_step:PIPELINE"
TASKS = ("fib", "primes")


def cycle_of(tmp_path, *extra: str) -> dict:
    assert main(["render", "argo", "--out", str(tmp_path / "argo"), "--pipeline", PIPELINE, *extra]) == 0
    return yaml.safe_load((tmp_path / "argo" / "mass-cycle.yaml").read_text())


def test_the_declared_step_compiles_to_an_agent_fanout_whose_validate_reads_its_pipeline(tmp_path):
    doc = cycle_of(tmp_path)
    assert schemas.all_errors(doc) == []
    templates = {t["name"]: t for t in doc["spec"]["templates"]}
    assert {"probe", "probe-prepare", "probe-rollouts", "probe-rollout", "probe-ingest", "probe-finish"} <= set(
        templates
    )
    assert not {"search", "collect", "guard", "rank", "train", "evaluate", "report"} & set(templates)
    assert templates["probe-prepare"]["container"]["args"][:3] == ["rollouts", "--step", probe_step.REF]
    finish = templates["probe-finish"]["container"]["args"]
    assert finish[finish.index("--phase") + 1] == "finish"
    validate = templates["validate"]["container"]
    at = validate["args"].index("--pipeline")
    assert validate["args"][at + 1] == PIPELINE
    outputs = templates["validate"]["outputs"]["parameters"]
    assert [p["name"] for p in outputs if p["name"].startswith("done-")] == ["done-probe"]
    # the header names the command that made it
    assert f"--pipeline {PIPELINE}" in (tmp_path / "argo" / "mass-cycle.yaml").read_text().split("\n---")[0]


def test_references_that_name_no_pipeline_or_step_are_refused_by_name(tmp_path, capsys):
    assert main(["render", "argo", "--out", str(tmp_path), "--pipeline", "tests.probe_step:NOTHING"]) == 2
    assert "--pipeline: --pipeline tests.probe_step:NOTHING: expected a sequence of StepDefs" in capsys.readouterr().err
    assert main(["render", "argo", "--out", str(tmp_path), "--pipeline", "no_such_module:PIPELINE"]) == 2
    assert (
        "--pipeline: expected a module importable here (in the jobs image: on its PYTHONPATH), found none: "
        "No module named 'no_such_module'" in capsys.readouterr().err
    )
    assert main(["render", "argo", "--out", str(tmp_path), "--pipeline", PIPELINE, "--chart", str(tmp_path)]) == 2
    assert "--pipeline: expected no --chart with it" in capsys.readouterr().err
    assert main(["rollouts", "--step", PIPELINE, "--spec", str(CI_SPEC), "--gen", "0", "--task", "fib"]) == 2
    assert "--step: --step tests.probe_step:PIPELINE: expected an AgentStep, found tuple" in capsys.readouterr().err
    with pytest.raises(ValueError, match="expected module:NAME"):
        declared("probe")
    # a pipeline the cycle's validate step could not import is no pipeline for Argo
    with pytest.raises(ValueError, match="expected module:NAME"):
        argo.mass_cycle(ClusterSettings(), probe_step.PIPELINE)


def local_run(
    tmp_path,
    tiny_model_dir,
    name: str,
    handler: str,
    pipeline: str | None = PIPELINE,
    until: str | None = None,
    tasks=None,
    **overrides,
):
    """A Runner of tests/specs/ci-e2e.yaml for one generation on the tiny model, in its own store
    (`tasks`: only these; `overrides`: dotted path -> value)."""
    doc = yaml.safe_load(CI_SPEC.read_text())
    doc["model"]["base"] = str(tiny_model_dir)
    doc["judges"][0]["model"] = str(tiny_model_dir)
    doc["generations"] = 1
    doc["store"] = {"uri": f"file://{tmp_path / name}"}
    if tasks:
        doc["tasks"] = [t for t in doc["tasks"] if t["id"] in tasks]
    for path, value in overrides.items():
        section, key = path.split(".")
        doc[section][key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    store = FileStore(tmp_path / name)
    runner = Runner(
        str(path),
        validate_document(doc),
        store,
        work_dir=tmp_path / f"work-{name}",
        progress=False,
        pipeline=pipeline,
        handler=handler,
        until=until,
    )
    return runner, store


def stored(store, run: str = "ci-e2e") -> dict:
    """Per task its result; per rollout what the step's reading put in its manifest, and its stored
    files less their wall-clock fields."""
    out = {}
    for task in TASKS:
        out[task] = store.get_json(f"{run}/gen-0/probe/{task}/result/result.json")
        for i in range(probe_step.REPLICATES):
            prefix = f"{run}/gen-0/probe/{task}/rep-{i}"
            out[f"{task}/rep-{i}"] = read_manifest(store, prefix)["extra"]
            out[f"{task}/rep-{i}/files"] = {
                name: timeless(store, f"{prefix}/{name}")
                for name in ("prompt.txt", "status.json", "trace.jsonl", "workspace.tar.gz")
            }
    return out


@pytest.mark.slow(cost=30)
def test_the_declared_step_runs_in_process_and_under_argv_and_stores_the_same(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the argv handler's subprocesses import the step's module
    runs, stores = {}, {}
    for handler in ("in-process", "argv"):
        runner, store = local_run(tmp_path, tiny_model_dir, handler, handler)
        stores[handler] = store
        runner.run()
        runs[handler] = stored(store)
        timings = store.get_json(runner.ctx.run_state())["timings"]
        assert timings["0:probe"]["skipped"] is False
    assert runs["in-process"] == runs["argv"]
    for task in TASKS:
        result = runs["argv"][task]
        assert result["task"] == task and sorted(result["outcomes"]) == ["rep-0", "rep-1"]
        for i in range(probe_step.REPLICATES):
            extra = runs["argv"][f"{task}/rep-{i}"]
            assert extra["outcome"] == result["outcomes"][f"rep-{i}"] and extra["trace_lines"] > 0
    # under argv every rollout ran as an agent would: its input prepared, its outputs signed by its harness
    for task in TASKS:
        for i in range(probe_step.REPLICATES):
            prefix = f"ci-e2e/gen-0/probe/{task}/rep-{i}"
            assert stores["argv"].exists(f"{prefix}/input/episode.json") and stores["argv"].exists(
                f"{prefix}/output/proof.json"
            )
            assert not stores["in-process"].exists(f"{prefix}/input/episode.json")
    # a rerun finds it stored and runs nothing
    runner, store = local_run(tmp_path, tiny_model_dir, "in-process", "in-process")
    runner.run()
    assert store.get_json(runner.ctx.run_state())["timings"]["0:probe"]["skipped"] is True


@pytest.mark.argo_exec
@pytest.mark.slow(cost=40)
def test_the_declared_step_runs_on_the_executor_in_agent_pods_and_a_resubmission_runs_none(cluster):
    doc, spec_uri = one_generation(cluster, "probe")
    ex = cluster["make"](pipeline=PIPELINE)
    wf = ex.submit("mass-cycle", {"spec": spec_uri, "run": doc["name"], "gen": "0"})
    assert wf.phase == "Succeeded", wf.summary()
    agents = wf.find(template="agent-episode", type="Pod")
    assert sorted(n.inputs["rollout"] for n in agents) == sorted(
        f"gen-0/probe/{t}/rep-{i}" for t in TASKS for i in range(probe_step.REPLICATES)
    )
    got = stored(run_store(doc), doc["name"])
    for task in TASKS:
        assert sorted(got[task]["outcomes"]) == ["rep-0", "rep-1"]
        assert all(got[f"{task}/rep-{i}"]["trace_lines"] > 0 for i in range(probe_step.REPLICATES))
    assert [n.outputs.get("done-probe") for n in wf.find(template="validate", type="Pod")] == ["false"]
    assert wf.find(template="serve-model-apply")  # the agents called the generation's InferenceService
    # stored: validate says so, no model is served and no agent pod runs
    again = ex.submit("mass-cycle", {"spec": spec_uri, "run": doc["name"], "gen": "0"})
    assert again.phase == "Succeeded", again.summary()
    assert [n.outputs.get("done-probe") for n in again.find(template="validate", type="Pod")] == ["true"]
    assert not again.find(template="agent-episode", type="Pod")
    assert not again.find(template="serve-model-apply")
    assert json.loads(json.dumps(stored(run_store(doc), doc["name"]))) == got


@pytest.mark.slow(cost=60)
def test_the_argv_handler_runs_search_collect_and_guard_in_their_phases_and_stores_what_in_process_does(
    tmp_path, tiny_model_dir
):
    """The shipped agent steps' phases (nodes.phases) under argv: search's iterations, collect's
    episodes one prepare each, guard's checks jobs; the same store as in-process, less wall-clock."""
    keys = {}
    for handler in ("in-process", "argv"):
        runner, store = local_run(
            tmp_path,
            tiny_model_dir,
            handler,
            handler,
            pipeline=None,
            until="0:guard",
            tasks=("fib", "sort"),
            **{"collection.episodes": 2},
        )
        assert runner.run() == {"stopped_after": {"gen": 0, "step": "guard"}}
        keys[handler] = {
            k: timeless(store, k)
            for k in store.list("ci-e2e/gen-0/")
            if "/input/" not in k and "/output/" not in k and not k.endswith("_writer.json")
        }
    # guard's checks ran as jobs of their own under argv, their results stored for its finish
    jobs = {k for k in keys["argv"] if "/guard-checks/" in k}
    assert sorted(jobs) == [f"ci-e2e/gen-0/guard-checks/fib/ep-{i}/checks.json" for i in range(2)]
    assert set(keys["argv"]) - jobs == set(keys["in-process"])
    assert {k for k in keys["in-process"] if keys["argv"][k] != keys["in-process"][k]} == set()
    assert len([k for k in keys["argv"] if "/search/fib/" in k]) > 5 and "ci-e2e/gen-0/guard/fib.json" in keys["argv"]
