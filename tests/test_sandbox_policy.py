"""execution.sandbox: where bubblewrap cannot build the sandbox, nothing model-written runs. `mass
validate`, `mass run` and `mass episode` refuse up front with one line naming bubblewrap (through the
real entry, with a PATH that has no bwrap); an episode runner refuses before its first episode; the
opt-out `execution.sandbox: none` is declared to what the run starts and recorded in each episode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mass_jobs.sandbox import run as sandbox
from mass_jobs.spec.load import load_spec

REFUSAL = "bubblewrap cannot build the sandbox here (bwrap (bubblewrap) is not installed)"


def write_spec(tmp_path: Path, **execution) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)  # no config.json: no template check, nothing to serve
    doc = {
        "name": "fail-closed",
        "model": {"base": str(tmp_path / "model")},
        "tasks": [{"id": "t", "split": "train", "prompt": "Write a.py."}],
        "store": {"uri": f"file://{tmp_path}/store"},
        "execution": execution,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def without_bwrap(tmp_path: Path) -> dict:
    """The environment of a machine without bubblewrap: a PATH on which `bwrap` is not found."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != sandbox.BOUNDARY_ENV}
    return {**env, "PATH": str(empty)}


def mass(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("cmd", ["validate", "run"])
def test_validate_and_run_refuse_without_bwrap_naming_it_and_write_nothing(cmd, tmp_path):
    spec = write_spec(tmp_path)
    args = [cmd, str(spec)] + (["--no-progress"] if cmd == "run" else [])
    proc = mass(without_bwrap(tmp_path), *args)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = next(ln for ln in proc.stderr.splitlines() if "$.execution.sandbox" in ln)
    assert REFUSAL in line and "apt-get install bubblewrap" in line and "execution.sandbox: none" in line
    assert not (tmp_path / "store").exists()


def test_validate_accepts_the_explicit_opt_out_without_bwrap(tmp_path):
    proc = mass(without_bwrap(tmp_path), "validate", str(write_spec(tmp_path, sandbox="none")))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_cluster_spec_needs_no_local_bwrap(tmp_path, monkeypatch):
    """Under mode: argo the agent pods are the boundary: the laptop that validates needs no bwrap."""
    from mass_jobs.run.sandboxing import sandbox_issues

    monkeypatch.setattr(sandbox, "_tools", lambda: (None, "bwrap (bubblewrap) is not installed"))
    spec = load_spec(str(write_spec(tmp_path)))
    assert [i.path for i in sandbox_issues(spec)] == ["$.execution.sandbox"]
    spec.execution = spec.execution.model_copy(update={"mode": "argo"})
    assert sandbox_issues(spec) == []


def test_mass_episode_refuses_without_bwrap_and_runs_no_agent(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "episode.json").write_text(
        json.dumps({"prompt": "x", "endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}})
    )
    proc = mass(without_bwrap(tmp_path), "episode", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.startswith(f"mass episode: {REFUSAL}"), proc.stderr[-3000:]
    assert not (tmp_path / "out" / "status.json").exists() and not (tmp_path / "out" / "workspace").exists()


def test_an_episode_runner_refuses_before_its_first_episode(tmp_path, monkeypatch):
    from mass_jobs.episodes.rollouts import episode_runner
    from mass_jobs.serving.llm import Endpoint

    monkeypatch.setattr(sandbox, "_tools", lambda: (None, "bwrap (bubblewrap) is not installed"))
    monkeypatch.setenv(sandbox.BOUNDARY_ENV, "pod")  # a boundary left in the environment does not stand in
    from mass_jobs.episodes.episode import EpisodeRequest

    endpoint = Endpoint("http://127.0.0.1:9/v1", "m")
    execute = episode_runner(load_spec(str(write_spec(tmp_path))), endpoint)  # a step whose pods run them: fine
    (tmp_path / "ws").mkdir()
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        execute(EpisodeRequest(prompt="x", files={"a.txt": "a"}, seed=0), tmp_path / "ws", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "ws" / "a.txt").exists()  # no episode began
    monkeypatch.setattr("mass_jobs.episodes.harness.run_episode", lambda *a, **k: type("R", (), {"status": {}})())
    episode_runner(load_spec(str(write_spec(tmp_path, sandbox="none"))), endpoint)(
        EpisodeRequest(prompt="x", files={}, seed=0), tmp_path / "ws", tmp_path / "out"
    )
    assert os.environ[sandbox.BOUNDARY_ENV] == "none"  # what the run's episodes and `mass episode` children inherit


def test_the_opt_out_is_recorded_in_the_episode_status(tmp_path, monkeypatch, scripted_endpoint):
    """execution.sandbox: none on a machine without bwrap: the episode runs its shell command on the
    host, and its status says what bounded it."""
    from mass_jobs.episodes.episode import EpisodeRequest
    from mass_jobs.episodes.rollouts import episode_runner
    from mass_jobs.tools.testing.scripted_endpoint import Reply

    monkeypatch.setattr(sandbox, "_tools", lambda: (None, "bwrap (bubblewrap) is not installed"))
    monkeypatch.setenv(sandbox.BOUNDARY_ENV, "")  # so that what the spec declares is undone after the test
    ep = scripted_endpoint({"*": [Reply.call("shell", command="echo hi > a.py"), Reply.text("wrote a.py")]})
    execute = episode_runner(load_spec(str(write_spec(tmp_path, sandbox="none"))), ep.endpoint)
    (tmp_path / "ws").mkdir()
    status = execute(
        EpisodeRequest(prompt="Write a.py.", files={}, seed=1, single_agent=True), tmp_path / "ws", tmp_path / "out"
    )
    assert status["outcome"] == "success", status
    assert (tmp_path / "ws" / "a.py").read_text() == "hi\n"
    assert status["sandbox"]["boundary"] == "none" and status["sandbox"]["network_isolated"] is False


def test_the_argo_cycle_s_validate_step_needs_no_bwrap_in_its_step_pod(tmp_path):
    """`mass validate --outputs` is the first step of every Argo cycle: its episodes run in agent
    pods, so a step pod without namespaces is no reason to refuse (the laptop's validate is)."""
    spec = write_spec(tmp_path)
    proc = mass(without_bwrap(tmp_path), "validate", str(spec), "--outputs", str(tmp_path / "outputs"))
    assert "$.execution.sandbox" not in proc.stderr, proc.stderr[-3000:]
