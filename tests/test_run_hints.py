"""The hints `mass run` prints name the run it started: its overrides travel with them, and a failure
that repeats on every rerun says so instead of "rerun"."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from mass_jobs.commands import run as run_command
from mass_jobs.commands.cli import main as mass
from mass_jobs.config.errors import REPEATS
from mass_jobs.steps.rank import RankError

pytestmark = pytest.mark.unit
EXAMPLE = Path(__file__).parents[1] / "examples" / "tiny.yaml"


@pytest.fixture
def spec(tmp_path, tiny_model_dir) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    doc["model"]["base"] = doc["judges"][0]["model"] = str(tiny_model_dir)
    path = tmp_path / "my spec.yaml"  # a space: the hint must quote it
    path.write_text(yaml.safe_dump(doc))
    return path


def hint_command(text: str, verb: str) -> list[str]:
    """The words of the first `mass <verb> ...` in backquotes of `text`."""
    start = text.index(f"`mass {verb} ") + 1
    return shlex.split(text[start : text.index("`", start)])


def test_the_until_hint_repeats_the_overrides_so_it_resumes_this_run(spec, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_command, "run", lambda *a, **k: {"stopped_after": {"gen": 0, "step": "render"}})
    argv = [
        "run",
        str(spec),
        "--set",
        "name=tiny-until",
        "--overlay",
        str(spec),
        "--until",
        "0:render",
        "--work-dir",
        str(tmp_path / "w"),
    ]
    assert mass(argv) == 0
    out = capsys.readouterr().out
    assert "stopped after L0 render (--until)" in out
    words = hint_command(out, "run")
    assert words == ["mass", "run", str(spec), "--overlay", str(spec), "--set", "name=tiny-until"]
    # what the hint names is the run that stopped: the same spec, the same name
    from mass_jobs.spec.load import load_spec
    from mass_jobs.spec.overrides import SpecSource

    assert load_spec(SpecSource(words[2], (words[4],), (words[6],))).name == "tiny-until"


@pytest.mark.parametrize(
    "error, repeats",
    [
        (RuntimeError("the model server died"), False),
        (RankError("task t1: 1 usable episode(s), but ranking needs 3"), True),
    ],
)
def test_a_failure_names_this_run_and_says_whether_a_rerun_helps(spec, tmp_path, monkeypatch, capsys, error, repeats):
    def fail(*a, **k):
        raise error

    monkeypatch.setattr(run_command, "run", fail)
    assert mass(["run", str(spec), "--set", "name=other", "--work-dir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err
    assert str(error) in err
    assert hint_command(err, "status")[2:] == [str(spec), "--set", "name=other"]
    assert (REPEATS in err) is repeats
    assert ("resumes" in err) is not repeats


def test_a_step_that_fails_for_good_says_so_and_the_runner_reads_it_back(spec, monkeypatch, capsys):
    from mass_jobs.commands import rank as rank_command

    def too_few(args):
        raise RankError("task t1: 0 usable episode(s), but ranking needs 3")

    monkeypatch.setattr(rank_command, "main", too_few)
    assert mass(["rank", str(spec), "--gen", "0", "--task", "t1"]) == 1
    log = capsys.readouterr().err
    assert log.strip().endswith(f"({REPEATS})")
    # the argv handler's RunError carries the step's log tail: the run's hint reads the marker there
    hint = run_command.failure_hint(RuntimeError(f"`rank` exited 1; log rank.log:\n{log}"), "run", "s.yaml")
    assert hint.startswith(REPEATS) and "resumes" not in hint
