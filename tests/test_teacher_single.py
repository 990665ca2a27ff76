"""The single-agent teacher control (collection.teacher: single): same task, workflow and directive,
no delegation tool. Its traces hold no delegation, its rendered windows are all non-orchestrator
and the teacher prompt is still stripped from the one agent's first input."""

import json

import pytest
from transformers import AutoTokenizer

from mass_jobs.config.run_spec import SftSpec
from mass_jobs.episodes.audit import audit_episode
from mass_jobs.episodes.harness import load_episode_file
from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.spec.load import SpecError, validate_document
from mass_jobs.spec.workflow import DIRECTIVE_HEADER, TEACHER_DIRECTIVE, WORKFLOW_HEADER
from mass_jobs.steps.collect import Collection, run_collect
from mass_jobs.steps.render_sft import load_episode, render_episode, render_windows
from mass_jobs.steps.search import run_search
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode, spec_document

EPISODES = 4


def solo(score):
    """One single-agent episode: the agent writes the report itself and finishes."""
    return [
        Reply.call("write_file", path="report.md", content=f"# Report\nscore: {score}\n"),
        Reply.call("shell", command="cat report.md"),
        Reply.call("finish", summary="report.md written"),
    ]


@pytest.fixture
def collected(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0}, collection={"teacher": "single"})
    ep = judging_endpoint()
    ctx = RunContext(spec, store)
    add_episodes(ep, episode(1), episode(5))  # the search stays a team: reference, then the initial workflow
    run_search(
        ctx,
        0,
        "t1",
        ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0),
        episode_runner(spec, ep.endpoint),
    )
    n_search = len(ep.requests)
    for i in range(EPISODES):
        ep.add("agent", *solo(i))
    summary = run_collect(ctx, 0, "t1", episode_runner(spec, ep.endpoint))
    return ctx, ep, n_search, summary


def test_single_agent_episodes_offer_no_delegation_and_delegate_nothing(collected, tmp_path):
    ctx, ep, n_search, summary = collected
    assert summary["eligible"] == [f"ep-{i}" for i in range(EPISODES)]
    teacher_calls = ep.requests[n_search:]
    assert len(teacher_calls) == 3 * EPISODES
    for r in teacher_calls:
        tools = {t["function"]["name"] for t in r["body"]["tools"]}
        assert tools == {"read_file", "write_file", "list_files", "shell", "finish"}
        assert r["headers"]["x-mass-agent"] == "agent" and r["headers"]["x-mass-role"] == "worker"
        assert "x-mass-parent" not in r["headers"]
    # same teacher prompt as the team's: task + elite workflow + directive
    prompt = teacher_calls[0]["body"]["messages"][1]["content"]
    assert WORKFLOW_HEADER in prompt and prompt.endswith(f"{DIRECTIVE_HEADER}\n{TEACHER_DIRECTIVE}")
    store = ctx.store
    for i in range(EPISODES):
        base = f"inner/gen-0/collect/t1/ep-{i}"
        status = store.get_json(f"{base}/status.json")
        assert status["outcome"] == "success" and status["counts"]["delegations"] == 0
        assert store.get_json(f"{base}/episode.json")["teacher"] == "single"
        out = tmp_path / f"ep-{i}"
        out.mkdir()
        (out / "trace.jsonl").write_bytes(store.get_bytes(f"{base}/trace.jsonl"))
        audit = audit_episode(out).to_dict()
        assert audit["delegation"] is False and audit["code_handoff"] is False


def test_single_agent_windows_are_all_non_orchestrator_and_stripped(collected, tiny_model_dir):
    ctx, _, _, _ = collected
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    task = ctx.spec.task("t1")
    episodes = [load_episode(ctx, 0, task, i) for i in range(EPISODES)]
    sft = SftSpec(window=2048, context=256)
    windows, stats = render_windows(episodes, tok, sft)
    assert len(windows) >= EPISODES and {w.role for w in windows} == {"worker"}
    assert stats["episodes_dropped"] == [] and stats["episode_errors"] == []
    from mass_jobs.steps.sft_tokens import mask_method, turn_opener

    rendered = render_episode(episodes[0], tok, sft, mask_method(tok), turn_opener(tok))
    assert rendered.threads_by_role["worker"] == 1 and rendered.threads_by_role["orchestrator"] == 0
    text = tok.decode(windows[0].input_ids)
    assert task.prompt in text and WORKFLOW_HEADER not in text and DIRECTIVE_HEADER not in text


def test_team_episode_inputs_are_unchanged_and_argo_input_carries_the_mode(
    make_store, inner_spec, judging_endpoint, tmp_path
):
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0}, collection={"teacher": "single"})
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
    team = RunContext(inner_spec(store, search={"iterations": 0}), store)
    assert "teacher" not in Collection(team, 0, "t1").episode_doc(0)  # team manifests keep their input hash
    run_collect(ctx, 0, "t1", None, episode=0, phase="prepare", endpoint=ep.endpoint)
    path = tmp_path / "episode.json"
    path.write_text(json.dumps(store.get_json("inner/gen-0/collect/t1/ep-0/input/episode.json")))
    assert load_episode_file(path).single_agent is True
    run_collect(team, 0, "t1", None, episode=1, phase="prepare", endpoint=ep.endpoint)
    assert "single_agent" not in store.get_json("inner/gen-0/collect/t1/ep-1/input/episode.json")


def test_single_teacher_needs_the_builtin_harness(tmp_path):
    doc = spec_document(f"file://{tmp_path}", collection={"teacher": "single"}, execution={"harness": "qwen-code"})
    with pytest.raises(SpecError, match=r"\$\.collection\.teacher: expected 'team' with harness 'qwen-code'"):
        validate_document(doc)
    with pytest.raises(SpecError, match=r"collection\.teacher"):
        validate_document(spec_document(f"file://{tmp_path}", collection={"teacher": "solo"}))
