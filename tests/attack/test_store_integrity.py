"""Attacks on store integrity: outputs and manifests changed, cut or raced behind a step's back.

Each runs on both backends (file:// and moto's S3 server on loopback). A step whose outputs no
longer match its manifest, or whose manifest is not one, must count as not done and be redone
(its manifest rewritten); concurrent finishers must never leave a manifest pinning a stale hash;
`mass verify` must name every broken step.

    .venv/bin/python -m pytest -q tests/attack/test_store_integrity.py
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.store import CorruptObject, Step, StepTakenOver, read_manifest, verify_manifest
from mass_jobs.store.manifest import HASH_ON_DONE

REPO = Path(__file__).resolve().parents[2]
KINDS = ["file", "s3"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_step(store, runs: list, inputs=None, outputs=None) -> Step:
    """A step writing two small outputs and one large one; `runs` counts real executions."""
    outputs = outputs or {"p/a.json": b'{"a": 1}\n', "p/b.txt": b"bee\n", "p/big.bin": b"\x07" * (HASH_ON_DONE + 10)}
    step = Step(store, "p", inputs or {"v": 1})
    if step.done:
        return step
    step.start()
    runs.append(1)
    for key, data in outputs.items():
        store.put_bytes(key, data)
    step.finish(list(outputs), extra={"n": len(outputs)})
    return step


def cli_sees(store, monkeypatch) -> str:
    """The store's URI for `mass verify`, with the S3 endpoint in the standard environment variable."""
    if hasattr(store, "endpoint_url"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", store.endpoint_url)
    return store.uri


def finished(make_store, kind):
    store, runs = make_store(kind), []
    run_step(store, runs)
    assert len(runs) == 1 and run_step(store, runs).done and len(runs) == 1
    return store, runs


TAMPER = {
    "output-deleted": lambda s: s.delete("p/b.txt"),
    "output-truncated": lambda s: s.put_bytes("p/a.json", b'{"a":'),
    "output-same-size-other-bytes": lambda s: s.put_bytes("p/b.txt", b"BEE\n"),
    "output-emptied": lambda s: s.put_bytes("p/a.json", b""),
    "large-output-truncated": lambda s: s.put_bytes("p/big.bin", b"\x07" * 100),
    "large-output-deleted": lambda s: s.delete("p/big.bin"),
    "manifest-truncated": lambda s: s.put_bytes("p/_manifest.json", s.get_bytes("p/_manifest.json")[:40]),
    "manifest-empty": lambda s: s.put_bytes("p/_manifest.json", b""),
    "manifest-array": lambda s: s.put_bytes("p/_manifest.json", b"[]"),
    "manifest-string": lambda s: s.put_bytes("p/_manifest.json", b'"done"'),
    "manifest-null": lambda s: s.put_bytes("p/_manifest.json", b"null"),
    "manifest-number": lambda s: s.put_bytes("p/_manifest.json", b"42"),
    "manifest-not-utf8": lambda s: s.put_bytes("p/_manifest.json", b"\xff\xfe{\x00"),
    "manifest-outputs-not-object": lambda s: _edit(s, outputs=["p/a.json"]),
    "manifest-output-hash-not-string": lambda s: _edit(s, outputs={"p/a.json": 1}),
    "manifest-sizes-not-ints": lambda s: _edit(s, sizes={"p/a.json": "9"}),
    "manifest-no-input-hash": lambda s: _edit(s, input_hash=None),
    "manifest-lists-a-missing-output": lambda s: _edit(
        s, outputs={**s.get_json("p/_manifest.json")["outputs"], "p/ghost": sha(b"")}
    ),
    "manifest-pins-another-hash": lambda s: _edit(
        s, outputs={**s.get_json("p/_manifest.json")["outputs"], "p/b.txt": sha(b"other")}
    ),
    "manifest-pins-another-size": lambda s: _edit(s, sizes={**s.get_json("p/_manifest.json")["sizes"], "p/big.bin": 5}),
}


def _edit(store, **changes):
    manifest = store.get_json("p/_manifest.json")
    manifest.update(changes)
    store.put_json("p/_manifest.json", manifest)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tamper", TAMPER.values(), ids=TAMPER.keys())
def test_tampered_step_is_not_done_is_redone_and_its_manifest_rewritten(make_store, kind, tamper):
    store, runs = finished(make_store, kind)
    tamper(store)
    assert not Step(store, "p", {"v": 1}).done  # never raises, never trusts
    with pytest.raises((CorruptObject, LookupError)):
        verify_manifest(store, "p")
    step = run_step(store, runs)
    assert len(runs) == 2 and step.done
    manifest = verify_manifest(store, "p")
    assert manifest["outputs"]["p/b.txt"] == sha(b"bee\n") and manifest["sizes"]["p/big.bin"] == HASH_ON_DONE + 10


@pytest.mark.parametrize("kind", KINDS)
def test_large_output_with_same_size_is_caught_by_verify(make_store, kind, capsys, monkeypatch):
    """Step.done checks large outputs by size only (cheap); `mass verify` re-hashes them."""
    store, runs = finished(make_store, kind)
    store.put_bytes("p/big.bin", b"\x08" * (HASH_ON_DONE + 10))
    assert Step(store, "p", {"v": 1}).done  # documented: too large to re-hash on every check
    assert cli_main(["verify", cli_sees(store, monkeypatch)]) == 1
    out = capsys.readouterr().out
    pinned = sha(b"\x07" * (HASH_ON_DONE + 10))
    assert f"BROKEN p: {store.uri}: object 'p/big.bin' expected sha256 {pinned}" in out
    assert out.rstrip().endswith("1 step manifest(s), 0 output(s) re-hashed: 1 broken")


@pytest.mark.parametrize("kind", KINDS)
def test_mass_verify_checks_every_manifest_and_names_each_broken_one(make_store, kind, capsys, monkeypatch):
    store = make_store(kind)
    for name in ("run/gen-0/a", "run/gen-0/b", "run/gen-1/c"):
        store.put_bytes(f"{name}.out", name.encode())
        Step(store, name, {}).finish([f"{name}.out"])
    assert cli_main(["verify", cli_sees(store, monkeypatch)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "3 step manifest(s), 3 output(s) re-hashed: 0 broken"

    store.put_bytes("run/gen-0/b.out", b"changed")
    store.put_bytes("run/gen-1/c/_manifest.json", b'{"step": "c", "input_')
    assert cli_main(["verify", "--quiet", store.uri]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("BROKEN run/gen-0/b: ") and "expected sha256" in lines[0]
    assert lines[1].startswith("BROKEN run/gen-1/c: ") and "manifest 'run/gen-1/c/_manifest.json' is broken" in lines[1]
    assert lines[2] == "3 step manifest(s), 1 output(s) re-hashed: 2 broken"


def test_mass_verify_takes_a_spec_and_refuses_an_empty_run(make_store, tmp_path, capsys):
    store = make_store("file")
    spec = tmp_path / "spec.yaml"
    (tmp_path / "m").mkdir()  # model locations are checked: the model must exist
    spec.write_text(
        f"name: vrun\nmodel: {{base: m}}\ntasks: [{{id: t, split: train, prompt: p}}]\n"
        f"store: {{uri: '{store.uri}'}}\ncollection: {{episodes: 2, train_ranks: 1, validation_rank: 2}}\n"
        "ranking: {comparisons_per_episode: 1}\n"
    )
    assert cli_main(["verify", str(spec)]) == 2
    assert "no step manifests under" in capsys.readouterr().err
    store.put_bytes("other/x", b"x")
    Step(store, "other", {}).finish(["other/x"])  # another run's manifest is not this run's
    store.put_bytes("vrun/gen-0/x", b"x")
    Step(store, "vrun/gen-0", {}).finish(["vrun/gen-0/x"])
    assert cli_main(["verify", str(spec)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ok     vrun/gen-0",
        "1 step manifest(s), 1 output(s) re-hashed: 0 broken",
    ]


# ---------------------------------------------------------------- concurrent finishers


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("b_data", [b"from B, longer", b"from B"], ids=["other-size", "same-size"])
def test_a_finisher_overtaken_between_hashing_and_writing_its_manifest_publishes_nothing(
    make_store, kind, b_data, monkeypatch
):
    """A hashes its output; B takes the step over, rewrites the output and finishes; then A writes
    its (stale) manifest. A finds its lease gone: it withdraws that manifest and raises, so the step
    is left not done (a rerun redoes it), never pinned with A's stale hash."""
    store = make_store(kind)
    a, b = Step(store, "s", {"v": 1}), Step(store, "s", {"v": 1})
    store.put_bytes("s/out", b"from A")
    write, raced = store.put_json, []

    def racing_put_json(key, obj):
        if key == a.manifest_key and not raced:
            raced.append(obj["outputs"]["s/out"])
            b.start()
            store.put_bytes("s/out", b_data)
            b.finish(["s/out"])
        return write(key, obj)

    monkeypatch.setattr(store, "put_json", racing_put_json)
    with pytest.raises(StepTakenOver, match="lease was taken over by another writer"):
        a.finish(["s/out"])
    assert raced == [sha(b"from A")]  # A's manifest really was stale
    assert not store.exists(a.manifest_key) and not a.done and not b.done
    assert not store.exists("s/_writer.json")  # both leases released


FINISHER = textwrap.dedent("""
    import sys
    from mass_jobs.config.run_spec import StoreSpec
    from mass_jobs.store import Step, open_store

    store = open_store(StoreSpec.model_validate_json(sys.argv[1]))
    me = sys.argv[2]
    for i in range(int(sys.argv[3])):
        step = Step(store, "race", {"same": "inputs"})
        step.start()
        for key in ("race/a", "race/b"):
            store.put_bytes(key, f"{me}-{i}-{key}".encode() * (1 + int(me) % 3))
        step.finish(["race/a", "race/b"])
""")


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_finisher_processes_leave_a_manifest_that_verifies(make_store, kind, tmp_path):
    store = make_store(kind)
    script = tmp_path / "finisher.py"
    script.write_text(FINISHER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), store.spec.model_dump_json(), str(n), "8"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors
    manifest = verify_manifest(store, "race")
    assert set(manifest["outputs"]) == {"race/a", "race/b"}
    assert manifest["sizes"] == {k: len(store.get_bytes(k)) for k in ("race/a", "race/b")}
    assert Step(store, "race", {"same": "inputs"}).done


@pytest.mark.parametrize("kind", KINDS)
def test_delete_if_version_removes_only_the_version_it_names(make_store, kind):
    store = make_store(kind)
    store.put_bytes("v/obj", b"first")
    first = store.stat("v/obj")[1]
    store.put_bytes("v/obj", b"second")
    assert store.delete_if_version("v/obj", first) is False and store.get_bytes("v/obj") == b"second"
    assert store.delete_if_version("v/obj", store.stat("v/obj")[1]) is True and not store.exists("v/obj")
    assert store.delete_if_version("v/obj", first) is False  # gone: nothing to delete
    assert store.list("v/") == []  # nothing left aside


class _SwapAfterRead:
    """The store as a lease-taker sees it, with another writer acting at one instant: right after the
    taker has read a dead holder's lease (its second stat), that lease is released and a live writer
    creates its own under the same key."""

    def __init__(self, store, key: str, live: dict):
        self._store, self._key, self._live, self._stats = store, key, live, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def stat(self, key):
        out = self._store.stat(key)
        if key == self._key:
            self._stats += 1
            if self._stats == 2:
                self._store.delete(key)
                assert self._store.create_json(key, self._live)
        return out


@pytest.mark.parametrize("kind", KINDS)
def test_taking_over_a_dead_writers_lease_never_deletes_the_live_one_that_replaced_it(make_store, kind):
    """The race behind a flaky finisher: a writer read the lease of a holder that had just released it
    and exited, found that holder dead, and deleted the key, by then a live writer's lease, which
    then found itself taken over. The takeover deletes only the version it read."""
    import socket
    import time

    from mass_jobs.store.lease import Lease, WriterBusy, _pid_namespace

    store = make_store(kind)
    dead = subprocess.Popen(["true"])
    dead.wait()
    now = time.time()
    holder = {"host": socket.gethostname(), "pidns": _pid_namespace(), "started": now, "renewed": now}
    key = "race/_writer.json"
    assert store.create_json(key, {**holder, "holder": "gone", "pid": dead.pid, "token": "dead"})
    live = {**holder, "holder": "live", "pid": os.getppid(), "token": "live"}  # a process that is alive
    lease = Lease(_SwapAfterRead(store, key, live), key, "step race", ttl_s=30, renew_s=5, wait_s=0)
    with pytest.raises(WriterBusy, match="being written by live"):
        lease.acquire()
    assert store.get_json(key)["token"] == "live"


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_manifest_is_never_a_crash_for_readers(make_store, kind):
    store, _ = finished(make_store, kind)
    store.put_bytes("p/_manifest.json", b'{"outputs": ')
    assert read_manifest(store, "p") is None
    store.put_bytes("p/_manifest.json", json.dumps({"input_hash": "x", "outputs": {}, "sizes": {}}).encode())
    assert read_manifest(store, "p")["input_hash"] == "x" and not Step(store, "p", {"v": 1}).done


def test_a_lone_surrogate_from_a_model_is_stored_escaped_and_read_back(tmp_path):
    """A model that cuts an emoji in half sends "\\ud800": storing the episode must not raise."""
    from mass_jobs.store import FileStore
    from mass_jobs.store.manifest import hash_inputs

    store = FileStore(tmp_path / "s")
    doc = {"outcome": "success", "reason": "done \ud800 half an emoji", "ok": "é"}
    store.put_json("r/ep/status.json", doc)
    assert store.get_json("r/ep/status.json") == doc
    assert store.get_bytes("r/ep/status.json").decode("utf-8")  # valid UTF-8 on disk
    assert hash_inputs(doc) == hash_inputs(dict(doc)) and len(hash_inputs(doc)) == 64


def test_a_key_past_s3s_length_is_refused_by_name_not_a_recursion(tmp_path):
    from mass_jobs.store import open_store

    store = open_store(f"file://{tmp_path / 's'}")
    deep = "/".join(["a"] * 2000)
    with pytest.raises(ValueError, match="over the 1024 bytes S3 allows a key"):
        store.put_bytes(deep, b"x")
    store.put_bytes("/".join(["a"] * 500), b"x")  # 999 bytes: stored
    assert store.get_bytes("/".join(["a"] * 500)) == b"x"


def test_an_object_removed_while_a_step_checks_it_reads_as_missing(tmp_path, monkeypatch):
    """Another process restarting the step deletes an output between its stat and its read: the
    done-check reads it as missing (the step reruns), never FileNotFoundError."""
    from mass_jobs.store import Step, open_store
    from mass_jobs.store.base import MissingKey

    store = open_store(f"file://{tmp_path / 's'}")
    store.put_bytes("run/step/out.json", b"{}")
    step = Step(store, "run/step", {"x": 1})
    step.finish(["run/step/out.json"])
    real = type(store)._existing

    def vanishing(self, key):
        path = real(self, key)
        path.unlink()  # the other process's restart, right after the check
        return path

    monkeypatch.setattr(type(store), "_existing", vanishing)
    with pytest.raises(MissingKey):
        store.get_bytes("run/step/out.json")
    store.put_bytes("run/step/out.json", b"{}")
    assert step.done is False  # its output went away under it: rerun, no traceback


@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_naming_another_steps_outputs_is_not_done_and_cannot_be_written(make_store, kind):
    """A manifest of step X that pins step Y's objects (hashes right) would make X "done" without
    any output of its own: refused when written, and not believed when found."""
    store = make_store(kind)
    store.put_bytes("run/gen-0/collect/t/ep-0/status.json", b'{"outcome": "success"}')
    x = Step(store, "run/gen-0/rank/t", {"v": 1})
    with pytest.raises(
        ValueError, match=r"cannot pin objects of other steps: \['run/gen-0/collect/t/ep-0/status.json'\]"
    ):
        x.finish(["run/gen-0/collect/t/ep-0/status.json"])
    key = "run/gen-0/collect/t/ep-0/status.json"
    store.put_json(
        x.manifest_key,
        {
            "step": x.name,
            "input_hash": x.input_hash,
            "outputs": {key: store.sha256(key)},
            "sizes": {key: store.stat(key)[0]},
            "extra": {},
        },
    )
    assert not x.done
    store.put_bytes("run/gen-0/rank/t.json", b"{}")  # its own one-file output, and another step's manifest
    y = Step(store, "run/gen-0/collect/t/ep-0", {"v": 2})
    y.finish([key])
    assert x.finish(["run/gen-0/rank/t.json", y.manifest_key]) and x.done
