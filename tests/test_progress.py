"""Progress of long work: the runner's plain (`--no-progress`) lines and ETA, the per-generation
rollout counter, and `mass model tiny --warm` printing its steps and loss."""

from __future__ import annotations

import io
import math
import re

import pytest

from mass_jobs.pipeline.progress import Display, Eta, PerKey


def test_plain_display_prints_each_step_its_notes_and_an_eta():
    out = io.StringIO()
    with Display(["search", "collect", "guard"], enabled=False, stream=out, note_every_s=3600) as d:
        d.step("L0 search")
        d.note("search task 1/2 fib", 0, 2)  # the first note of a step is printed
        d.note("search task 2/2 primes", 1, 2)  # throttled
        d.note("episode 5", 5, 5)  # the last one always
        d.done("L0 search", skipped=False, seconds=30.0)
        d.step("L0 collect")
        d.done("L0 collect", skipped=True, seconds=0.1)
    lines = out.getvalue().splitlines()
    assert lines == [
        "start L0 search (step 1/3, ETA unknown: 3 steps left not timed yet)",
        "  L0 search: search task 1/2 fib [0/2]",
        "  L0 search: episode 5 [5/5]",
        "done L0 search (30.0s; 1/3 steps, ETA unknown: 2 steps left not timed yet)",
        "start L0 collect (step 2/3, ETA unknown: 2 steps left not timed yet)",
        "skip L0 collect (0.1s; 2/3 steps, ETA unknown: 1 steps left not timed yet)",
    ]


def test_eta_counts_only_steps_that_did_work_and_is_unknown_while_a_step_left_is_untimed():
    """A guess from other steps' times said 0:45 for fourteen steps that took four minutes: the
    steps a run reaches last are its longest, so a step left without a time of its own is unknown."""
    eta = Eta(["a"] * 4 + ["b", "c"] + ["d"] * 4 + ["b", "c"])
    for _ in range(4):
        eta.add(0.01, skipped=True)
    assert eta.text() == "ETA unknown: 8 steps left not timed yet"
    eta.add(60, skipped=False)
    eta.add(120, skipped=False)
    assert eta.text() == "ETA unknown: 4 steps left not timed yet"  # d never ran: no guess
    for _ in range(4):
        eta.add(1, skipped=True)  # stored: they cost nothing and time nothing
    assert eta.text() == "ETA ~3:00"  # b and c again, at their own times
    eta.add(50, skipped=False)
    eta.add(100, skipped=False)
    assert eta.text() == "ETA 0:00"


def test_eta_takes_each_step_at_its_own_mean():
    """Two generations of a short and a long step: from the second on, a step left costs what the
    same step cost (the mean of all steps said 4 x 3:00 where 2 x 0:10 + 2 x 5:50 is left)."""
    gen = ["guard", "train"]
    eta = Eta(gen * 3)
    eta.add(10, skipped=False)
    eta.add(350, skipped=False)
    assert eta.text() == "ETA ~12:00"  # 10 + 350 + 10 + 350
    eta.add(10, skipped=False)
    assert eta.text() == "ETA ~11:50"
    from mass_jobs.pipeline.progress import estimate

    assert estimate(["train", "train"], {"train": [300.0, 400.0], "guard": [10.0]}) == 700
    assert estimate(["train", "merge"], {"train": [300.0, 400.0], "guard": [10.0]}) is None
    assert estimate(["train"], {}) is None and estimate([], {}) == 0


def test_status_eta_is_each_step_left_at_its_mean_less_the_running_steps_time():
    """`mass status`: a run whose every step left has run once; the running step counts what is
    left of its mean, and past its mean the ETA is a floor (it said ~0:00 before 9.6 more minutes)."""
    from mass_jobs.pipeline.runner import progress_summary

    rows = [{"gen": g, "step": s, "status": "done" if g == 0 else "pending"} for g in (0, 1) for s in ("a", "b")]
    rows[2]["status"] = "running"
    state = {
        "status": "running",
        "timings": {"0:a": {"seconds": 100.0}, "0:b": {"seconds": 300.0}},
        "current": {"gen": 1, "step": "a", "started_at": 1000.0},
    }
    early = progress_summary(rows, state, now=1040.0)
    assert (early["eta_s"], early["overrun"], early["untimed_left"]) == (360.0, False, 0)  # 60 of a + 300 of b
    late = progress_summary(rows, state, now=1500.0)
    assert (late["eta_s"], late["overrun"]) == (300.0, True)  # a is past its 100 s: b's 300 s at least
    unknown = progress_summary(rows + [{"gen": 1, "step": "c", "status": "pending"}], state, now=1040.0)
    assert unknown["eta_s"] is None and unknown["untimed_left"] == 1


def test_rollout_counter_is_per_generation_and_never_passes_its_total():
    """Evaluating L2 runs the rollouts of L2 and its baselines: 2 x 9 records against a total of 9
    each; one shared counter showed 18/9."""
    counts = PerKey()
    shown = [counts.add(("rollout", g)) for g in (2, 1) for _ in range(9)]
    assert max(shown) == 9 and shown[8] == 9 and shown[9] == 1


@pytest.mark.slow  # builds a model (4 warm-up steps)
def test_warm_build_prints_steps_and_loss(tmp_path, capsys):
    from mass_jobs.commands.cli import main

    assert main(["model", "tiny", "--out", str(tmp_path / "m"), "--warm", "--steps", "4", "--every", "2"]) == 0
    err = capsys.readouterr().err
    steps = re.findall(r"warm-up step (\d+)/4  loss ([0-9.]+)  elapsed \d+:\d\d  ETA (\d+:\d\d|unknown)", err)
    assert [int(s) for s, _, _ in steps] == [1, 2, 4]
    # the first step pays for the set-up: no rate from it; after it, a clock
    assert [eta == "unknown" for _, _, eta in steps] == [True, False, False]
    assert all(math.isfinite(float(loss)) and float(loss) > 0 for _, loss, _ in steps)
    assert (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.slow(cost=10)  # `mass run` end to end: the slow tier
def test_run_without_progress_prints_step_lines(tmp_path):
    """`mass run --no-progress` through the real runner: the first step's start and task lines come
    out before anything fails (an empty model dir: the server cannot start)."""
    import subprocess
    import sys

    import yaml

    (tmp_path / "empty").mkdir()
    doc = {
        "name": "p",
        "model": {"base": "empty"},
        "tasks": [{"id": "t", "split": "train", "prompt": "do it"}],
        "store": {"uri": "file://store"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "run", "spec.yaml", "--no-progress", "--work-dir", "w"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[:3] == [
        "start L0 search (step 1/19, ETA unknown: 19 steps left not timed yet)",  # 9 steps x 2 generations + the report
        "  L0 search: search task 1/1 t [0/1]",
        "run failed: model server exited with code 1 before it was healthy:",
    ]


def test_without_a_terminal_the_run_prints_plain_lines(tmp_path):
    """`make demo | tee log` or CI: the live display would show nothing until it stops; plain lines instead."""
    import io

    from mass_jobs.commands.run import live_display

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert live_display(False, Tty()) is True
    assert live_display(True, Tty()) is False  # --no-progress
    assert live_display(False, io.StringIO()) is False  # a pipe: plain lines
