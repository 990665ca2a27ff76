"""`mass run` end to end on the tiny model (tests/specs/ci-e2e.yaml), plus the runner's guards.

The slow test runs the chain twice: once uninterrupted, once killed (SIGKILL of the whole process
group) while training and rerun. Both must end with every step's manifest, a report whose win
shares recompute exactly from the stored verdicts, no test-task episode in any SFT window, and
the same report.json.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mass_jobs import metrics
from mass_jobs.context import RunContext
from mass_jobs.judges import load_verdicts
from mass_jobs.runner import SplitLeak, check_no_test_leak, step_status, train_tasks
from mass_jobs.spec import load_spec, validate_document
from mass_jobs.store import FileStore, read_manifest

SPEC = Path(__file__).parent / "specs" / "ci-e2e.yaml"


def small_ctx(tmp_path):
    doc = yaml.safe_load(SPEC.read_text())
    doc["store"]["uri"] = f"file://{tmp_path / 'store'}"
    spec = validate_document(doc)
    return RunContext(spec, FileStore(tmp_path / "store"))


def test_train_tasks_and_leak_check(tmp_path):
    ctx = small_ctx(tmp_path)
    assert [t.id for t in train_tasks(ctx.spec)] == ["fib", "primes"]
    window = {"task": "fib", "episode": 0, "role": "worker", "thread": 0, "index": 0, "input_ids": [1], "labels": [1],
              "n_supervised": 1}
    ctx.store.put_bytes("ci-e2e/gen-0/sft/train.jsonl", (json.dumps(window) + "\n").encode())
    assert check_no_test_leak(ctx, 0) == {"windows_checked": 1, "test_tasks": ["sort"]}
    ctx.store.put_bytes("ci-e2e/gen-0/sft/val.jsonl", (json.dumps({**window, "task": "sort"}) + "\n").encode())
    with pytest.raises(SplitLeak, match="val.jsonl line 1: task 'sort'"):
        check_no_test_leak(ctx, 0)
    ctx.store.delete("ci-e2e/gen-0/sft/val.jsonl")
    ctx.store.put_json("ci-e2e/gen-0/rank/sort.json", {"task": "sort"})
    with pytest.raises(SplitLeak, match="rank/sort.json"):
        check_no_test_leak(ctx, 0)


def test_status_from_manifests_and_run_state(tmp_path):
    ctx = small_ctx(tmp_path)
    s = ctx.store
    for t in ("fib", "primes"):
        s.put_json(ctx.search_state(0, t), {"done": True})
        s.put_json(ctx.collect_summary(0, t), {})
    s.put_json(ctx.guard(0, "fib"), {})
    s.put_json("ci-e2e/run-state.json", {"status": "running", "current": {"gen": 0, "step": "guard"},
                                         "pid": os.getpid()})
    rows = {(r["gen"], r["step"]): r for r in step_status(ctx)}
    assert rows[(0, "search")]["status"] == "done" and rows[(0, "collect")]["detail"] == "2/2 tasks"
    assert rows[(0, "guard")]["status"] == "running" and rows[(0, "guard")]["detail"] == "1/2 tasks"
    assert rows[(0, "rank")]["status"] == "pending" and rows[(2, "report")]["status"] == "pending"
    s.put_json("ci-e2e/run-state.json", {"status": "running", "current": {"gen": 0, "step": "guard"}, "pid": -1})
    assert {(r["gen"], r["step"]): r for r in step_status(ctx)}[(0, "guard")]["status"] == "interrupted"
    s.put_json("ci-e2e/run-state.json", {"status": "failed", "failed": {"gen": 0, "step": "rank", "error": "x"}})
    assert {(r["gen"], r["step"]): r for r in step_status(ctx)}[(0, "rank")]["status"] == "failed"


# ---------------------------------------------------------------- the end-to-end run


def write_spec(tmp_path, tiny_model_dir, name) -> Path:
    doc = yaml.safe_load(SPEC.read_text())
    doc["model"]["base"] = str(tiny_model_dir)
    doc["judges"][0]["model"] = str(tiny_model_dir)
    doc["store"]["uri"] = f"file://{tmp_path / name / 'store'}"
    path = tmp_path / name / "spec.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def mass_run(spec: Path, work: Path, kill_when=None) -> int:
    cmd = [sys.executable, "-m", "mass_jobs.cli", "run", str(spec), "--work-dir", str(work), "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        if kill_when and kill_when():
            os.killpg(proc.pid, signal.SIGKILL)  # the runner, its servers and torchrun: a hard crash
            proc.wait()
            return -9
        time.sleep(0.5)
    out = proc.stdout.read().decode()
    assert proc.returncode == 0, out[-4000:]
    return 0


def check_run(spec_path: Path) -> dict:
    spec = load_spec(spec_path)
    store = FileStore(spec.store.uri[len("file://"):])
    ctx = RunContext(spec, store)
    # every step's manifest
    for g in range(spec.generations):
        for t in ("fib", "primes"):
            assert read_manifest(store, ctx.search_iter(g, t, spec.search.iterations)) is not None
        for prefix in (ctx.sft(g), ctx.train(g), ctx.eval(g + 1)):
            assert read_manifest(store, prefix) is not None, prefix
        assert store.exists(ctx.select(g)) and store.exists(ctx.model(g + 1))
        assert check_no_test_leak(ctx, g)["windows_checked"] > 0
        for split in ("train", "val"):
            tasks = {json.loads(x)["task"] for x in store.get_bytes(f"{ctx.sft(g)}/{split}.jsonl").decode().splitlines()}
            assert "sort" not in tasks
    assert read_manifest(store, ctx.report()) is not None
    assert all(r["status"] == "done" for r in step_status(ctx))
    report = store.get_json(f"{ctx.report()}/report.json")
    # win shares recompute exactly from the stored verdicts
    panel = [v for v in load_verdicts(store, f"{ctx.run}/eval/verdicts") if v["kind"] == "panel"]
    assert len(panel) == report["verdicts"]["panel"]["total"] > 0
    for row in report["win_share"]:
        ids = [t.id for t in spec.resolved_tasks() if row["split"] in ("all", t.split)]
        vs = [v for v in panel if (v["candidate"], v["baseline"]) == (row["candidate"], row["baseline"])]
        total = metrics.compare(vs, ids).overall
        assert (row["wins"], row["losses"], row["ties"], row["invalid"]) == (total.wins, total.losses, total.ties,
                                                                          total.invalid)
        assert row["win_share"] == metrics.win_share(total.wins, total.losses)
    assert {(r["candidate"], r["baseline"]) for r in report["win_share"]} == {(1, 0), (2, 0), (2, 1)}
    return report


@pytest.mark.slow
def test_e2e_run_killed_during_training_resumes_to_the_same_report(tmp_path, tiny_model_dir):
    a = write_spec(tmp_path, tiny_model_dir, "a")
    mass_run(a, tmp_path / "a" / "work")
    report_a = check_run(a)

    b = write_spec(tmp_path, tiny_model_dir, "b")
    train_log = tmp_path / "b" / "work" / "ci-e2e" / "train"
    killed = mass_run(b, tmp_path / "b" / "work",
                      kill_when=lambda: any(train_log.glob("**/step-*")) if train_log.exists() else False)
    assert killed == -9
    mass_run(b, tmp_path / "b" / "work")
    report_b = check_run(b)
    assert report_b == report_a
