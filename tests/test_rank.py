"""Ranking: connected balanced schedules, self-verdicts, Bradley–Terry, train/val manifests."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.judging.bradley_terry import fit
from mass_jobs.judging.pairing import is_connected, pairs, schedule
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.steps.collect import run_collect
from mass_jobs.steps.guard import GuardReport, run_guard
from mass_jobs.steps.rank import RankError, Ranking, run_rank, select, step_schema, write_step_schemas
from mass_jobs.steps.search import Search, run_search
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def collected(spec, store, ep, scores, failing=(), scripts=None):
    """Search (K=0) -> collect one scripted episode per score (or the given `scripts`) -> guard;
    returns (ctx, client)."""
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    execute = episode_runner(spec, ep.endpoint)
    add_episodes(ep, episode(1), episode(5))
    run_search(ctx, 0, "t1", client, execute)
    add_episodes(
        ep,
        *(
            scripts
            or [episode(s, finish_status="failure" if i in failing else "success") for i, s in enumerate(scores)]
        ),
    )
    run_collect(ctx, 0, "t1", execute)
    run_guard(ctx, 0, "t1")
    return ctx, client


def test_rank_writes_train_val_manifest(store, inner_spec, judging_endpoint):
    spec = inner_spec(store, collection={"episodes": 5}, search={"iterations": 0}, ranking={"pairing": "round_robin"})
    ep = judging_endpoint()
    ctx, client = collected(spec, store, ep, [3, 8, 5, 1, 6])
    before = len(ep.requests)
    r = run_rank(ctx, 0, "t1", client)
    assert r.order == ["ep-1", "ep-4", "ep-2", "ep-0", "ep-3"]
    assert r.train == ["ep-1", "ep-4"] and r.val == "ep-2" and r.val not in r.train
    assert len(r.schedule) == len(r.verdicts) == 10 == len(ep.requests) - before  # every pair of 5
    assert r.invalid_verdicts == 0 and all(math.isfinite(s) for s in r.scores.values())
    assert is_connected(5, [(int(c["first"][3:]), int(c["second"][3:])) for c in r.schedule])
    doc = store.get_json("inner/gen-0/rank/t1.json")
    assert Ranking.model_validate(doc) == r and doc["train"] == ["ep-1", "ep-4"] and doc["val"] == "ep-2"
    import jsonschema

    jsonschema.validate(doc, step_schema("ranking"))
    assert run_rank(ctx, 0, "t1", client) == r and len(ep.requests) - before == 10  # done: nothing asked
    # a ranking killed after its verdicts were stored asks nothing again
    store.delete("inner/gen-0/rank/t1/_manifest.json")
    store.delete("inner/gen-0/rank/t1.json")
    assert run_rank(ctx, 0, "t1", client) == r and len(ep.requests) - before == 10


def test_too_few_usable_episodes_is_an_error_or_the_documented_fallback(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0})
    ep = judging_endpoint()
    ctx, client = collected(spec, store, ep, [3, 8, 5, 1], failing=(0, 2))
    with pytest.raises(RankError, match=r"t1: 2 usable episode\(s\), but ranking needs 3 .*use_available.*ep-0"):
        run_rank(ctx, 0, "t1", client)
    assert not store.exists("inner/gen-0/rank/t1.json")

    spec2 = inner_spec(store, search={"iterations": 0}, ranking={"fallback": "use_available"})
    r = run_rank(RunContext(spec2, store), 0, "t1", client)
    assert r.fallback_used and r.train == ["ep-1"] and r.val == "ep-3"
    assert sorted(r.excluded) == ["ep-0", "ep-2"] and "episode outcome failed" in r.excluded["ep-0"][0]


IDLE = {"orchestrator": [Reply.text("Done: the report is written and the score is 9.")]}  # a reply, no tool call


@pytest.mark.parametrize("keep", [False, True])
def test_episodes_that_did_no_work_are_never_ranked_unless_kept(make_store, inner_spec, judging_endpoint, keep):
    """Two of five teacher episodes claim success in prose and call no tool: `no_work`, vetoed before
    ranking (so no training window holds them) unless collection.keep_no_work says otherwise."""
    store = make_store("file")
    spec = inner_spec(
        store,
        search={"iterations": 0},
        ranking={"fallback": "use_available"},
        collection={"episodes": 5, "train_ranks": 2, "validation_rank": 3, "keep_no_work": keep},
    )
    ep = judging_endpoint()
    ctx, client = collected(spec, store, ep, [], scripts=[episode(3), IDLE, episode(8), IDLE, episode(5)])
    summary = store.get_json(ctx.collect_summary(0, "t1"))
    assert [e["outcome"] for e in summary["episodes"]] == ["success", "no_work", "success", "no_work", "success"]
    guard = GuardReport.model_validate(store.get_json(ctx.guard(0, "t1")))
    r = run_rank(ctx, 0, "t1", client)
    if keep:
        assert guard.usable == [f"ep-{i}" for i in range(5)] and not r.fallback_used
    else:
        assert guard.usable == ["ep-0", "ep-2", "ep-4"]
        assert "episode outcome no_work" in guard.episodes["ep-1"].reasons[0]
        assert (r.train, r.val) == (["ep-2", "ep-4"], "ep-0")  # by score; the idle ones claimed 9
        assert sorted(r.excluded) == ["ep-1", "ep-3"]


def test_a_task_whose_every_episode_did_no_work_stops_at_rank_saying_why(make_store, inner_spec, judging_endpoint):
    """Three prose-only teacher episodes (a model that does not call tools): nothing is judged, and
    the error counts the exclusions by outcome and names the setting, before the excluded list."""
    store = make_store("file")
    spec = inner_spec(
        store, search={"iterations": 0}, collection={"episodes": 3, "train_ranks": 1, "validation_rank": 2}
    )
    ep = judging_endpoint()
    ctx, client = collected(spec, store, ep, [], scripts=[IDLE, IDLE, IDLE])
    asked = len(ep.requests)
    with pytest.raises(RankError) as err:
        run_rank(ctx, 0, "t1", client)
    msg = str(err.value)
    assert msg.startswith("task t1: 0 usable episode(s), but ranking needs 2"), msg
    assert "3 excluded (3 no_work): no_work episodes ended without a workspace tool call" in msg
    assert "collection.keep_no_work: true" in msg and msg.index("3 excluded") < msg.index("excluded: {")
    assert len(ep.requests) == asked  # no verdict asked for


def test_unreadable_verdicts_are_invalid_not_ties(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0}, ranking={"verdict_retries": 1, "comparisons_per_episode": 2})
    ep = judging_endpoint()
    ctx, client = collected(spec, store, ep, [3, 8, 5, 1])
    ep.garbage_left = 3  # the first comparison fails twice (invalid), the second once (then valid)
    r = run_rank(ctx, 0, "t1", client)
    assert r.invalid_verdicts == 1
    assert [v.valid for v in r.verdicts] == [False, True, True, True]
    assert r.verdicts[0].winner is None and r.verdicts[0].attempts == 2 and r.verdicts[1].attempts == 2
    # the invalid verdict is left out of the fit; it is not counted as a tie
    valid = fit(r.episodes, [(v.first, v.second, v.score_of_first()) for v in r.verdicts[1:]])
    as_tie = fit(
        r.episodes,
        [(r.verdicts[0].first, r.verdicts[0].second, 0.5)]
        + [(v.first, v.second, v.score_of_first()) for v in r.verdicts[1:]],
    )
    assert r.scores == pytest.approx(valid) and r.scores != pytest.approx(as_tie)

    # the other estimator is a spec choice: the stored verdicts are refitted, nothing is asked again
    asked = len(ep.requests)
    spec2 = inner_spec(
        store,
        search={"iterations": 0},
        ranking={"verdict_retries": 1, "comparisons_per_episode": 2, "estimator": "virtual_ties"},
    )
    r2 = run_rank(RunContext(spec2, store), 0, "t1", client)
    assert len(ep.requests) == asked and r2.verdicts == r.verdicts
    ties = fit(r.episodes, [(v.first, v.second, v.score_of_first()) for v in r.verdicts[1:]], estimator="virtual_ties")
    assert r2.scores == pytest.approx(ties) and r2.scores != pytest.approx(r.scores)


def test_select_rules():
    order = [f"ep-{i}" for i in range(18)]
    assert select(order, 15, 16, "error") == (order[:15], "ep-15", False)
    with pytest.raises(RankError, match="3 usable episode"):
        select(order[:3], 15, 16, "error")
    assert select(order[:3], 15, 16, "use_available") == (order[:2], "ep-2", True)
    with pytest.raises(RankError, match="at least 2"):
        select(order[:1], 15, 16, "use_available")


@pytest.mark.parametrize(
    "n,per_episode", [(2, 6), (4, 2), (5, 3), (16, 6), (17, 5), (18, 6), (18, 3)], ids=lambda x: str(x)
)
def test_reference_schedule_is_connected_and_position_balanced(n, per_episode):
    ps = pairs(n, "reference", per_episode, seed=n)
    assert is_connected(n, ps)
    assert len({frozenset(p) for p in ps}) == len(ps)  # no pair twice
    degree, first = Counter(), Counter()
    for a, b in ps:
        degree[a] += 1
        degree[b] += 1
        first[a] += 1
    want = min(per_episode, n - 1)
    assert all(want <= degree[i] <= want + 1 for i in range(n))
    assert all(abs(2 * first[i] - degree[i]) <= 1 for i in range(n))  # shown first in half of its pairs


def test_paper_default_and_other_schedules():
    assert len(pairs(18, "reference", 6, seed=0)) == 54  # 18 episodes x 6 comparisons / 2
    assert pairs(18, "reference", 6, seed=1) != pairs(18, "reference", 6, seed=0)
    rr = pairs(7, "round_robin", seed=0)
    assert len(rr) == 21 and len({frozenset(p) for p in rr}) == 21
    both = schedule(5, "reference", 2, both_orders=True, seed=0)
    assert len(both) == 10 and Counter(frozenset((c.first, c.second)) for c in both).most_common(1)[0][1] == 2
    assert {(c.first, c.second) for c in both} == {(c.second, c.first) for c in both}
    rep = schedule(5, "reference", 2, verdicts_per_pair=2, seed=0)
    assert len(rep) == 10 and all(
        (rep[i].first, rep[i].second) == (rep[i + 1].second, rep[i + 1].first) for i in range(0, 10, 2)
    )
    # the orientation pattern is not the same for every pair (not always the lower index first)
    assert len({a < b for a, b in pairs(18, "reference", 6, seed=0)}) == 2
    with pytest.raises(ValueError, match="at least 2"):
        pairs(1)


def test_step_schemas_are_checked_in(tmp_path):
    written = write_step_schemas(tmp_path)
    assert [p.name for p in written] == ["verdict.schema.json", "ranking.schema.json", "search-state.schema.json"]
    for p in written:
        assert json.loads((SCHEMAS / p.name).read_text()) == json.loads(p.read_text()), f"regenerate {p.name}"


@pytest.mark.slow
def test_tiny_model_runs_the_chain_to_manifests(make_store, inner_spec, tiny_model_dir):
    """The untrained tiny model through the embedded server: malformed proposals and verdicts are
    handled as specified, and every step still ends in its manifest."""
    from mass_jobs.serving.serve import ModelServer

    store = make_store("file")
    spec = inner_spec(
        store,
        model={"base": str(tiny_model_dir), "sampling": {"max_output_tokens": 24}},
        search={"iterations": 1, "proposal_retries": 1, "evidence_bytes": 1024},
        collection={"episodes": 4, "train_ranks": 2, "validation_rank": 3, "keep_no_work": True},
        ranking={"comparisons_per_episode": 2, "verdict_retries": 1},
        execution={
            "concurrency": 2,
            "limits": {
                "turns_per_agent": 2,
                "tool_calls": 4,
                "wall_s": 120,
                "request_timeout_s": 60,
                "request_retries": 0,
            },
        },
    )
    ctx = RunContext(spec, store)
    with ModelServer(tiny_model_dir, served_name="tiny", device="cpu") as srv:
        client = ModelClient(srv.endpoint, spec.model.sampling, timeout_s=60, retries=0)
        execute = episode_runner(spec, srv.endpoint)
        run_search(ctx, 0, "t1", client, execute)
        state = Search(ctx, 0, "t1", client, execute).state()
        assert state.done and [r.k for r in state.iterations] == [0, 1]
        it1 = state.iterations[1]
        # random weights write no workflow in 24 tokens: retried once, then a failed iteration
        assert it1.workflow is None and it1.proposal_attempts == 2 and len(it1.proposal_errors) == 2
        assert state.feedback[1].result == "proposal_failed" and state.elite == 0
        # nor a verdict: the reference comparison is invalid after its retry, so nothing beats it
        ref = state.iterations[0].reference_verdict
        assert not ref.valid and ref.winner is None and ref.attempts == 2
        assert state.beats_reference is False
        summary = run_collect(ctx, 0, "t1", execute)
        assert summary["skipped"] and summary["episodes"] == []  # no teacher data from a workflow that lost
        # collect anyway (as a forced run does) to take the chain through guard and rank
        summary = run_collect(ctx, 0, "t1", execute, require_beats_reference=False)
        assert [e["id"] for e in summary["episodes"]] == ["ep-0", "ep-1", "ep-2", "ep-3"]
        # the episodes ran to their end, in prose: no_work, kept for ranking by the spec
        assert [e["outcome"] for e in summary["episodes"]] == ["no_work"] * 4
        guard = run_guard(ctx, 0, "t1")
        usable = len(guard.usable)
        assert usable == 4
        r = run_rank(ctx, 0, "t1", client)
    assert len(r.train) == 2 and r.val is not None and r.val not in r.train
    assert len(r.verdicts) == len(r.schedule) == usable  # two comparisons each: a ring
    assert all(v.valid or (v.winner is None and v.attempts == 2) for v in r.verdicts)
    assert store.exists("inner/gen-0/rank/t1/_manifest.json") and store.exists("inner/gen-0/rank/t1.json")


def upstream_judged_text(text: str) -> str:
    """The paper's code (its judging module's bundles): the bare task text as its judges read it."""
    return text.split("Use uv for all Python workflows")[0].replace("\\n", "\n").strip()


@pytest.mark.parametrize(
    "prompt",
    [
        "Fit the model.\\nReport R^2.\n\nUse uv for all Python workflows. Write your plan in logs.txt.",
        "  Fit.\n\nUse uv for all Python workflows.\nUse uv for all Python workflows again.  ",
        "Fit the model and report R^2.\n",  # no rules: judged as written
    ],
)
def test_judges_read_the_task_without_its_general_rules_as_the_papers_code(prompt):
    from mass_jobs.config.task_spec import Task

    task = Task(id="t", split="train", prompt=prompt)
    assert task.judged_text == (upstream_judged_text(prompt) if "Use uv" in prompt else prompt)


def test_ranking_verdicts_carry_the_judged_text_and_the_agents_the_whole_task(store, inner_spec, judging_endpoint):
    prompt = "Write report.md with your score.\n\nUse uv for all Python workflows. Write your plan in logs.txt."
    spec = inner_spec(
        store,
        collection={"episodes": 3},
        search={"iterations": 0},
        ranking={"pairing": "round_robin"},
        tasks=[{"id": "t1", "split": "train", "prompt": prompt, "deliverables": ["report.md"]}],
    )
    ep = judging_endpoint()
    ctx, client = collected(spec, store, ep, [3, 8, 5])
    before = len(ep.requests)
    run_rank(ctx, 0, "t1", client)
    verdicts = [json.dumps(r) for r in ep.requests[before:]]
    assert len(verdicts) == 3 and all("TASK:\\nWrite report.md with your score.\\n\\n" in v for v in verdicts)
    assert not any("Use uv" in v for v in verdicts)
    episode_doc = store.get_json(ctx.episode_file(0, "t1", 0, "episode.json"))
    assert episode_doc["prompt"].startswith(prompt)  # the agents are given the rules
