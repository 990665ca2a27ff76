"""Two writers of one run: the spec claim is atomic (of two different specs one wins, the other is
refused naming the changed fields), and a writer lease in the store lets one `mass run` at a time
write a run (a second one exits 2 naming the holder; a killed holder's lease is taken over). Each
step has a lease of its own: a second writer waits, then exits naming the holder, and a writer
whose step was taken over publishes nothing. On the file store and on S3 (moto's server:
conditional PUTs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from mass_jobs.pipeline.run_lease import RunBusy, RunLease
from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import SpecError, validate_document

REPO = Path(__file__).resolve().parents[2]


def spec(iterations: int):
    return validate_document(
        {
            "name": "shared",
            "model": {"base": "org/model"},
            "store": {"uri": "file://unused"},
            "search": {"iterations": iterations},
            "tasks": [{"id": "a", "split": "train", "prompt": "do a"}],
        }
    )


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_of_two_concurrent_claims_with_different_specs_exactly_one_wins(make_store, kind):
    for _ in range(10):
        store = make_store(kind)
        results: list[str] = []
        gate = threading.Barrier(4)

        def claim(seed, store=store, gate=gate, results=results):
            ctx = RunContext(spec(seed), store)
            gate.wait()
            try:
                ctx.claim_spec()
                results.append(f"won {seed}")
            except SpecError as err:
                assert "stored run has" in str(err) and "$.search.iterations" in str(err)
                results.append("refused")

        threads = [threading.Thread(target=claim, args=(seed,)) for seed in (1, 2, 3, 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [r for r in results if r.startswith("won")]
        assert len(won) == 1 and results.count("refused") == 3, results
        assert store.get_json("shared/spec.json")["search"]["iterations"] == int(won[0].split()[1])


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_second_writer_is_refused_naming_the_holder_until_the_first_is_done(make_store, kind):
    ctx = RunContext(spec(1), make_store(kind))
    first = RunLease(ctx, renew_s=0.2)
    first.acquire()
    try:
        with pytest.raises(RunBusy, match=r"is being written by .+:%d \(started" % os.getpid()):
            RunLease(ctx).acquire()
        before = ctx.store.get_json(ctx.writer())["renewed"]
        time.sleep(0.6)
        assert ctx.store.get_json(ctx.writer())["renewed"] > before  # renewed while held
    finally:
        first.release()
    assert not ctx.store.exists(ctx.writer())
    with RunLease(ctx):
        assert ctx.store.exists(ctx.writer())


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_lease_not_renewed_or_of_a_dead_process_is_taken_over(make_store, kind):
    ctx = RunContext(spec(1), make_store(kind))
    now = time.time()
    ctx.store.put_json(
        ctx.writer(),
        {"holder": "elsewhere:1", "host": "elsewhere", "pid": 1, "started": now - 600, "renewed": now - 600},
    )
    with RunLease(ctx):  # another machine's writer that stopped renewing
        assert ctx.store.get_json(ctx.writer())["pid"] == os.getpid()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ctx.store.put_json(
        ctx.writer(),
        {
            "holder": f"{socket.gethostname()}:{dead.pid}",
            "host": socket.gethostname(),
            "pid": dead.pid,
            "started": now,
            "renewed": time.time(),
        },
    )
    with RunLease(ctx):  # this host's writer, killed: its pid is gone
        assert ctx.store.get_json(ctx.writer())["pid"] == os.getpid()


@pytest.mark.slow(cost=15)  # `mass run` end to end: the slow tier
def test_two_mass_runs_of_one_run(tmp_path, tiny_model_dir):
    """The CLI: while one `mass run` holds the run, a second with another spec exits 2 naming the
    changed field and one with the same spec exits 2 naming the holder; once the first is killed,
    its lease is taken over."""
    doc = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    doc["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    doc["model"]["base"] = str(tiny_model_dir)
    doc["judges"] = [{**j, "model": str(tiny_model_dir)} for j in doc["judges"]]
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(doc))
    search = doc.get("search") or {}
    b.write_text(yaml.safe_dump({**doc, "search": {**search, "iterations": int(search.get("iterations", 2)) + 1}}))
    env = {**os.environ, "MASS_WORK_DIR": str(tmp_path / "work")}
    mass = [sys.executable, "-m", "mass_jobs.commands.cli"]
    first = subprocess.Popen(
        [*mass, "run", str(a), "--no-progress"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    lease = tmp_path / "store" / doc["name"] / "_writer.json"
    try:
        for _ in range(600):
            if lease.exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert lease.exists(), first.stderr.read().decode()[-2000:] if first.poll() is not None else "no lease"
        other = subprocess.run(
            [*mass, "run", str(b), "--no-progress"], env=env, capture_output=True, text=True, timeout=300
        )
        assert other.returncode == 2 and "$.search.iterations: stored run has" in other.stderr, other.stderr[-2000:]
        same = subprocess.run(
            [*mass, "run", str(a), "--no-progress"], env=env, capture_output=True, text=True, timeout=300
        )
        assert same.returncode == 2 and f":{first.pid} (started" in same.stderr, same.stderr[-2000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    from mass_jobs.spec.load import load_spec
    from mass_jobs.store import open_store

    s = load_spec(a)
    with RunLease(RunContext(s, open_store(s.store))):  # the killed writer's lease is taken over
        assert yaml.safe_load(lease.read_text())["pid"] == os.getpid()


# ---------------------------------------------------------------- one writer per step

STEP_WRITER = textwrap.dedent("""
    import os, sys
    from mass_jobs.config.run_spec import StoreSpec
    from mass_jobs.store import Step, StepTakenOver, open_store
    from mass_jobs.store import manifest
    from mass_jobs.store.lease import WriterBusy

    manifest.STEP_TTL_S, manifest.STEP_RENEW_S, manifest.STEP_WAIT_S = 1.5, 0.2, float(sys.argv[3])
    store, me = open_store(StoreSpec.model_validate_json(sys.argv[1])), sys.argv[2]
    step = Step(store, "run/gen-0/rank/t", {"same": "inputs"})
    try:
        step.start()
    except WriterBusy as err:
        print("BUSY", err, flush=True)
        sys.exit(2)
    for key in ("run/gen-0/rank/t/o1", "run/gen-0/rank/t/o2"):
        store.put_bytes(key, me.encode())
        print("WROTE", key, flush=True)
        if me == "B":  # B dies after rewriting o1 only
            os._exit(9)
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        step.finish(["run/gen-0/rank/t/o1", "run/gen-0/rank/t/o2"])
    except StepTakenOver as err:
        print("TAKEN", err, flush=True)
        sys.exit(3)
    print("DONE", flush=True)
""")


def _writer(tmp_path, store, me: str, wait_s: float) -> subprocess.Popen:
    script = tmp_path / "step_writer.py"
    script.write_text(STEP_WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), store.spec.model_dump_json(), me, str(wait_s)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(proc: subprocess.Popen, word: str) -> str:
    for line in proc.stdout:
        if line.startswith(word):
            return line
    raise AssertionError(f"writer ended before {word}: {proc.stderr.read()[-2000:]}")


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_second_writer_of_a_step_waits_then_exits_naming_the_live_holder(make_store, kind, tmp_path):
    store = make_store(kind)
    a = _writer(tmp_path, store, "A", 0)
    try:
        _until(a, "READY")
        b = _writer(tmp_path, store, "B", 1.0)  # waits 1 s for A, who keeps renewing
        out, err = b.communicate(timeout=120)
        assert (
            b.returncode == 2
            and f"step 'run/gen-0/rank/t' in {store.uri} is being written by {socket.gethostname()}:{a.pid} (started"
            in out
        ), out + err
        assert store.get_bytes("run/gen-0/rank/t/o1") == b"A"  # B wrote nothing
        a.stdin.write("\n")
        a.stdin.flush()
        _until(a, "DONE")
    finally:
        a.kill()
        a.wait()
    from mass_jobs.store import Step, verify_manifest

    assert Step(store, "run/gen-0/rank/t", {"same": "inputs"}).done
    assert not store.exists("run/gen-0/rank/t/_writer.json")
    assert verify_manifest(store, "run/gen-0/rank/t")["outputs"].keys() == {
        "run/gen-0/rank/t/o1",
        "run/gen-0/rank/t/o2",
    }


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_killed_writer_never_leaves_a_manifest_of_two_writers_outputs(make_store, kind, tmp_path):
    """A writes o1 and o2 and is frozen past the lease's TTL; B takes the step over, rewrites o1
    and is killed; A resumes and finishes: it finds its lease taken, publishes nothing, and the
    step stays not done until a rerun writes every output itself."""
    from mass_jobs.store import Step, verify_manifest

    store = make_store(kind)
    a = _writer(tmp_path, store, "A", 0)
    try:
        _until(a, "READY")
        os.kill(a.pid, signal.SIGSTOP)  # frozen: its lease stops being renewed
        time.sleep(2.0)
        b = _writer(tmp_path, store, "B", 5.0)
        out, err = b.communicate(timeout=120)
        assert b.returncode == 9 and "WROTE run/gen-0/rank/t/o1" in out, out + err
        assert store.get_bytes("run/gen-0/rank/t/o1") == b"B" and store.get_bytes("run/gen-0/rank/t/o2") == b"A"
        os.kill(a.pid, signal.SIGCONT)
        a.stdin.write("\n")
        a.stdin.flush()
        taken = _until(a, "TAKEN")
        assert "its writer lease was taken over by another writer" in taken
        assert a.wait(timeout=60) == 3
    finally:
        a.kill()
        a.wait()
    step = Step(store, "run/gen-0/rank/t", {"same": "inputs"})
    assert not store.exists(step.manifest_key) and not step.done
    rerun = _writer(tmp_path, store, "C", 5.0)  # B's lease is stale (its process is gone): taken over
    _until(rerun, "READY")
    rerun.stdin.write("\n")
    rerun.stdin.flush()
    _until(rerun, "DONE")
    assert rerun.wait(timeout=60) == 0
    manifest = verify_manifest(store, "run/gen-0/rank/t")
    assert {store.get_bytes(k) for k in manifest["outputs"]} == {b"C"} and step.done
