"""The pipeline table (mass_jobs/pipeline/table.py): one definition the local runner, `mass status` and the
Argo compiler derive from; done-checks are the cores' own input hashes; a changed spec is refused.

    .venv/bin/python -m pytest -q tests/test_pipeline.py
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from mass_jobs.commands.cli import COMMANDS
from mass_jobs.commands.cli import main as cli_main
from mass_jobs.pipeline import table as P
from mass_jobs.pipeline.runner import Runner, step_status
from mass_jobs.run.context import RunContext, spec_changes
from mass_jobs.spec.load import SpecError, load_spec, validate_document
from mass_jobs.store import Step
from tests.fixtures.inner_loop import add_episodes, episode, spec_document
from tests.fixtures.k8s import load_docs

SPEC = "{{workflow.parameters.spec}}"
GEN = "{{inputs.parameters.gen}}"


def _templates(doc):
    return {t["name"]: t for t in doc["spec"]["templates"]}


def _cycle_order(doc):
    return [s["name"] for group in _templates(doc)["cycle"]["steps"] for s in group]


def test_the_table_is_well_formed():
    names = [s.name for s in P.PIPELINE]
    assert names == ["search", "collect", "guard", "rank", "render", "train", "select", "merge", "evaluate", "report"]
    assert len(set(names)) == len(names)
    for s in P.PIPELINE:
        assert callable(s.core_function()), s.name
        assert s.entry[0] in COMMANDS, s.name
    # the table's data flow: every key a step reads is written by an earlier step, or is the model
    # (L0 is the base, L_g+1 the merge's); a step moved before its producer fails here
    written = {"model"}
    for s in P.PIPELINE:
        missing = set(s.reads) - written
        assert not missing, f"{s.name} reads {missing} before any step writes them"
        written |= set(s.writes)
    assert [s.name for s in P.PIPELINE if s.model] == ["search", "collect", "rank"]
    assert {s.pod for s in P.PIPELINE} == {"step", "agent", "trainer"}
    # every step that runs model-written code (episodes, guard checks) runs it in agent pods, never a step pod
    assert [s.name for s in P.PIPELINE if s.pod == "agent"] == ["search", "collect", "guard", "evaluate"]
    with pytest.raises(ValueError, match="not a RunContext key method"):
        P.StepDef("x", "generation", "m:f", ("x",), "m:g", reads=("sft_dir",))
    with pytest.raises(ValueError, match="scope must be one of"):
        P.StepDef("x", "epoch", "m:f", ("x",), "m:g")
    with pytest.raises(ValueError, match="local services must be among"):
        P.StepDef("x", "generation", "m:f", ("x",), "m:g", local=("gpu",))
    with pytest.raises(ValueError, match="resources must be one of"):
        P.StepDef("x", "generation", "m:f", ("x",), "m:g", resources="huge")
    with pytest.raises(ValueError, match="a 'trainer' pod runs at scope generation, not 'task'"):
        P.StepDef("x", "task", "m:f", ("x",), "m:g", pod="trainer")
    with pytest.raises(
        ValueError, match="a 'step' pod runs at scope generation or iteration or run or task, not 'episode'"
    ):
        P.StepDef("x", "episode", "m:f", ("x",), "m:g")
    assert [type(s.shape).__name__ for s in P.PIPELINE] == [
        "Recursion",
        "EpisodeFanout",
        "TaskRollouts",
        "TaskFanout",
        "Container",
        "Trainer",
        "Container",
        "Container",
        "GenerationRollouts",
        "Container",
    ]


def _name_dispatch(source: str, names: set[str]) -> list[int]:
    """Lines that choose by a step's name: `x.name == "merge"`, `name in ("search", ...)`,
    `{"search": ...}` tables, `by_name("train")`. (Other uses of the same words, such as the
    "train" split or the "merge" pod size, choose nothing by step.)"""
    import ast

    def is_step_name(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_step_name(e) for e in node.elts)
        return False

    def is_name_ref(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "name") or (
            isinstance(node, ast.Name) and node.id in ("name", "step", "step_name")
        )

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(is_name_ref(o) for o in operands) and any(is_step_name(o) for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and is_step_name(k) for k in node.keys):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "by_name":
            lines.append(node.lineno)
    return lines


def test_no_executor_dispatches_on_a_step_name():
    """The runner, `mass status`, `mass plan` and the Argo compiler read what a step declares; a
    choice by a step's name in any of them would be an edit that adding a step has to find."""
    import pathlib

    import mass_jobs

    names = {s.name for s in P.PIPELINE}
    assert _name_dispatch('if sd.name == "merge": pass\nd = {"search": 1}\nok = kind == "train"\n', names) == [1, 2]
    root = pathlib.Path(mass_jobs.__file__).parent
    consumers = [
        "pipeline/table.py",
        "pipeline/runner.py",
        "commands/status.py",
        "commands/plan.py",
        "commands/validate.py",
        "pipeline/planning/schedule.py",
        "pipeline/planning/counts.py",
        "k8s/argo.py",
        "k8s/codegen.py",
        "k8s/preflight.py",
    ]
    found = {rel: _name_dispatch((root / rel).read_text(), names) for rel in consumers}
    assert {rel: lines for rel, lines in found.items() if lines} == {}
    # nor re-derive what a step becomes from its scope and pod: that is its shape, derived once
    ladder = re.compile(r"\b(sd|s|step)\.(scope|pod)\b")
    found = {
        rel: [n + 1 for n, line in enumerate((root / rel).read_text().splitlines()) if ladder.search(line)]
        for rel in consumers
        if rel != "pipeline/table.py"
    }
    assert {rel: lines for rel, lines in found.items() if lines} == {}


def _extended(extra: P.StepDef, before: str, base: tuple = P.PIPELINE) -> tuple:
    i = [s.name for s in base].index(before)
    return (*base[:i], extra, *base[i:])


def audit_gen_step(ctx, g):
    return Step(ctx.store, f"{ctx.gen(g)}/audit-gen", {"episodes": ctx.spec.collection.episodes})


def count_step(ctx, g, task):
    return Step(ctx.store, f"{ctx.gen(g)}/count/{task}", {"task": task})


def count_tasks(ctx, g, task, client):
    """The core of a test step run in-process: stores what it was handed, behind its Step."""
    key = f"{ctx.gen(g)}/count/{task}/seen.json"
    ctx.store.put_json(key, {"task": task, "gen": g, "client": type(client).__name__})
    count_step(ctx, g, task).finish([key])


def test_a_step_added_to_the_table_appears_in_runner_status_plan_and_templates(
    monkeypatch, make_store, inner_spec, tmp_path
):
    """One StepDef, no other edit: the runner plans and runs it (its CLI entry, or its core
    in-process with the services it declares), `mass status` lists it, `mass plan` schedules it at
    its cost, the Argo compiler emits its template and cycle step, and `mass validate --outputs`
    reports its done flag."""
    from mass_jobs.commands.validate import done_outputs
    from mass_jobs.k8s import codegen
    from mass_jobs.pipeline.planning.schedule import DEFAULTS, simulate

    extra = P.StepDef(
        "audit-gen",
        "generation",
        "mass_jobs.episodes.audit:audit_episode",
        ("audit-gen",),
        "tests.test_pipeline:audit_gen_step",
        reads=("collect_episode",),
        writes=("gen",),
        cost=lambda w: P.Cost(7.0, 3),
    )
    counting = P.StepDef(
        "count",
        "task",
        "tests.test_pipeline:count_tasks",
        ("count",),
        "tests.test_pipeline:count_step",
        reads=("collect_episode",),
        writes=("gen",),
        model=True,
        local=("client",),
    )
    monkeypatch.setattr(P, "PIPELINE", _extended(extra, "evaluate", _extended(counting, "rank")))
    assert [s.name for s in P.PIPELINE][-4:] == ["merge", "audit-gen", "evaluate", "report"]
    store = make_store("file")
    spec = inner_spec(store, generations=2)
    ctx = RunContext(spec, store)

    runner = Runner("spec.yaml", spec, store, work_dir=tmp_path, progress=False)
    plan = [p.key for p in runner.plan()]
    assert all(p.step in P.PIPELINE for p in runner.plan())  # the plan holds the steps, not their names
    assert plan.index((0, "audit-gen")) == plan.index((0, "merge")) + 1 == plan.index((0, "evaluate")) - 1
    assert plan.index((0, "count")) == plan.index((0, "rank")) - 1
    assert (1, "audit-gen") in plan and plan[-1] == (2, "report")
    called = []
    monkeypatch.setattr(runner, "mass", lambda *argv, **kw: called.append(list(argv)))
    assert runner.execute_step(extra, 1) is False  # not stored: its CLI entry runs, as a container would
    assert called == [["audit-gen", "--spec", "spec.yaml", "--gen", "1"]]
    runner._now = {"label": "", "episodes": 0, "of": None}
    assert runner.execute_step(counting, 1) is False and called == [called[0]]  # in-process: no subprocess
    tasks = [t.id for t in spec.train_tasks()]
    assert [store.get_json(f"{ctx.gen(1)}/count/{t}/seen.json") for t in tasks] == [
        {"task": t, "gen": 1, "client": "LazyClient"} for t in tasks
    ]  # the lazy client: no server started
    assert runner.execute_step(counting, 1) is True

    rows = {(r["gen"], r["step"]): r["status"] for r in step_status(ctx)}
    assert rows[(0, "audit-gen")] == rows[(1, "audit-gen")] == "pending"
    assert (rows[(0, "count")], rows[(1, "count")]) == ("pending", "done")
    audit_gen_step(ctx, 0).finish([])
    rows = {(r["gen"], r["step"]): r["status"] for r in step_status(ctx)}
    assert (rows[(0, "audit-gen")], rows[(1, "audit-gen")]) == ("done", "pending")
    assert runner.execute_step(extra, 0) is True and len(called) == 1  # stored: skipped
    assert done_outputs(ctx, 0)["done-audit-gen"] == "true" and done_outputs(ctx, 1)["done-audit-gen"] == "false"

    zero = dict(DEFAULTS, episode_s=0.0, call_s=0.0, step_s=0.0, fixed_s=0.0)
    counts = [
        {
            "gen": g,
            "optimizer_proposals": 0,
            "teacher_episodes": 0,
            "ranking_calls": 0,
            "steps": 0,
            "rollout_episodes": 0,
            "judge_calls": 0,
            "self_judge_calls": 0,
        }
        for g in range(2)
    ]
    bars, makespan, serial = simulate(spec, counts, zero, parallelism=4)
    assert [(b.gen, b.end - b.start) for b in bars if b.step == "audit-gen"] == [(0, 21.0), (1, 21.0)]
    assert makespan == serial == 42.0  # the added step's cost model is all that costs anything

    cycle = load_docs(codegen.argo_files()["argo/mass-cycle.yaml"])[0]
    t = _templates(cycle)
    assert t["audit-gen"]["container"]["args"] == ["audit-gen", "--spec", SPEC, "--gen", GEN]
    order = _cycle_order(cycle)
    assert order.index("audit-gen") == order.index("merge") + 1 == order.index("evaluate") - 1
    assert "done-audit-gen" in {p["name"] for p in t["validate"]["outputs"]["parameters"]}


# a model step per task before render, named by reference as the cycle's validate step reads it
SCORED = _extended(
    P.StepDef(
        "score",
        "task",
        "mass_jobs.steps.rank:run_rank",
        ("score",),
        "mass_jobs.steps.rank:rank_step",
        reads=("rank",),
        writes=("rank",),
        model=True,
    ),
    "render",
)


def test_task_scoped_and_model_steps_compile_to_fanouts_and_endpoint_flags(monkeypatch):
    from mass_jobs.k8s import argo
    from mass_jobs.k8s.settings import ClusterSettings

    cycle = argo.mass_cycle(ClusterSettings(), "tests.test_pipeline:SCORED")
    t = _templates(cycle)
    assert t["score"]["container"]["args"][:7] == [
        "score",
        "--spec",
        SPEC,
        "--gen",
        GEN,
        "--task",
        "{{inputs.parameters.task}}",
    ]
    assert "--endpoint" in t["score"]["container"]["args"]
    order = _cycle_order(cycle)
    # the model server is released after its last user, now the added step
    assert order.index("release-model") == order.index("score") + 1 < order.index("render")
    step = next(s for g in t["cycle"]["steps"] for s in g if s["name"] == "score")
    assert step["withParam"] == "{{steps.validate.outputs.parameters.tasks}}"


# ---------------------------------------------------------------- a changed spec


def _write_spec(path, doc) -> str:
    (path.parent / doc["model"]["base"]).mkdir(exist_ok=True)  # model locations are checked: it must exist
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_a_changed_spec_on_an_existing_run_is_refused_naming_what_changed(make_store, tmp_path, capsys):
    store = make_store("file")
    doc = spec_document(store.spec.uri)
    ctx = RunContext(validate_document(doc), store)
    ctx.claim_spec()
    assert store.get_json(ctx.spec_key())["collection"]["episodes"] == 4
    ctx.claim_spec()  # the same spec again: fine

    changed = {
        **doc,
        "collection": {**doc["collection"], "episodes": 6},
        "ranking": {**doc["ranking"], "verdict_retries": 0},
    }
    with pytest.raises(SpecError) as err:
        RunContext(validate_document(changed), store).claim_spec()
    paths = [i.path for i in err.value.issues]
    assert paths == ["$.collection.episodes", "$.ranking.verdict_retries"]
    assert "stored run has 4, this spec has 6" in str(err.value)
    assert store.get_json(ctx.spec_key())["collection"]["episodes"] == 4  # nothing recorded

    # every step entry refuses it (exit 2 naming the field) before touching the store
    path = _write_spec(tmp_path / "changed.yaml", changed)
    assert cli_main(["guard", "--spec", path, "--gen", "0", "--task", "t1"]) == 2
    assert "$.collection.episodes: stored run has 4, this spec has 6" in capsys.readouterr().err
    # so does the local runner, before its run-state is written
    with pytest.raises(SpecError, match=r"\$.collection.episodes"):
        Runner(path, validate_document(changed), store, work_dir=tmp_path, progress=False).run()
    assert not store.exists(ctx.run_state())
    # mass status still reads the run (its stored steps) and names the difference, refusing it as run does
    assert cli_main(["status", path, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["spec_changes"][0].startswith("$.collection.episodes: stored run has 4")

    # more generations extend the run: not a change of any stored step
    longer = {**doc, "generations": 3}
    RunContext(validate_document(longer), store).claim_spec()
    assert store.get_json(ctx.spec_key())["generations"] == 3


def test_spec_changes_lists_leaves():
    assert spec_changes({"a": {"b": [1, 2]}, "c": 1}, {"a": {"b": [1, 3]}, "c": 1}) == [("$.a.b[1]", 2, 3)]
    assert spec_changes({"a": [1]}, {"a": [1, 2]}) == [("$.a", [1], [1, 2])]
    assert spec_changes({"generations": 1}, {"generations": 2}) == []


# ---------------------------------------------------------------- status from the store alone


def test_status_is_read_from_the_store_whatever_executed_the_steps(
    make_store, inner_spec, judging_endpoint, tmp_path, capsys
):
    """The Argo containers' CLI calls, by hand, with no runner and no run-state: `mass status` shows
    the same done rows the local runner's store would; the done-checks follow input hashes."""
    store = make_store("file")
    doc = spec_document(store.spec.uri, search={"iterations": 0})
    path = _write_spec(tmp_path / "spec.yaml", doc)
    spec = load_spec(path)  # as the CLI entries read it (model location resolved against its folder)
    ctx = RunContext(spec, store)
    ctx.claim_spec()
    ep = judging_endpoint()
    add_episodes(ep, episode(5), episode(5))  # a tie with the bare reference: the task is skipped
    model = ["--endpoint", ep.endpoint.base_url, "--served-model", ep.endpoint.model]
    base = ["--spec", path, "--gen", "0", "--task", "t1"]

    def rows():
        return {r["step"]: r["status"] for r in step_status(ctx) if r["gen"] == 0}

    assert set(rows().values()) == {"pending"}
    assert cli_main(["search", *base, "--iteration", "0", *model]) == 0
    assert rows()["search"] == "done" and rows()["collect"] == "pending"
    out = tmp_path / "outputs"
    for i in range(spec.collection.episodes):  # prepare: a skipped task needs no agent pod
        assert (
            cli_main(["collect", *base, "--episode", str(i), "--phase", "prepare", *model, "--outputs", str(out)]) == 0
        )
        assert (out / "agent").read_text() == "false"
    assert not store.list(ctx.collect(0, "t1") + "/")  # no input, no summary before the summary step
    assert rows()["collect"] == "pending"
    assert cli_main(["collect", *base, "--phase", "finish"]) == 0
    assert cli_main(["guard", *base]) == 0
    assert cli_main(["rank", *base, *model]) == 0
    capsys.readouterr()
    got = rows()
    assert [got[s] for s in ("search", "collect", "guard", "rank", "render")] == ["done"] * 4 + ["pending"]
    assert not store.exists(ctx.run_state())
    assert cli_main(["status", path, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    # no runner timed these steps: their time is unknown, not zero
    assert [r for r in shown["steps"] if r["gen"] == 0][:4] == [
        {"gen": 0, "step": "search", "status": "done", "detail": "1/1 tasks", "seconds": None},
        {"gen": 0, "step": "collect", "status": "done", "detail": "1/1 tasks", "seconds": None},
        {"gen": 0, "step": "guard", "status": "done", "detail": "1/1 tasks", "seconds": None},
        {"gen": 0, "step": "rank", "status": "done", "detail": "1/1 tasks", "seconds": None},
    ]
    # a done-check is the input hash, not "a manifest exists": a new guard input makes guard pending
    summary_key = ctx.collect_summary(0, "t1")
    store.put_json(summary_key, {**store.get_json(summary_key), "note": "rewritten"})
    # (and collect is pending too: its stored output no longer matches its manifest, so it is redone)
    assert rows()["guard"] == "pending" and rows()["collect"] == "pending"


def test_model_locations_resolve_through_the_specs_s3_endpoint(tiny_model_dir, s3_env, tmp_path, monkeypatch):
    """A base model (and a judge) at s3:// on a non-AWS endpoint: evaluate's servers find them with
    the spec's store endpoint, not only when AWS_ENDPOINT_URL happens to be set."""
    import os

    from mass_jobs.run.generation_model import local_model_dir
    from mass_jobs.serving import model_dirs as modelio
    from mass_jobs.serving.model_dirs import store_model_dir

    monkeypatch.setattr(modelio, "DEFAULT_CACHE", tmp_path / "model-cache")  # the base's download cache
    from mass_jobs.store import open_store

    assert "AWS_ENDPOINT_URL" not in os.environ
    models = open_store(f"s3://{s3_env['bucket']}", endpoint_url=s3_env["endpoint_url"])
    store_model_dir(models, "models/tiny", tiny_model_dir)
    doc = spec_document(f"s3://{s3_env['bucket']}/runs", model={"base": f"s3://{s3_env['bucket']}/models/tiny"})
    doc["store"]["endpoint_url"] = s3_env["endpoint_url"]
    spec = validate_document(doc)
    ctx = RunContext(spec, open_store(spec.store))
    local = local_model_dir(ctx, 0, tmp_path / "cache")
    assert (local / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    assert local.is_relative_to(tmp_path / "model-cache")


def test_a_bug_in_a_done_check_propagates_instead_of_reading_pending(make_store, inner_spec):
    """An input not stored is a Waiting value (pending, with its reason); any other error is a bug
    of the check, which would otherwise rerun the step (GPU steps on Argo) on every cycle."""
    from mass_jobs.steps import rank
    from mass_jobs.store import Waiting

    store = make_store("file")
    ctx = RunContext(inner_spec(store), store)
    step = P.by_name("rank")
    assert step.done(ctx, 0, "t1") is False  # nothing stored: pending
    [waiting] = step.stored(ctx, 0, "t1")
    assert isinstance(waiting, Waiting) and "no guard report at" in waiting.reason

    def broken(*a, **kw):
        raise KeyError("a typo in the done-check")

    assert step.steps is rank.rank_step  # the table holds the function itself, not its name
    with pytest.raises(KeyError, match="a typo in the done-check"):
        dataclasses.replace(step, steps=broken).done(ctx, 0, "t1")


def test_on_an_empty_store_every_step_after_the_first_waits_for_the_input_it_names(make_store, inner_spec):
    """One generic done-check: a step whose input is not stored says which one, as a value."""
    from mass_jobs.store import Waiting

    store = make_store("file")
    ctx = RunContext(inner_spec(store), store)
    waits = {}
    for s in P.PIPELINE:
        stored = s.stored(ctx, 0, "t1" if s.per_task else None)
        assert stored and not s.done(ctx, 0, "t1" if s.per_task else None), s.name
        waits[s.name] = next((w.reason for w in stored if isinstance(w, Waiting)), None)
    assert waits["search"] is None  # nothing before it: its iterations' Steps form, not stored
    assert "search of generation 0 is not finished" in waits["collect"]
    assert "no collection summary" in waits["guard"] and "no guard report" in waits["rank"]
    assert "no SFT windows" in waits["train"] and "training has no manifest" in waits["select"]
    assert "no selected checkpoint" in waits["merge"] and "no merged model" in waits["evaluate"]
    assert waits["report"] is None  # its inputs are whatever is stored, even nothing


def test_the_compiled_plan_has_every_node_with_its_argv_pod_size_and_credentials(make_store, inner_spec):
    """Step x generation x training task, in the runner's order: each node's container command, the
    pod size it gets and what it may hold; test tasks never reach a node."""
    from mass_jobs.pipeline import nodes as N
    from mass_jobs.pipeline.handlers import without_secrets

    spec = inner_spec(
        make_store("file"),
        generations=2,
        tasks=[
            {"id": i, "split": split, "prompt": f"Write report.md about {i}.", "deliverables": ["report.md"]}
            for i, split in (("t1", "train"), ("t2", "train"), ("held", "test"))
        ],
    )
    tasks = [t.id for t in spec.train_tasks()]
    assert len(tasks) >= 2 and len(tasks) < len(spec.resolved_tasks())  # a test task exists and is left out
    plan = N.compile_plan("s3://b/spec.yaml", spec)
    per_gen = sum(len(tasks) if s.per_task else 1 for s in P.generation_steps())
    assert len(plan.nodes) == 2 * per_gen + len(P.run_steps())
    assert [g.key for g in plan.groups()][:3] == [(0, "search"), (0, "collect"), (0, "guard")]
    assert [g.key for g in plan.groups()][-1] == (2, "report")
    by_key = {n.key: n for n in plan.nodes}
    collect = by_key[(1, "collect", tasks[1])]
    assert collect.argv == ("collect", "--spec", "s3://b/spec.yaml", "--gen", "1", "--task", tasks[1])
    assert (collect.credentials, collect.agent_credentials, collect.resources) == ("store", "none", "step")
    assert by_key[(0, "evaluate", None)].argv[-2:] == ("--gen", "1")  # cycle 0 judges L1
    assert by_key[(0, "merge", None)].resources == "merge"
    train = by_key[(1, "train", None)]
    assert (train.resources, train.credentials, train.agent_credentials) == ("trainer", "store", None)
    assert train.argv[-1] == "--resume" and train.reads == ("sft", "model")
    # the phases' command lines, as the argv handler runs them and the Argo templates spell them
    assert N.prepare(collect.argv, N.model_flags("http://m/v1", "mass-g1"), "/o") == [
        *collect.argv,
        "--phase",
        "prepare",
        "--endpoint",
        "http://m/v1",
        "--served-model",
        "mass-g1",
        "--outputs",
        "/o",
    ]
    assert N.ingest(["guard"], "Failed", "/o", rollout="gen-0/x") == [
        "guard",
        "--phase",
        "ingest",
        "--rollout",
        "gen-0/x",
        "--agent-status",
        "Failed",
        "--outputs",
        "/o",
    ]
    # an agent episode's environment: no store credential, API key or token
    env = without_secrets(
        {
            "PATH": "/bin",
            "AWS_ACCESS_KEY_ID": "a",
            "AWS_ENDPOINT_URL": "u",
            "OPENAI_API_KEY": "k",
            "HF_TOKEN": "t",
            "MASS_WORK_DIR": "/w",
            "DB_PASSWORD": "p",
        }
    )
    assert env == {"PATH": "/bin", "MASS_WORK_DIR": "/w"}
