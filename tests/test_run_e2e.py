"""`mass run` end to end on the tiny model (tests/specs/ci-e2e.yaml), plus the runner's guards.

The slow test runs the chain twice: once uninterrupted, once killed (SIGKILL of the whole process
group) as soon as training has stored its first checkpoint, and rerun. Both must end with every
step's manifest, the merged models as plain objects, a report whose win shares recompute exactly
from the stored verdicts, no test-task episode in any SFT window, and the same report.json and
training losses: sampling is seeded and the tiny model runs on CPU in float32, so generation is
deterministic across processes, and training resumes exactly from its checkpoint.

The panel has the tiny model (it answers garbage: no parsable verdict), a judge whose endpoint
refuses connections (both must end as invalid verdicts in the report, never as a crash), and a
test-fixture judge (`HashVerdictJudge`, a ScriptedEndpoint, no model) that answers valid verdicts
mixing A, B and tie by a hash of each request. The random model never gives a valid verdict, so
without the fixture judge the recount would only recount invalid verdicts; with it, wins, losses,
ties and invalid verdicts per comparison, per task and overall are recounted from the stored verdict
files alone (not the report's code) and must equal the report's numbers exactly.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.validate import done_outputs
from mass_jobs.pipeline.runner import SplitLeak, check_no_test_leak, step_status, train_tasks
from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import load_spec, validate_document
from mass_jobs.store import FileStore, read_manifest, verify_manifest
from mass_jobs.tools.testing.scripted_judges import HashVerdictJudge

SPEC = Path(__file__).parent / "specs" / "ci-e2e.yaml"


def small_ctx(tmp_path):
    doc = yaml.safe_load(SPEC.read_text())
    doc["store"]["uri"] = f"file://{tmp_path / 'store'}"
    spec = validate_document(doc)
    return RunContext(spec, FileStore(tmp_path / "store"))


def test_train_tasks_and_leak_check(tmp_path):
    ctx = small_ctx(tmp_path)
    assert [t.id for t in train_tasks(ctx.spec)] == ["fib", "primes"]
    window = {
        "task": "fib",
        "episode": 0,
        "role": "worker",
        "thread": 0,
        "index": 0,
        "input_ids": [1],
        "labels": [1],
        "n_supervised": 1,
    }
    ctx.store.put_bytes("ci-e2e/gen-0/sft/train.jsonl", (json.dumps(window) + "\n").encode())
    assert check_no_test_leak(ctx, 0) == {"windows_checked": 1, "test_tasks": ["sort"]}
    ctx.store.put_bytes("ci-e2e/gen-0/sft/val.jsonl", (json.dumps({**window, "task": "sort"}) + "\n").encode())
    with pytest.raises(SplitLeak, match="val.jsonl line 1: task 'sort'"):
        check_no_test_leak(ctx, 0)
    ctx.store.delete("ci-e2e/gen-0/sft/val.jsonl")
    ctx.store.put_json("ci-e2e/gen-0/rank/sort.json", {"task": "sort"})
    with pytest.raises(SplitLeak, match="rank/sort.json"):
        check_no_test_leak(ctx, 0)


def test_status_overlays_the_run_state_on_the_store(tmp_path):
    """Done / pending come from the steps' own done-checks (tests/test_pipeline.py); the runner's
    run-state adds running, interrupted (runner gone) and failed. Objects that merely exist (no
    manifest of the right inputs) count for nothing."""
    ctx = small_ctx(tmp_path)
    s = ctx.store
    for t in ("fib", "primes"):
        s.put_json(ctx.search_state(0, t), {"done": True})
        s.put_json(ctx.collect_summary(0, t), {})
    s.put_json(ctx.guard(0, "fib"), {})
    s.put_json(ctx.run_state(), {"status": "running", "current": {"gen": 0, "step": "guard"}, "pid": os.getpid()})
    rows = {(r["gen"], r["step"]): r for r in step_status(ctx)}
    assert rows[(0, "search")]["status"] == "pending" and rows[(0, "collect")]["detail"] == "0/2 tasks"
    assert rows[(0, "guard")]["status"] == "running" and rows[(0, "guard")]["detail"] == "0/2 tasks"
    assert rows[(0, "rank")]["status"] == "pending" and rows[(2, "report")]["status"] == "pending"
    s.put_json(ctx.run_state(), {"status": "running", "current": {"gen": 0, "step": "guard"}, "pid": -1})
    assert {(r["gen"], r["step"]): r for r in step_status(ctx)}[(0, "guard")]["status"] == "interrupted"
    # Ctrl-C: the runner records the step interrupted itself (its pid is still alive while it exits)
    s.put_json(ctx.run_state(), {"status": "interrupted", "current": {"gen": 0, "step": "guard"}, "pid": os.getpid()})
    assert {(r["gen"], r["step"]): r for r in step_status(ctx)}[(0, "guard")]["status"] == "interrupted"
    s.put_json(ctx.run_state(), {"status": "failed", "failed": {"gen": 0, "step": "rank", "error": "x"}})
    assert {(r["gen"], r["step"]): r for r in step_status(ctx)}[(0, "rank")]["status"] == "failed"


# ---------------------------------------------------------------- the end-to-end run

TRAIN, TEST = ("fib", "primes"), ("sort",)


def closed_port() -> int:
    """A loopback port nothing listens on: the failing judge's endpoint."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Four seeds: each pair is shown twice in each order, and enough independent draws that a change of
# the rollouts (hence of the hashed requests) still leaves wins, losses and ties to count.
# The hash judge answers a question by its digest: a random model leaves the same workspaces in
# every generation, so the three comparisons share their questions, and 4 seeds gave 12 distinct
# answers, none of them a tie in 0.8% of workspace draws; 8 seeds make that 0.006%.
SCRIPTED_SEEDS = [1, 2, 3, 4, 5, 6, 7, 8]


def write_spec(tmp_path, tiny_model_dir, name, dead_port, scripted_url) -> Path:
    doc = yaml.safe_load(SPEC.read_text())
    doc["model"]["base"] = str(tiny_model_dir)
    doc["judges"][0]["model"] = str(tiny_model_dir)
    doc["judges"].append(
        {"name": "dead-judge", "endpoint": f"http://127.0.0.1:{dead_port}/v1", "model": "none", "seeds": [7]}
    )
    doc["judges"].append(
        {"name": "scripted-judge", "endpoint": scripted_url, "model": "hash-judge", "seeds": SCRIPTED_SEEDS}
    )
    doc["store"]["uri"] = f"file://{tmp_path / name / 'store'}"
    path = tmp_path / name / "spec.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def open_run(spec_path: Path) -> RunContext:
    spec = load_spec(spec_path)
    return RunContext(spec, FileStore(spec.store.uri[len("file://") :]))


def mass(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", *args], capture_output=True, text=True, timeout=120
    )


def status_rows(spec_path: Path) -> dict:
    proc = mass("status", str(spec_path), "--json")
    assert proc.returncode == 0, proc.stderr
    return {(r["gen"], r["step"]): r["status"] for r in json.loads(proc.stdout)["steps"]}


def freeze(pid: int, sig: int) -> None:
    """Signal the run's whole process tree (SIGSTOP, SIGCONT, SIGKILL): torchrun starts its workers
    in sessions of their own, out of reach of the run's process group."""
    from mass_jobs.sandbox.tree import tree_pids

    for p in tree_pids(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def mass_run(spec: Path, work: Path, kill_when=None, before_kill=None, slice_when=None, handler="in-process") -> str:
    """Run `mass run` to the end (returns its output), or freeze and SIGKILL its process group once
    kill_when(). From slice_when() on, the run only advances in short slices between frozen looks,
    so a moment kill_when() waits for (a checkpoint) cannot slip by between two polls."""
    cmd = [
        sys.executable,
        "-m",
        "mass_jobs.commands.cli",
        "run",
        str(spec),
        "--work-dir",
        str(work),
        "--no-progress",
        "--handler",
        handler,
    ]
    with open(work.parent / "run.out", "w+b") as out:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
        slicing = False
        while proc.poll() is None:
            if kill_when:
                slicing = slicing or bool(slice_when and slice_when())
                if slicing:
                    freeze(proc.pid, signal.SIGSTOP)
                if kill_when():
                    # frozen first, so the step seen running cannot finish while before_kill looks at it
                    freeze(proc.pid, signal.SIGSTOP)
                    if before_kill:
                        before_kill()
                    freeze(proc.pid, signal.SIGKILL)  # the runner, its servers and torchrun's workers: a hard crash
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return "killed"
                if slicing:
                    freeze(proc.pid, signal.SIGCONT)
            time.sleep(0.02 if slicing else 0.2)
        out.seek(0)
        text = out.read().decode()
    assert proc.returncode == 0, text[-4000:]
    return text


def train_losses(ctx: RunContext, g: int) -> list[tuple]:
    log = [json.loads(x) for x in ctx.store.get_bytes(f"{ctx.train(g)}/log.jsonl").decode().splitlines()]
    return [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in log]


COUNTED = ("wins", "losses", "ties", "invalid", "win_share")


def stored_panel_verdicts(ctx: RunContext) -> list[dict]:
    """The panel's verdict records read straight from the store's files (no judges/metrics/report code)."""
    root = ctx.store.root / ctx.run / "eval" / "verdicts"
    records = [json.loads(p.read_text()) for p in sorted(root.rglob("*.json")) if not p.name.startswith("_")]
    return [r for r in records if r["kind"] == "panel"]


def candidate_outcome(v: dict) -> str:
    """The candidate's side of one verdict from its blind label and the order the pair was shown in."""
    if not v["valid"]:
        return "invalid"
    if v["winner"] == "tie":
        return "tie"
    candidate_label = {"candidate_first": "A", "baseline_first": "B"}[v["order"]]
    return "win" if v["winner"] == candidate_label else "loss"


def counted(verdicts: list[dict]) -> dict:
    """Counts and win share = wins / (wins + losses): ties and invalid verdicts excluded, None if none decisive."""
    c = Counter(candidate_outcome(v) for v in verdicts)
    decisive = c["win"] + c["loss"]
    return {
        "wins": c["win"],
        "losses": c["loss"],
        "ties": c["tie"],
        "invalid": c["invalid"],
        "win_share": c["win"] / decisive if decisive else None,
    }


def check_interval(block: dict) -> None:
    """The interval is there, inside [0, 1] and around the point estimate; null only without decisive verdicts."""
    assert "ci" in block, block
    if block["win_share"] is None:
        assert block["ci"] is None, block
        return
    lo, hi = block["ci"]
    assert 0.0 <= lo <= block["win_share"] <= hi <= 1.0, block


def check_run(spec_path: Path, scripted_answers: list[str]) -> dict:
    ctx = open_run(spec_path)
    spec, store = ctx.spec, ctx.store
    assert [t.id for t in train_tasks(spec)] == list(TRAIN)
    for g in range(spec.generations):
        # every step's manifest, verified against its outputs' hashes
        prefixes = [ctx.search_iter(g, t, k) for t in TRAIN for k in range(spec.search.iterations + 1)]
        prefixes += [ctx.collect(g, t) for t in TRAIN]
        prefixes += [f"{ctx.gen(g)}/{step}/{t}" for step in ("guard", "rank") for t in TRAIN]
        prefixes += [ctx.sft(g), ctx.train(g), f"{ctx.gen(g)}/select", f"{ctx.gen(g)}/merge", ctx.eval(g + 1)]
        for prefix in prefixes:
            assert read_manifest(store, prefix) is not None, prefix
            verify_manifest(store, prefix)
        # test tasks only in evaluation
        for t in TEST:
            assert not store.list(f"{ctx.gen(g)}/search/{t}") and not store.list(ctx.collect(g, t))
            assert not store.exists(ctx.rank(g, t)) and not store.exists(ctx.guard(g, t))
        windows = {
            split: [json.loads(x) for x in store.get_bytes(f"{ctx.sft(g)}/{split}.jsonl").decode().splitlines()]
            for split in ("train", "val")
        }
        assert check_no_test_leak(ctx, g)["windows_checked"] == len(windows["train"]) + len(windows["val"]) > 0
        for split, ws in windows.items():
            ranked = {
                (t, int(e.removeprefix("ep-")))
                for t in TRAIN
                for e in (
                    [store.get_json(ctx.rank(g, t))["val"]]
                    if split == "val"
                    else store.get_json(ctx.rank(g, t))["train"]
                )
            }
            assert {(w["task"], w["episode"]) for w in ws} <= ranked
            assert not {w["task"] for w in ws} & set(TEST)
        sft_extra = read_manifest(store, ctx.sft(g))["extra"]
        assert sft_extra["stored_supervised_tokens"] == sum(w["n_supervised"] for w in windows["train"]) > 0
        # L_{g+1}: plain model objects, not an archive
        names = {k.removeprefix(ctx.model(g + 1) + "/") for k in store.list(ctx.model(g + 1) + "/")}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
        assert not store.exists(ctx.model(g + 1))
        selected = store.get_json(ctx.select(g))
        assert selected["step"] in read_manifest(store, ctx.train(g))["extra"]["checkpoints"]
    assert read_manifest(store, ctx.report()) is not None
    assert all(r["status"] == "done" for r in step_status(ctx))
    report = store.get_json(f"{ctx.report()}/report.json")

    # the report's win shares recompute exactly from the stored verdict files
    panel = stored_panel_verdicts(ctx)
    pairs = {(1, 0), (2, 0), (2, 1)}
    n_tasks, seeds = len(TRAIN) + len(TEST), sum(len(j.seeds) for j in spec.judges)
    assert len(panel) == report["verdicts"]["panel"]["total"] == len(pairs) * n_tasks * seeds == 99
    assert report["verdicts"]["panel"]["invalid"] == sum(not v["valid"] for v in panel)
    assert {(r["candidate"], r["baseline"]) for r in report["win_share"]} == pairs
    assert len(report["win_share"]) == len(pairs) * 3  # train, test, all
    for row in report["win_share"]:
        ids = [t.id for t in spec.resolved_tasks() if row["split"] in ("all", t.split)]
        vs = [
            v
            for v in panel
            if (v["candidate"], v["baseline"]) == (row["candidate"], row["baseline"]) and v["task"] in ids
        ]
        assert {k: row[k] for k in COUNTED} == counted(vs), row
        assert sum(counted(vs)[k] for k in ("wins", "losses", "ties", "invalid")) == len(ids) * seeds
        check_interval(row)
        assert sorted(row["per_task"]) == sorted(ids)
        for task in ids:
            assert {k: row["per_task"][task][k] for k in COUNTED} == counted([v for v in vs if v["task"] == task])
            check_interval(row["per_task"][task])
    overall = {pair: counted([v for v in panel if (v["candidate"], v["baseline"]) == pair]) for pair in pairs}
    # valid verdicts really reach the arithmetic: a comparison with wins AND losses, and ties to exclude
    assert any(c["wins"] and c["losses"] for c in overall.values()), f"no comparison with wins and losses: {overall}"
    assert sum(c["ties"] for c in overall.values()) > 0, f"no tie to exclude: {overall}"
    # the fixture judge: every verdict valid, the stored blind labels are exactly what it answered
    scripted = [v for v in panel if v["judge"] == "scripted-judge"]
    assert len(scripted) == len(pairs) * n_tasks * len(SCRIPTED_SEEDS) and all(v["valid"] for v in scripted)
    assert Counter(v["winner"] for v in scripted) == Counter(scripted_answers)
    # the garbage-answering tiny judge: every verdict invalid after unreadable replies
    garbage = [v for v in panel if v["judge"] == "tiny-judge"]
    assert len(garbage) == len(pairs) * n_tasks * 2 and not any(v["valid"] for v in garbage)
    assert all(v["errors"] and v["winner"] is None for v in garbage), garbage[0]
    # the failing judge: every one of its verdicts is invalid with a connection error, listed in the report
    dead = [v for v in panel if v["judge"] == "dead-judge"]
    assert len(dead) == len(pairs) * n_tasks and not any(v["valid"] for v in dead)
    assert all("connection" in " ".join(v["errors"]).lower() for v in dead), dead[0]["errors"]
    assert len(report["invalid_verdicts"]) == report["verdicts"]["panel"]["invalid"] == len(garbage) + len(dead)
    print(
        "panel recount per comparison (all tasks):",
        json.dumps({f"L{c} vs L{b}": x for (c, b), x in sorted(overall.items())}),
    )
    return report


@pytest.fixture
def hash_judge():
    """The fixture judge, up before `mass run` and alive through the kill and the rerun."""
    with HashVerdictJudge() as judge:
        yield judge


@pytest.mark.slow(cost=250)
def test_e2e_run_killed_during_training_resumes_to_the_same_report(tmp_path, tiny_model_dir, hash_judge):
    """Run a in-process; run b, the same spec from a's L0 before training, killed during training and
    resumed under the argv handler (every node as the cluster runs it: prepare, one `mass episode` per rollout given only its
    artifacts, ingest, finish), so generation 1 runs every step that way: both store the same run,
    manifest by manifest."""
    dead_port = closed_port()
    a = write_spec(tmp_path, tiny_model_dir, "a", dead_port, hash_judge.base_url)
    out = mass_run(a, tmp_path / "a" / "work")
    report_dir = a.parent / "store" / "ci-e2e" / "report"
    assert f"report: {report_dir}/report.md" in out
    # the figures follow, each a path the terminal opens with what it shows, the win share in numbers
    assert f"  {report_dir}/win_share.png  the panel's win share per generation" in out
    assert all(f"  {report_dir}/{name}  " in out for name in ("search.png", "loss.png", "audit.png"))
    assert "  win share: L1 vs L0 " in out
    answers_a = list(hash_judge.answers)
    foreign = [r for r in hash_judge.requests if r["headers"].get("x-mass-role") != "evaluator"]
    assert hash_judge.requests and not foreign, json.dumps(foreign[:2])[:3000]
    report_a = check_run(a, answers_a)
    # what `mass plan` said before the run is what the run stored (exact counts; bounds not exceeded)
    from mass_jobs.pipeline.planning.counts import compare, plan_counts, stored_counts

    ctx_plan = open_run(a)
    for planned in plan_counts(ctx_plan.spec):
        assert compare(planned, stored_counts(ctx_plan, planned["gen"])) == [], planned["gen"]
    assert set(status_rows(a).values()) == {"done"}
    # the same table from the store alone, as after an Argo run (no runner, no run-state)
    ctx_a = open_run(a)
    # the inner loop called L_g by the InferenceService's name: traces agree across executors
    for g in range(ctx_a.spec.generations):
        lines = ctx_a.store.get_bytes(f"{ctx_a.search_iter(g, 'fib', 0)}/trace.jsonl").decode().splitlines()
        assert {json.loads(x)["request"]["model"] for x in lines if x.strip()} == {f"mass-ci-e2e-g{g}"}
    ctx_a.store.delete(ctx_a.run_state())
    assert set(status_rows(a).values()) == {"done"}
    # and what `mass validate --outputs` tells the templates: nothing to start, no GPU, no model server
    for g in range(ctx_a.spec.generations + 1):
        flags = done_outputs(ctx_a, g)
        assert flags["needs-model"] == "false" and flags["run-done"] == "true", (g, flags)
        assert all(v == "true" for k, v in flags.items() if k.startswith("done-")), (g, flags)

    b = write_spec(tmp_path, tiny_model_dir, "b", dead_port, hash_judge.base_url)
    ctx_b = open_run(b)
    # b starts from a's L0 as it stood before training: what precedes it is compared across executors
    # by the two-generation executor test and paper-mini, and computing it twice here cost this, the
    # slow tier's longest test, a seventh of its time (341 -> 292 s alone on 2 cores)
    for step in ("search", "collect", "guard", "guard-checks", "rank", "sft"):
        src = ctx_a.store.root / ctx_a.gen(0) / step
        if src.exists():
            shutil.copytree(src, ctx_b.store.root / ctx_b.gen(0) / step)
    seen = {}

    def first_checkpoint() -> bool:  # polled in the store, as an operator would
        return bool(ctx_b.store.list(f"{ctx_b.train(0)}/step-"))

    def training() -> bool:  # the run-state names the step in progress
        try:
            state = ctx_b.store.get_json(ctx_b.run_state())
        except (LookupError, ValueError):  # not written yet (MissingKey), or mid-write
            return False
        return (state.get("current") or {}).get("step") == "train"

    def note_status() -> None:
        seen.update(status_rows(b))

    assert (
        mass_run(b, tmp_path / "b" / "work", kill_when=first_checkpoint, before_kill=note_status, slice_when=training)
        == "killed"
    )
    assert seen[(0, "train")] == "running"
    killed = status_rows(b)
    assert killed[(0, "train")] == "interrupted"
    assert all(killed[(0, s)] == "done" for s in ("search", "collect", "guard", "rank", "render"))
    assert all(v == "pending" for (g, s), v in killed.items() if g > 0 or s in ("select", "merge", "evaluate"))
    assert read_manifest(ctx_b.store, ctx_b.train(0)) is None  # killed before training finished
    stored_ckpts = {k: (ctx_b.store.root / k).stat().st_mtime_ns for k in ctx_b.store.list(f"{ctx_b.train(0)}/step-")}
    assert len(hash_judge.answers) == len(answers_a)  # no verdict is asked before evaluation

    mass_run(b, tmp_path / "b" / "work", handler="argv")
    # the argv handler ran agent episodes as their own processes, from their artifacts alone
    assert list((tmp_path / "b" / "work").glob("*/agent-episode.log"))
    assert not list((tmp_path / "a" / "work").glob("*/agent-episode.log"))
    # training resumed from its checkpoint: what was stored before the kill was never rewritten
    assert {k: (ctx_b.store.root / k).stat().st_mtime_ns for k in stored_ckpts} == stored_ckpts
    answers_b = hash_judge.answers[len(answers_a) :]
    assert answers_b == answers_a  # same comparisons, same requests, same answers
    report_b = check_run(b, answers_b)
    ctx_a = open_run(a)
    for g in range(ctx_a.spec.generations):
        assert train_losses(ctx_b, g) == train_losses(ctx_a, g)
    assert report_b == report_a
    assert set(status_rows(b).values()) == {"done"}
    # every step's manifest alike: input hash, and each output's content (wall-clock fields aside); the
    # report's input (the other manifests, wall-clock fields included) differs, its report.json not
    from tests.fixtures.argo_cluster import manifests, timeless

    got, want = manifests(ctx_b.store, "ci-e2e"), manifests(ctx_a.store, "ci-e2e")
    assert sorted(got) == sorted(want) and len(want) >= 40
    differ = [p for p in want if got[p]["input_hash"] != want[p]["input_hash"] and p != "ci-e2e/report"]
    differ += [
        k
        for p in want
        for k, d in want[p]["outputs"].items()
        if got[p]["outputs"].get(k) != d and timeless(ctx_b.store, k) != timeless(ctx_a.store, k)
    ]
    assert not differ, differ

    # A damaged (not missing) evaluation rollout: its steps read pending, and `mass run` redoes them.
    from mass_jobs.steps.evaluate import rollout_prefix

    task = next(t.id for t in ctx_a.spec.resolved_tasks() if t.split == "test")
    torn = f"{rollout_prefix(ctx_a, 1, task, 0)}/status.json"
    ctx_a.store.put_bytes(torn, ctx_a.store.get_bytes(torn) + b'{"torn": true}\n')
    rows = status_rows(a)
    assert rows[(0, "evaluate")] == "pending"
    assert all(v == "done" for (g, step), v in rows.items() if g == 0 and step != "evaluate" and step != "report")
    mass_run(a, tmp_path / "a" / "work")
    assert "torn" not in ctx_a.store.get_json(torn)
    verify_manifest(ctx_a.store, rollout_prefix(ctx_a, 1, task, 0))
    assert set(status_rows(a).values()) == {"done"}
    assert check_run(a, answers_a) == report_a


@pytest.mark.slow(cost=12)  # `mass run` end to end: the slow tier
def test_failed_run_is_reported_by_status(tmp_path):
    """A run whose base model cannot load fails at L0 search with exit 1; status names the step."""
    doc = yaml.safe_load(SPEC.read_text())
    (tmp_path / "empty-model").mkdir()
    doc["model"]["base"] = str(tmp_path / "empty-model")
    doc["store"]["uri"] = f"file://{tmp_path / 'store'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    proc = mass("run", str(spec), "--work-dir", str(tmp_path / "work"), "--no-progress")
    assert proc.returncode == 1 and "run failed" in proc.stderr
    rows = status_rows(spec)
    assert rows[(0, "search")] == "failed" and rows[(0, "collect")] == "pending"
    text = mass("status", str(spec))
    assert text.returncode == 0 and "failed: L0 search" in text.stdout


def test_the_train_core_refuses_a_test_tasks_windows_on_any_executor(tmp_path):
    """The PyTorchJob runs `mass train` itself, without the local runner: the core checks the split
    before it fetches a model or trains, and the step stays not done."""
    from mass_jobs.steps.train import run_train, train_step

    ctx = small_ctx(tmp_path)
    window = {
        "task": "sort",
        "episode": 0,
        "role": "worker",
        "thread": 0,
        "index": 0,
        "input_ids": [1],
        "labels": [1],
        "n_supervised": 1,
    }
    ctx.store.put_bytes("ci-e2e/gen-0/sft/train.jsonl", (json.dumps(window) + "\n").encode())
    from mass_jobs.store import Step

    Step(ctx.store, ctx.sft(0), {"rendered": 1}).finish(["ci-e2e/gen-0/sft/train.jsonl"])  # a render that leaked
    with pytest.raises(SplitLeak, match="train.jsonl line 1: task 'sort'"):
        run_train(ctx, 0, tmp_path / "work", progress=False)
    assert not train_step(ctx, 0, 1).done and not (tmp_path / "work" / "train").exists()


def test_status_validate_and_run_agree_on_a_changed_spec(tmp_path, tiny_model_dir):
    """One decision (`RunContext.spec_differences`): a field changed after the run started is named
    by all three commands with exit 2; status shows the stored run's steps, not a mix of two specs."""
    from mass_jobs.commands.cli import main

    doc = yaml.safe_load(SPEC.read_text())
    doc["model"]["base"] = doc["judges"][0]["model"] = str(tiny_model_dir)
    doc["store"]["uri"] = f"file://{tmp_path / 'store'}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    ctx = open_run(spec)
    ctx.claim_spec()  # the run has started with this spec
    for t in ("fib", "primes"):  # and its search is stored
        ctx.store.put_json(ctx.search_state(0, t), {"done": True})
    assert main(["validate", str(spec), "--quiet"]) == 0
    before = mass("status", str(spec), "--json")
    assert before.returncode == 0 and json.loads(before.stdout)["spec_changes"] == []

    doc["sft"]["steps"] = 6
    spec.write_text(yaml.safe_dump(doc))
    field = "$.sft.steps: stored run has 4, this spec has 6"
    proc = mass("validate", str(spec))
    assert proc.returncode == 2 and field in proc.stderr, proc.stderr
    proc = mass("run", str(spec), "--work-dir", str(tmp_path / "work"), "--no-progress")
    assert proc.returncode == 2 and field in proc.stderr, proc.stderr
    proc = mass("status", str(spec), "--json")
    assert proc.returncode == 2, proc.stderr[-3000:]
    shown = json.loads(proc.stdout)
    assert [c.split(" (")[0] for c in shown["spec_changes"]] == [field]
    # the stored run's table: nothing after search reads done, and the same as before the change
    assert shown["steps"] == json.loads(before.stdout)["steps"]
    text = mass("status", str(spec))
    assert text.returncode == 2 and "`mass run` and `mass validate` refuse it" in text.stdout
    assert field in text.stdout


def test_until_stops_at_a_step_of_the_plan_and_names_the_steps_it_takes(tmp_path, tiny_model_dir, capsys):
    """`mass run --until G:STEP` accepts a generation step of the spec's plan (tests/test_paper_mini.py
    runs one to L0's render and resumes nothing) and refuses anything else before any work, listing them."""
    from mass_jobs.commands.cli import main as cli_main
    from mass_jobs.pipeline import nodes as N
    from mass_jobs.pipeline.runner import stop_after
    from mass_jobs.spec.load import SpecError

    ctx = small_ctx(tmp_path)
    plan = N.compile_plan(str(SPEC), ctx.spec, None)
    groups = [x for g in range(ctx.spec.generations) for x in plan.generation(g)]
    assert stop_after("0:render", groups) == (0, "render") and stop_after("1:evaluate", groups) == (1, "evaluate")
    for bad in ("2:render", "0:report", "render", "0:Render", "-1:search", ""):
        with pytest.raises(SpecError, match=r"--until: expected GEN:STEP, one of 0:search, .*1:evaluate; found"):
            stop_after(bad, groups)
    doc = yaml.safe_load(SPEC.read_text())
    doc["store"]["uri"] = f"file://{tmp_path / 'store'}"
    doc["model"]["base"] = doc["judges"][0]["model"] = str(tiny_model_dir)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    capsys.readouterr()
    assert cli_main(["run", str(spec), "--until", "3:train", "--work-dir", str(tmp_path / "w")]) == 2
    assert "--until: expected GEN:STEP" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()  # refused before anything was written
