"""A run that fails part-way: the runner's failure record, `mass status` and its ETA.

One step is broken on purpose in a real `mass run` subprocess (its core replaced by one that raises
before the CLI starts, as a corrupt input would make it raise): the steps before it run for real on
the tiny model and are timed, the broken one is recorded as failed with its error and where its
logs are, and `mass status` (table and --json) shows all of that from the store and run-state.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mass_jobs.pipeline.runner import progress_summary

SPEC = Path(__file__).parent / "specs" / "ci-e2e.yaml"

BREAK_GUARD = """
import sys
import mass_jobs.steps.guard as guard

def broken(ctx, gen, task):
    raise ValueError(f"corrupt collection summary for task {task} (broken on purpose)")

guard.run_guard = broken
from mass_jobs.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def mass(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    head = ["-c", code] if code else ["-m", "mass_jobs.commands.cli"]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, timeout=300)


def test_progress_summary_counts_done_and_estimates_from_the_runs_own_timings():
    rows = [
        {"status": s, "step": n}
        for s, n in (("done", "a"), ("done", "b"), ("done", "c"), ("running", "a"), ("pending", "b"), ("pending", "d"))
    ]
    state = {
        "status": "running",
        "current": {"step": "a", "started_at": 1000.0},
        "timings": {
            "0:a": {"seconds": 10.0, "skipped": False},
            "0:b": {"seconds": 30.0, "skipped": False},
            "0:c": {"seconds": 0.1, "skipped": True},
        },
    }
    # d has never run: no guess from the others
    assert progress_summary(rows, state, now=1005.0) == {
        "done": 3,
        "total": 6,
        "eta_s": None,
        "timed_steps": 2,
        "untimed_left": 1,
        "overrun": False,
    }
    # without d: a at its 10 s less the 5 s it has had, b at its 30 s
    assert progress_summary(rows[:5], state, now=1005.0)["eta_s"] == 35.0
    assert progress_summary(rows, {"status": "failed", "timings": {}})["eta_s"] is None  # nothing timed yet
    assert progress_summary([{"status": "done"}], {})["eta_s"] == 0.0


@pytest.mark.slow
def test_a_step_broken_on_purpose_is_recorded_with_its_error_and_logs(tmp_path, tiny_model_dir):
    doc = yaml.safe_load(SPEC.read_text())
    doc["model"]["base"] = doc["judges"][0]["model"] = str(tiny_model_dir)
    doc["store"]["uri"] = f"file://{tmp_path / 'store'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    work = tmp_path / "work"

    started = time.time()
    proc = mass("run", str(spec), "--work-dir", str(work), "--no-progress", code=BREAK_GUARD)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "run failed: corrupt collection summary for task fib (broken on purpose)" in proc.stderr
    assert f"mass status {spec}" in proc.stderr
    # the live display: each finished step with done/total and an ETA from this run's timings
    assert "done L0 search" in proc.stderr and "1/19 steps" in proc.stderr
    assert "ETA unknown: 17 steps left not timed yet" in proc.stderr  # all but L1 search, timed by L0 search

    status = mass("status", str(spec), "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    rows = {(r["gen"], r["step"]): r for r in doc["steps"]}
    assert len(rows) == 19  # 9 steps x 2 generations + the report
    assert [rows[(0, s)]["status"] for s in ("search", "collect", "guard", "rank")] == [
        "done",
        "done",
        "failed",
        "pending",
    ]
    assert all(rows[(0, s)]["seconds"] > 0 for s in ("search", "collect"))
    assert rows[(0, "guard")]["seconds"] is None
    failed = doc["failed"]
    assert (failed["gen"], failed["step"]) == (0, "guard")
    assert failed["error"] == "ValueError: corrupt collection summary for task fib (broken on purpose)"
    assert started <= failed["at"] <= time.time()
    # an in-process step: the generation's model-server log and the run's work dir
    [scratch] = work.glob("ci-e2e-*")  # the run's scratch: <name>-<digest of store and spec>
    assert failed["logs"] == [str(scratch / "serve-gen-0.log"), str(scratch)]
    assert all(Path(p).exists() for p in failed["logs"])
    assert doc["progress"]["done"] == 2 and doc["progress"]["total"] == 19
    # 17 steps left, of which L1's search and collect have a time of their own: still unknown
    assert doc["progress"]["eta_s"] is None and doc["progress"]["untimed_left"] == 15

    table = mass("status", str(spec))
    assert table.returncode == 0, table.stderr[-3000:]
    out = table.stdout
    assert "2/19 steps done; ETA unknown (15 of the steps left have not run in this run yet)" in out
    assert "failed: L0 guard: ValueError: corrupt collection summary for task fib (broken on purpose)" in out
    assert f"logs: {scratch / 'serve-gen-0.log'}" in out
    guard_line = next(line for line in out.splitlines() if " guard " in line)
    assert "3/19" in guard_line and "failed" in guard_line


def test_ctrl_c_in_a_step_reads_interrupted_not_failed(make_store, inner_spec, tmp_path):
    """Ctrl-C (KeyboardInterrupt) stops a step without anything in it failing: the run-state and
    `mass status` say interrupted, as after a kill, and keep no failure record."""
    from mass_jobs.pipeline.runner import Runner, step_status

    store = make_store("file")
    runner = Runner("spec.yaml", inner_spec(store, generations=1), store, work_dir=tmp_path, progress=False)

    def stopped_by_ctrl_c() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner._run_step(0, "guard", stopped_by_ctrl_c)
    state = store.get_json(runner.ctx.run_state())
    assert state["status"] == "interrupted" and state["failed"] is None
    rows = {(r["gen"], r["step"]): r["status"] for r in step_status(runner.ctx)}
    assert rows[(0, "guard")] == "interrupted"
    assert list(rows.values()).count("interrupted") == 1
