"""Workflow search through the real harness and a scripted endpoint whose evaluator judges by content."""

import json
from pathlib import Path

import pytest

from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.judging.compare import bundle, judge, parse_verdict
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.steps.search import Search, run_search
from mass_jobs.steps.search_state import SearchState
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode, proposal


class Killed(Exception):
    pass


class KillOnCall:
    """Wraps a client and dies on its n-th evaluator call (a pod killed mid-iteration)."""

    def __init__(self, client, die_at: int):
        self.client, self.die_at, self.calls = client, die_at, 0

    def chat(self, messages, **kw):
        if (kw.get("headers") or {}).get("X-Mass-Role") == "evaluator":
            self.calls += 1
            if self.calls == self.die_at:
                raise Killed("killed")
        return self.client.chat(messages, **kw)


def script_k3(ep):
    """Reference score 1, initial 5; proposals score 7 (better), 3 (worse), 9 (better, after one malformed reply)."""
    add_episodes(ep, episode(1), episode(5))
    ep.add("optimizer", Reply.text(proposal("v1")))
    add_episodes(ep, episode(7))
    ep.add("optimizer", Reply.text(proposal("v2", "reviewer")))
    add_episodes(ep, episode(3))
    ep.add("optimizer", Reply.text("I would add a tester agent."), Reply.text(proposal("v3", "tester")))
    add_episodes(ep, episode(9))


def run_k3(spec, store, ep, client=None):
    ctx = RunContext(spec, store)
    client = client or ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    return Search(ctx, 0, "t1", client, episode_runner(spec, ep.endpoint))


def stored_tree(store, prefix):
    """Every stored JSON/text object of a search, minus timings that differ between runs."""
    out = {}
    for key in store.list(prefix):
        if key.endswith(("workflow.json", "verdict.json", "proposal.json", "state.json", "prompt.txt")):
            out[key.split("/search/", 1)[1]] = store.get_bytes(key)
    return out


def test_search_k3_replaces_elite_only_when_preferred(store, inner_spec, judging_endpoint):
    spec = inner_spec(store)
    ep = judging_endpoint()
    script_k3(ep)
    state = run_k3(spec, store, ep).run()

    assert [r.k for r in state.iterations] == [0, 1, 2, 3]
    assert [r.preferred for r in state.iterations] == [True, True, False, True]
    assert [r.elite_after for r in state.iterations] == [0, 1, 1, 3]
    assert state.elite == 3 and state.done and state.beats_reference
    assert state.beat_reference == [0, 1, 3]  # every elite, each judged once against the reference
    assert [f.result for f in state.feedback] == ["initial", "new_elite", "elite_kept", "new_elite"]
    assert (
        state.feedback[2].rationale
        == "picked " + ("A" if state.iterations[2].verdict.first == "iter-1" else "B") + " by content"
    )
    assert state.iterations[3].proposal_attempts == 2 and "no JSON object" in state.iterations[3].proposal_errors[0]
    assert state.elite_workflow["agents"][1]["id"] == "tester"
    # evaluator calls: elite-0 vs reference, 1 vs 0, 1 vs ref, 2 vs 1, 3 vs 1, 3 vs ref
    assert len(ep.verdicts) == 6
    # the blind order is not the same for every comparison
    assert len({r.verdict.first == f"iter-{r.k}" for r in state.iterations[1:]}) == 2
    # the optimizer saw the history, the elite and the evidence of the last workspace
    briefs = [r["body"]["messages"][1]["content"] for r in ep.requests if r["key"] == "optimizer"]
    assert len(briefs) == 4  # three proposals, one retry of a malformed reply (same brief + the error)
    assert "- v1 against v0: win" in briefs[1] and '+   "id": "checker",' in briefs[1]
    assert "- v1 against the bare reference: win" in briefs[1] and "CURRENT WORKFLOW (v1)" in briefs[1]
    assert "- v2 against v1: loss" in briefs[2] and "PREVIOUS BEST WORKFLOW (v1):" in briefs[2]
    assert "the judge preferred its deliverables over the current v2's" in briefs[2]
    assert "ORIGINAL WORKFLOW (v0" in briefs[2] and "3. VERDICTS AGAINST THE BEST VERSION" in briefs[2]
    assert "score: 3" in briefs[2] and "- report.md: FOUND" in briefs[2]  # v2's workspace
    assert "score: 7" not in briefs[2]
    # persisted per iteration, with the layout of the docs
    it2 = "inner/gen-0/search/t1/iter-2"
    for name in ("workflow.json", "prompt.txt", "workspace.tar.gz", "trace.jsonl", "status.json", "verdict.json"):
        assert store.exists(f"{it2}/{name}")
    assert store.get_json(f"{it2}/status.json")["outcome"] == "success"
    assert store.exists("inner/gen-0/search/t1/reference/workspace.tar.gz")
    assert "## Workflow" not in store.get_bytes("inner/gen-0/search/t1/reference/prompt.txt").decode()
    saved = SearchState.model_validate(store.get_json("inner/gen-0/search/t1/state.json"))
    assert saved == state
    # a rerun asks nothing
    n = len(ep.requests)
    assert run_k3(spec, store, ep).run() == state and len(ep.requests) == n


def test_the_papers_fixed_order_shows_the_reference_or_the_best_version_first(store, inner_spec, judging_endpoint):
    """search.judge_order: fixed (examples/paper.yaml): as in the paper's code, the baseline (or the
    version a new one challenges) is A in every verdict; the decisions are the seeded order's, since
    this fixture's evaluator judges by content."""
    spec = inner_spec(store, search={"judge_order": "fixed"})
    ep = judging_endpoint()
    script_k3(ep)
    state = run_k3(spec, store, ep).run()
    assert [r.preferred for r in state.iterations] == [True, True, False, True]
    shown_first = [
        (r.k, r.reference_verdict and r.reference_verdict.first, r.verdict and r.verdict.first)
        for r in state.iterations
    ]
    assert shown_first == [
        (0, "reference", None),
        (1, "reference", "iter-0"),
        (2, None, "iter-1"),
        (3, "reference", "iter-1"),
    ]


def test_killed_search_resumes_equal_to_uninterrupted(make_store, inner_spec, judging_endpoint):
    full_store, killed_store = make_store("file"), make_store("file")
    spec = inner_spec(full_store)
    ep_full = judging_endpoint()
    script_k3(ep_full)
    full = run_k3(spec, full_store, ep_full).run()

    ep = judging_endpoint()
    script_k3(ep)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    with pytest.raises(Killed):  # dies at "2 vs 1": after iteration 2's proposal and rollout were stored
        run_k3(spec, killed_store, ep, KillOnCall(client, die_at=4)).run()
    assert Search(RunContext(spec, killed_store), 0, "t1", None, None).done_through() == 1
    asked_optimizer = sum(r["key"] == "optimizer" for r in ep.requests)
    resumed = run_k3(spec, killed_store, ep).run()
    assert resumed == full
    assert stored_tree(killed_store, "inner/gen-0/search") == stored_tree(full_store, "inner/gen-0/search")
    # the proposal and the rollout of iteration 2 were not redone: one optimizer call left (with its retry)
    assert sum(r["key"] == "optimizer" for r in ep.requests) - asked_optimizer == 2
    assert ep.remaining("orchestrator") == 0 and ep.remaining("optimizer") == 0


def test_single_iterations_for_argo_and_failed_proposals(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 2, "proposal_retries": 1})
    ep = judging_endpoint(garbage_first=0)
    add_episodes(ep, episode(2), episode(2))
    ep.add("optimizer", Reply.text("no"), Reply.text('{"agents": []}'))  # iteration 1: both malformed
    ep.add("optimizer", Reply.text(proposal("v2")))
    add_episodes(ep, episode(2))  # iteration 2 ties with the elite
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    execute = episode_runner(spec, ep.endpoint)
    with pytest.raises(RuntimeError, match="iteration 0 is not finished"):
        run_search(ctx, 0, "t1", client, execute, iteration=1)
    assert run_search(ctx, 0, "t1", client, execute, iteration=0)["continue"] is True
    out1 = run_search(ctx, 0, "t1", client, execute, iteration=1)
    assert out1["continue"] is True and out1["next"] == 2
    out2 = run_search(ctx, 0, "t1", client, execute, iteration=2)
    assert out2 == {"continue": False, "next": None, "elite": 0, "beats_reference": False}
    state = Search(ctx, 0, "t1", client, execute).state()
    assert [f.result for f in state.feedback] == ["initial", "proposal_failed", "elite_kept"]
    assert state.iterations[1].workflow is None and state.iterations[1].proposal_attempts == 2
    assert "expected at least 1 item(s)" in state.iterations[1].proposal_errors[1]
    assert state.iterations[2].verdict.winner == "tie"
    assert not store.exists("inner/gen-0/search/t1/iter-1/workspace.tar.gz")
    with pytest.raises(RuntimeError, match=r"in 0..2"):
        run_search(ctx, 0, "t1", client, execute, iteration=3)


def test_bundle_is_bounded_and_names_deliverables(tmp_path: Path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "metrics.json").write_text(json.dumps({"sharpe": 1.2}))
    (tmp_path / "report.md").write_text("# R\n" + "x" * 5000)
    (tmp_path / "code.py").write_text("print(1)\n" * 400)
    (tmp_path / ".hidden").write_text("secret")
    text = bundle(tmp_path, 4096, ["report.md", "plots/a.png"], {"outcome": "timeout", "reason": "wall"})
    assert len(text.encode()) <= 4096 and text.endswith("[... truncated]")
    assert text.startswith("RUN NOTICE: the episode ended with outcome 'timeout'")
    assert "- report.md: FOUND" in text and "- plots/a.png: MISSING" in text
    assert ".hidden" not in text and "code.py" in text
    full = bundle(tmp_path, None, ["report.md"])
    assert '"sharpe": 1.2' in full and "FILE report.md:" in full and "FILE code.py" not in full
    assert bundle(tmp_path, 2048, ["report.md"]) == bundle(tmp_path, 2048, ["report.md"])


@pytest.mark.parametrize(
    "reply,expected",
    [
        ('{"winner": "B", "rationale": "b has plots"}', ("B", "b has plots")),
        ('<think>{"winner": "A"}</think>\nWinner: tie', ("tie", "Winner: tie")),
        ('```json\n{"winner": "a", "rationale": ""}\n```', ("A", "")),
    ],
    ids=["json", "line-after-think", "fenced-lowercase"],
)
def test_parse_verdict(reply, expected):
    assert parse_verdict(reply) == expected


def test_unreadable_verdicts_are_retried_then_invalid(judging_endpoint):
    ep = judging_endpoint(garbage_first=2)
    client = ModelClient(ep.endpoint, None, timeout_s=10, retries=0)
    v = judge(client, "task", ("x", "score: 1"), ("y", "score: 2"), retries=2)
    assert v.valid and v.winner == "y" and v.attempts == 3 and len(v.errors) == 2
    ep.garbage_left = 3
    v = judge(client, "task", ("x", "score: 1"), ("y", "score: 2"), retries=2)
    assert not v.valid and v.winner is None and v.attempts == 3
    with pytest.raises(ValueError, match="invalid verdict"):
        v.score_of_first()


def test_cli_entries_print_json_and_use_exit_codes(tmp_path, judging_endpoint, capsys):
    import yaml

    from mass_jobs.commands.cli import main
    from tests.fixtures.inner_loop import spec_document

    doc = spec_document(
        f"file://{tmp_path / 'store'}",
        search={"iterations": 1},
        collection={"episodes": 2, "train_ranks": 1, "validation_rank": 2},
        ranking={"comparisons_per_episode": 1},
    )
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "tiny").mkdir()  # model locations are checked: the spec's model exists (scripted endpoint serves it)
    ep = judging_endpoint()
    add_episodes(ep, episode(1), episode(5))
    common = ["--spec", str(tmp_path / "spec.yaml"), "--gen", "0", "--task", "t1"]
    model = ["--endpoint", ep.base_url, "--served-model", "scripted"]
    assert main(["search", *common, *model, "--iteration", "0"]) == 0
    assert json.loads(capsys.readouterr().out) == {"continue": True, "next": 1, "elite": 0, "beats_reference": True}
    assert main(["collect", *common, *model]) == 1  # the search is not finished
    assert "search of generation 0 is not finished" in capsys.readouterr().err
    ep.add("optimizer", Reply.text(proposal("v1")))
    add_episodes(ep, episode(2))
    assert main(["search", *common, *model, "--iteration", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["continue"] is False
    add_episodes(ep, episode(4), episode(3))
    assert main(["collect", *common, *model]) == 0
    assert json.loads(capsys.readouterr().out)["eligible"] == ["ep-0", "ep-1"]
    assert main(["guard", *common]) == 0
    assert json.loads(capsys.readouterr().out)["usable"] == ["ep-0", "ep-1"]
    assert main(["rank", *common, *model]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "task": "t1",
        "skipped": False,
        "train": ["ep-0"],
        "val": "ep-1",
        "invalid_verdicts": 0,
    }
    assert main(["rank", "--spec", str(tmp_path / "spec.yaml"), "--gen", "0", "--task", "nope", *model]) == 2
    assert "--task: expected one of ['t1'], found 'nope'" in capsys.readouterr().err
