"""Two writers of one run: the spec claim is atomic (of two different specs one wins, the other is
refused naming the changed fields), and a writer lease in the store lets one `mass run` at a time
write a run (a second one exits 2 naming the holder; a killed holder's lease is taken over).
On the file store and on S3 (moto's server: conditional PUTs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from mass_jobs.context import RunContext
from mass_jobs.run_lease import RunBusy, RunLease
from mass_jobs.spec import SpecError, validate_document

REPO = Path(__file__).resolve().parents[2]


def spec(iterations: int):
    return validate_document({"name": "shared", "model": {"base": "org/model"}, "store": {"uri": "file://unused"},
                              "search": {"iterations": iterations},
                              "tasks": [{"id": "a", "split": "train", "prompt": "do a"}]})


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_of_two_concurrent_claims_with_different_specs_exactly_one_wins(make_store, kind):
    for _ in range(10):
        store = make_store(kind)
        results: list[str] = []
        gate = threading.Barrier(4)

        def claim(seed):
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
    ctx.store.put_json(ctx.writer(), {"holder": "elsewhere:1", "host": "elsewhere", "pid": 1,
                                      "started": now - 600, "renewed": now - 600})
    with RunLease(ctx):  # another machine's writer that stopped renewing
        assert ctx.store.get_json(ctx.writer())["pid"] == os.getpid()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    ctx.store.put_json(ctx.writer(), {"holder": f"{socket.gethostname()}:{dead.pid}", "host": socket.gethostname(),
                                      "pid": dead.pid, "started": now, "renewed": time.time()})
    with RunLease(ctx):  # this host's writer, killed: its pid is gone
        assert ctx.store.get_json(ctx.writer())["pid"] == os.getpid()


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
    mass = [sys.executable, "-m", "mass_jobs.cli"]
    first = subprocess.Popen([*mass, "run", str(a), "--no-progress"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    lease = tmp_path / "store" / doc["name"] / "_writer.json"
    try:
        for _ in range(600):
            if lease.exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert lease.exists(), first.stderr.read().decode()[-2000:] if first.poll() is not None else "no lease"
        other = subprocess.run([*mass, "run", str(b), "--no-progress"], env=env, capture_output=True, text=True,
                               timeout=300)
        assert other.returncode == 2 and "$.search.iterations: stored run has" in other.stderr, other.stderr[-2000:]
        same = subprocess.run([*mass, "run", str(a), "--no-progress"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert same.returncode == 2 and f":{first.pid} (started" in same.stderr, same.stderr[-2000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    from mass_jobs.spec import load_spec
    from mass_jobs.store import open_store

    s = load_spec(a)
    with RunLease(RunContext(s, open_store(s.store))):  # the killed writer's lease is taken over
        assert yaml.safe_load(lease.read_text())["pid"] == os.getpid()
