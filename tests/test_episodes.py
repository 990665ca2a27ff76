"""The agent episode has one home: every step builds its input from the spec in one place, stores it
with one writer and runs it on Argo in the same typed phases."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.episodes import rollouts
from mass_jobs.episodes.episode import EpisodeRequest, status_text
from mass_jobs.episodes.rollouts import Phase, RolloutError, phase_of
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.steps.collect import run_collect
from mass_jobs.steps.search import run_search
from tests.fixtures.inner_loop import add_episodes, episode

ROOT = Path(__file__).resolve().parents[1] / "mass_jobs"


def constructions(root: Path, name: str) -> dict[str, int]:
    """module path -> calls of `name(...)` in it."""
    found: dict[str, int] = {}
    for p in root.rglob("*.py"):
        n = sum(
            1
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
        )
        if n:
            found[p.relative_to(root).as_posix()] = n
    return found


def test_only_the_episode_module_builds_an_episode_input():
    # from_spec (what every step calls) and the pod's episode.json parser, both in episodes/episode.py
    assert constructions(ROOT, "EpisodeInput") == {"episodes/episode.py": 2}


def test_the_scan_finds_a_construction(tmp_path):
    (tmp_path / "m.py").write_text("def f(x):\n    return EpisodeInput(prompt=x)\n")
    assert constructions(tmp_path, "EpisodeInput") == {"m.py": 1}


def test_an_execution_setting_reaches_the_episodes_of_search_and_collect(make_store, inner_spec, judging_endpoint):
    """The agent pods' episode.json of a search iteration and of a teacher episode carry the spec's
    limits, sampling and harness: the one path (EpisodeInput.from_spec) both steps take."""
    store = make_store("file")
    spec = inner_spec(
        store,
        search={"iterations": 0},
        execution={"limits": {"turns_per_agent": 7, "tool_calls": 33}},
        model={"sampling": {"temperature": 0.3}},
    )
    ep = judging_endpoint()
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    docs = []
    for item in run_search(ctx, 0, "t1", client, None, iteration=0, phase="prepare", endpoint=ep.endpoint)["rollouts"]:
        docs.append(store.get_json(ctx.agent_input(ctx.under_run(item["rollout"]), "episode.json")))
    add_episodes(ep, episode(1), episode(5))
    run_search(ctx, 0, "t1", client, rollouts.episode_runner(spec, ep.endpoint))  # the rest of the search, here
    run_collect(ctx, 0, "t1", None, episode=0, phase="prepare", endpoint=ep.endpoint)
    docs.append(store.get_json(ctx.episode_input(0, "t1", 0, "episode.json")))
    assert len(docs) == 3
    for doc in docs:
        assert doc["limits"]["turns_per_agent"] == 7 and doc["limits"]["tool_calls"] == 33
        assert doc["sampling"]["temperature"] == 0.3 and doc["harness"] == spec.execution.harness


class Recording:
    """A store that records the order of its writes (delegating everything to a real one)."""

    def __init__(self, store):
        self._store, self.puts = store, []

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if name.startswith("put_"):

            def put(key, *a, **kw):
                self.puts.append(key.rsplit("/", 1)[1])
                return attr(key, *a, **kw)

            return put
        return attr


def test_one_writer_stores_status_last_in_the_harness_bytes(make_store, inner_spec, tmp_path):
    store = make_store("file")
    rec = Recording(store)
    ctx = RunContext(inner_spec(store), rec)
    status = {"outcome": "success", "reason": "", "z": 1, "a": [2]}
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "report.md").write_text("done\n")
    keys = rollouts.store_record(
        ctx,
        "inner/x",
        status=status,
        trace=b'{"seq": 0}\n',
        workspace=ws,
        first={"prompt.txt": "the task", "audit.json": {"d": 1}},
    )
    assert rec.puts == ["prompt.txt", "audit.json", "workspace.tar.gz", "trace.jsonl", "status.json"]
    assert keys == [f"inner/x/{n}" for n in rec.puts]
    assert store.get_bytes("inner/x/status.json") == status_text(status).encode()
    assert list(json.loads(store.get_bytes("inner/x/status.json"))) == [
        "a",
        "outcome",
        "reason",
        "z",
    ]  # sorted, as written
    assert store.get_bytes("inner/x/prompt.txt") == b"the task"


def test_run_here_shows_the_seeded_workspace_before_the_agent(tmp_path):
    seen = []

    def execute(request, workspace, out_dir):
        seen.append(("agent", sorted(p.name for p in workspace.iterdir())))
        (out_dir / "trace.jsonl").write_bytes(b"x\n")
        return {"outcome": "no_work", "seed": request.seed}

    request = EpisodeRequest(prompt="p", files={"sim/env.py": "G = 1\n"}, seed=11)
    with rollouts.run_here(
        execute, request, seeded=lambda ws: seen.append(("seeded", (ws / "sim" / "env.py").read_text()))
    ) as ran:
        assert ran.status == {"outcome": "no_work", "seed": 11} and ran.trace == b"x\n"
        assert (ran.workspace / "sim" / "env.py").exists()
    assert seen == [("seeded", "G = 1\n"), ("agent", ["sim"])]
    assert not ran.workspace.exists()  # a workspace of its own, gone after


def test_phases_are_one_vocabulary():
    assert [p.value for p in Phase] == ["plan", "prepare", "ingest", "finish"]
    assert phase_of(None) is None and phase_of("finish") is Phase.FINISH
    with pytest.raises(RolloutError, match=r"--phase: collect has prepare, ingest, finish, got 'plan'"):
        phase_of("plan", step="collect")
    with pytest.raises(RolloutError, match="got 'summarize'"):
        phase_of("summarize")


@pytest.mark.parametrize("command", ["search", "collect", "guard"])
def test_every_agent_step_takes_the_same_phase_words(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main([command, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "{prepare,ingest,finish}" in text and "--agent-pods" not in text
