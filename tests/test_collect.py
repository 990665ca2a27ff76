"""Teacher collection through the real harness: elite + directive, concurrency, resume, skips, Argo phases."""

import hashlib

import pytest

from mass_jobs.episodes import proof
from mass_jobs.episodes.harness import load_episode_file, run_episode
from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.spec.workflow import DIRECTIVE_HEADER, TEACHER_DIRECTIVE
from mass_jobs.steps.collect import CollectError, Collection, run_collect
from mass_jobs.steps.search import run_search
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode, proposal


def searched(spec, store, ep, ref_score: int, elite_score: int) -> RunContext:
    """A finished K=0 search: the reference and the initial workflow, judged once."""
    ctx = RunContext(spec, store)
    add_episodes(ep, episode(ref_score), episode(elite_score))
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    run_search(ctx, 0, "t1", client, episode_runner(spec, ep.endpoint))
    return ctx


def test_collects_elite_with_directive_and_reruns_only_missing(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0}, execution={"concurrency": 2})
    ep = judging_endpoint()
    ctx = searched(spec, store, ep, 1, 5)
    # concurrent episodes share the scripted queues, so each is a single orchestrator reply
    ep.add("orchestrator", *[Reply.call("finish", summary="nothing to delegate") for _ in range(4)])
    execute = episode_runner(spec, ep.endpoint)
    summary = run_collect(ctx, 0, "t1", execute)
    assert summary["skipped"] is False and summary["beats_reference"] is True
    assert [e["id"] for e in summary["episodes"]] == ["ep-0", "ep-1", "ep-2", "ep-3"]
    # an orchestrator that only finishes did no work: never ranked (collection.keep_no_work: false)
    assert {e["outcome"] for e in summary["episodes"]} == {"no_work"} and summary["eligible"] == []
    prompts = [r["body"]["messages"][1]["content"] for r in ep.requests[-4:]]
    assert len(prompts) == 4
    assert all(p.endswith(f"{DIRECTIVE_HEADER}\n{TEACHER_DIRECTIVE}") and "## Workflow" in p for p in prompts)
    doc = store.get_json("inner/gen-0/collect/t1/ep-2/episode.json")
    assert doc["prompt_parts"]["task"] == spec.task("t1").prompt and doc["index"] == 2
    for name in ("workspace.tar.gz", "trace.jsonl", "status.json", "protected.json", "_manifest.json"):
        assert store.exists(f"inner/gen-0/collect/t1/ep-3/{name}")
    seeds = {store.get_json(f"inner/gen-0/collect/t1/ep-{i}/episode.json")["seed"] for i in range(4)}
    assert len(seeds) == 4  # independent episodes
    # a rerun redoes only the missing episode
    store.delete("inner/gen-0/collect/t1/ep-1/_manifest.json")
    n = len(ep.requests)
    add_episodes(ep, episode(6))
    summary2 = run_collect(ctx, 0, "t1", execute)
    assert len(ep.requests) - n == 4  # one episode: orchestrator x2, worker x2
    assert "score: 6" in _report(store, "ep-1")
    assert summary2["eligible"] == ["ep-1"]  # redone with a worker that wrote report.md


def _report(store, ep_id):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        store.get_dir(f"inner/gen-0/collect/t1/{ep_id}/workspace.tar.gz", d)
        return (Path(d) / "report.md").read_text()


def test_failed_episodes_are_ineligible_and_one_episode_runs_alone(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0})
    ep = judging_endpoint()
    ctx = searched(spec, store, ep, 1, 5)
    add_episodes(ep, episode(4), episode(4, finish_status="failure"), episode(4), episode(4))
    execute = episode_runner(spec, ep.endpoint)
    assert run_collect(ctx, 0, "t1", execute, episode=0)["outcome"] == "success"
    with pytest.raises(CollectError, match="episode 1 is not collected yet"):
        Collection(ctx, 0, "t1").summarize()
    for i in (1, 2, 3):
        assert run_collect(ctx, 0, "t1", execute, episode=i)["outcome"] in ("success", "failed")
    summary = run_collect(ctx, 0, "t1", execute)
    assert [e["outcome"] for e in summary["episodes"]] == ["success", "failed", "success", "success"]
    assert summary["eligible"] == ["ep-0", "ep-2", "ep-3"]
    with pytest.raises(CollectError, match=r"--episode must be in 0..3"):
        run_collect(ctx, 0, "t1", execute, episode=4)


def test_task_that_never_beat_the_reference_is_skipped_and_recorded(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0})
    ep = judging_endpoint()
    ctx = searched(spec, store, ep, 5, 5)  # a tie with the bare reference does not beat it
    n = len(ep.requests)
    summary = run_collect(ctx, 0, "t1", episode_runner(spec, ep.endpoint))
    assert summary["skipped"] is True and "never produced a version that beat" in summary["reason"]
    assert summary["episodes"] == [] and len(ep.requests) == n
    assert store.get_json("inner/gen-0/collect/t1/summary.json") == summary


def test_spec_can_collect_for_a_task_that_never_beat_the_reference(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(
        store,
        search={"iterations": 0},
        collection={"episodes": 3, "train_ranks": 1, "validation_rank": 2, "require_beats_reference": False},
    )
    ep = judging_endpoint()
    ctx = searched(spec, store, ep, 5, 5)
    assert Collection(ctx, 0, "t1").skip_reason is None
    assert Collection(ctx, 0, "t1", require_beats_reference=True).skip_reason is not None


class GarbleReferenceJudgment:
    """Passes calls to the client; from the n-th evaluator call on, the evaluator's replies are
    unreadable (the one noisy judgment of the final elite against the reference)."""

    def __init__(self, client, ep, n: int):
        self.client, self.ep, self.n, self.calls = client, ep, n, 0

    def chat(self, messages, **kw):
        if (kw.get("headers") or {}).get("X-Mass-Role") == "evaluator":
            self.calls += 1
            if self.calls == self.n:
                self.ep.garbage_left = 10**6
        return self.client.chat(messages, **kw)


def test_collects_when_any_version_beat_the_reference_with_that_version(make_store, inner_spec, judging_endpoint):
    """v0 beats the reference, v1 beats v0 but its one reference judgment is unreadable (invalid):
    by default the task is collected with v0's workflow (the latest version that beat the
    reference); `collect_when: elite` skips it."""
    from mass_jobs.config.task_spec import Workflow
    from mass_jobs.spec.workflow import teacher_prompt_parts

    store = make_store("file")
    spec = inner_spec(
        store,
        search={"iterations": 1},
        collection={"episodes": 2, "train_ranks": 1, "validation_rank": 2},
        ranking={"verdict_retries": 0, "comparisons_per_episode": 1},
    )
    ep = judging_endpoint()
    add_episodes(ep, episode(1), episode(5))
    ep.add("optimizer", Reply.text(proposal("v1")))
    add_episodes(ep, episode(7))
    ctx = RunContext(spec, store)
    client = GarbleReferenceJudgment(ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0), ep, n=3)
    run_search(ctx, 0, "t1", client, episode_runner(spec, ep.endpoint))
    state = Collection(ctx, 0, "t1").state
    assert state.elite == 1 and state.beats_reference is False and state.beat_reference == [0]
    assert state.iterations[1].reference_verdict.valid is False
    ep.garbage_left = 0

    c = Collection(ctx, 0, "t1")
    v0 = Workflow.model_validate(state.iterations[0].workflow)
    assert c.skip_reason is None and c.version == 0
    assert c.parts == teacher_prompt_parts(spec.task("t1").prompt, v0, None) and "Lead (v1)" not in c.parts.text
    strict = inner_spec(
        store,
        search={"iterations": 1},
        ranking={"verdict_retries": 0, "comparisons_per_episode": 1},
        collection={"episodes": 2, "train_ranks": 1, "validation_rank": 2, "collect_when": "elite"},
    )
    assert "collect_when: elite" in Collection(RunContext(strict, store), 0, "t1").skip_reason

    ep.add("orchestrator", *[Reply.call("finish", summary="nothing to delegate") for _ in range(2)])
    before = len(ep.requests)
    summary = run_collect(ctx, 0, "t1", episode_runner(spec, ep.endpoint))
    assert summary["skipped"] is False and summary["elite_iteration"] == 0 and summary["beat_reference"] == [0]
    # the two episodes' one call each, both with v0's teacher prompt (what came instead is shown)
    asked = [
        (r["headers"].get("x-mass-role"), [m.get("content") for m in r["body"].get("messages", [])][1:2])
        for r in ep.requests[before:]
    ]
    assert [m for _, m in asked] == [[c.parts.text]] * 2, [(role, str(m)[:300]) for role, m in asked]
    assert store.get_json("inner/gen-0/collect/t1/ep-1/episode.json")["elite_iteration"] == 0


def test_collect_needs_a_finished_search_and_a_train_task(make_store, inner_spec):
    store = make_store("file")
    spec = inner_spec(
        store, tasks=[{"id": "t1", "split": "train", "prompt": "p"}, {"id": "t9", "split": "test", "prompt": "q"}]
    )
    ctx = RunContext(spec, store)
    with pytest.raises(CollectError, match="search of generation 0 is not finished"):
        run_collect(ctx, 0, "t1", None)
    with pytest.raises(CollectError, match="t9 is a test task"):
        run_collect(ctx, 0, "t9", None)


def test_argo_prepare_pod_ingest(make_store, inner_spec, judging_endpoint, tmp_path):
    store = make_store("file")
    spec = inner_spec(
        store,
        search={"iterations": 0},
        collection={"episodes": 2, "train_ranks": 1, "validation_rank": 2},
        ranking={"comparisons_per_episode": 1},
        tasks=[
            {
                "id": "t1",
                "split": "train",
                "prompt": "Write report.md.",
                "files": {"sim/env.py": "G = 9.8\n"},
                "guards": {"protected_paths": ["sim/env.py"]},
            }
        ],
    )
    ep = judging_endpoint()
    ctx = searched(spec, store, ep, 1, 5)
    p = "inner/gen-0/collect/t1/ep-1"
    with pytest.raises(CollectError, match="needs the model endpoint"):
        run_collect(ctx, 0, "t1", None, episode=1, phase="prepare")
    out = run_collect(ctx, 0, "t1", None, episode=1, phase="prepare", endpoint=ep.endpoint)
    assert sorted(out["prepared"]) == [
        f"{p}/input/episode.json",
        f"{p}/input/episode.key",
        f"{p}/input/workspace.tar.gz",
        f"{p}/protected.json",
    ]
    with pytest.raises(CollectError, match="cannot ingest"):
        run_collect(ctx, 0, "t1", None, episode=1, phase="ingest")
    # what the agent pod does: `mass episode --in IN --out OUT` on the input artifact
    (tmp_path / "in").mkdir()
    store.get_file(f"{p}/input/episode.json", tmp_path / "in" / "episode.json")
    store.get_dir(f"{p}/input/workspace.tar.gz", tmp_path / "in" / "workspace")
    assert (tmp_path / "in" / "workspace" / "sim" / "env.py").read_text() == "G = 9.8\n"
    inp = load_episode_file(tmp_path / "in" / "episode.json")
    assert inp.prompt.endswith(TEACHER_DIRECTIVE) and inp.endpoint == ep.endpoint
    add_episodes(ep, episode(7))
    res = run_episode(inp, tmp_path / "out" / "workspace", tmp_path / "out")
    assert res.outcome == "success"
    store.put_dir(f"{p}/output/workspace.tar.gz", tmp_path / "out" / "workspace")
    store.put_file(f"{p}/output/trace.jsonl", tmp_path / "out" / "trace.jsonl")
    store.put_file(f"{p}/output/status.json", tmp_path / "out" / "status.json")
    # signed as `mass episode` signs, with the key prepare issued (over what was uploaded)
    store.get_file(f"{p}/output/workspace.tar.gz", tmp_path / "out" / "workspace.tar.gz")
    proof.sign_outputs(store.get_bytes(f"{p}/input/{proof.KEY}"), tmp_path / "out", proof.EPISODE_OUTPUTS)
    store.put_file(f"{p}/output/{proof.PROOF}", tmp_path / "out" / proof.PROOF)
    assert run_collect(ctx, 0, "t1", None, episode=1, phase="ingest")["outcome"] == "success"
    assert store.get_json(f"{p}/protected.json") == {
        "sim/env.py": {"sim/env.py": hashlib.sha256(b"G = 9.8\n").hexdigest()}
    }
    # the locally run episode 0 and the ingested episode 1 complete the task
    add_episodes(ep, episode(3))
    summary = run_collect(ctx, 0, "t1", episode_runner(spec, ep.endpoint))
    assert summary["eligible"] == ["ep-0", "ep-1"]
