"""The object store and step manifests, run against both backends (a directory and moto's S3 server)."""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mass_jobs.config.run_spec import StoreSpec
from mass_jobs.store import (
    CorruptObject,
    FileStore,
    MissingKey,
    S3Store,
    Step,
    UnreadableObject,
    UnsafeArchive,
    hash_inputs,
    open_store,
    read_manifest,
    verify_manifest,
)

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- objects


def test_bytes_and_json_round_trip(store):
    assert store.put_bytes("run/a.bin", b"\x00\x01payload") == sha(b"\x00\x01payload")
    assert store.get_bytes("run/a.bin") == b"\x00\x01payload"
    obj = {"name": "élite", "scores": [1.5, -2], "nested": {"ok": True, "none": None}}
    digest = store.put_json("run/state.json", obj)
    assert store.get_json("run/state.json") == obj
    assert store.sha256("run/state.json") == digest == sha(store.get_bytes("run/state.json"))
    store.put_bytes("run/a.bin", b"second version")  # overwrite replaces the whole object
    assert store.get_bytes("run/a.bin") == b"second version"


def test_file_round_trip_streams_and_replaces_destination(store, tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(3 * MiB + 17)
    src.write_bytes(data)
    assert store.put_file("files/big.bin", src) == sha(data)
    dest = tmp_path / "out" / "deeper" / "big.bin"
    assert store.get_file("files/big.bin", dest) == dest
    assert dest.read_bytes() == data
    dest.write_bytes(b"stale")
    store.get_file("files/big.bin", dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["big.bin"]  # no temp file left behind


def test_missing_objects_raise_missing_key(store, tmp_path):
    with pytest.raises(MissingKey, match="no object at key 'nope/x'"):
        store.get_bytes("nope/x")
    with pytest.raises(MissingKey):
        store.get_file("nope/x", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(MissingKey):
        store.sha256("nope/x")


def test_exists_and_delete(store):
    assert not store.exists("k/v.txt")
    store.put_bytes("k/v.txt", b"v")
    assert store.exists("k/v.txt")
    assert not store.exists("k")  # a folder is not an object
    store.delete("k/v.txt")
    assert not store.exists("k/v.txt")
    store.delete("k/v.txt")  # deleting twice is fine (as on S3)


def test_list_by_prefix_is_sorted_and_only_that_prefix(store):
    for key in ["b/5", "a/sub/3", "ab/4", "a/2", "a/1"]:
        store.put_bytes(key, key.encode())
    assert store.list("a/") == ["a/1", "a/2", "a/sub/3"]
    assert store.list("a") == ["a/1", "a/2", "a/sub/3", "ab/4"]  # a string prefix, as on S3
    assert store.list("a/sub/") == ["a/sub/3"]
    assert store.list() == ["a/1", "a/2", "a/sub/3", "ab/4", "b/5"]
    assert store.list("zzz/") == []


BAD_KEYS = {
    "/abs/key": "must be relative",
    "a/../b": "'..' segments",
    "..": "'..' segments",
    "./a": "'..' segments",
    "a//b": "empty segment",
    "a/": "empty segment",
    "": "empty segment",
    "a\\b": "'/' separators",
    "a/.tmp-x": "reserved",
}


def test_bad_keys_are_rejected_with_the_reason(store):
    for key, reason in BAD_KEYS.items():
        with pytest.raises(ValueError, match=reason):
            store.put_bytes(key, b"x")
        with pytest.raises(ValueError, match=reason):
            store.exists(key)
    with pytest.raises(ValueError, match="empty segment"):
        store.list("a//")
    assert store.list() == []


def test_spec_reopens_the_same_store(store):
    store.put_bytes("x/y", b"shared")
    again = open_store(store.spec)
    assert type(again) is type(store)
    assert again.get_bytes("x/y") == b"shared"


# ---------------------------------------------------------------- directories


def make_tree(root: Path) -> None:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (root / "data.csv").write_text("a,b\n1,2\n")
    (root / "empty").mkdir()
    run = root / "run.sh"
    run.write_text("#!/bin/sh\necho ok\n")
    run.chmod(0o755)
    (root / "link-inside").symlink_to("src/pkg/mod.py")


def test_dir_round_trip_keeps_tree_modes_and_inner_links(store, tmp_path):
    src = tmp_path / "ws"
    make_tree(src)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    (src / "link-outside").symlink_to(secret)
    (src / "link-up").symlink_to("../secret.txt")
    digest = store.put_dir("ep-0/workspace.tar.gz", src)
    assert store.sha256("ep-0/workspace.tar.gz") == digest

    out = tmp_path / "restored"
    store.get_dir("ep-0/workspace.tar.gz", out)
    found = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    # Links pointing outside the directory are skipped, never followed.
    assert found == ["data.csv", "empty", "link-inside", "run.sh", "src", "src/pkg", "src/pkg/mod.py"]
    assert (out / "src/pkg/mod.py").read_text() == "print('hi')\n"
    assert (out / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "link-inside").is_symlink() and os.readlink(out / "link-inside") == "src/pkg/mod.py"


def test_dir_archive_is_deterministic(store, tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    make_tree(first)
    make_tree(second)
    os.utime(second / "data.csv", (1_000_000, 1_000_000))  # different mtimes, same content
    assert store.put_dir("a.tar.gz", first) == store.put_dir("b.tar.gz", second)
    with tarfile.open(fileobj=io.BytesIO(store.get_bytes("a.tar.gz"))) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "data.csv",
        "empty",
        "link-inside",
        "run.sh",
        "src",
        "src/pkg",
        "src/pkg/mod.py",
    ]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}


def evil_archive(name: str, *, symlink_to: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        good = tarfile.TarInfo("fine.txt")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(name)
        if symlink_to is None:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        else:
            info.type, info.linkname = tarfile.SYMTYPE, symlink_to
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    "name,link",
    [("../escape.txt", None), ("/tmp/abs.txt", None), ("a/../../escape.txt", None), ("ln", "/etc"), ("ln", "../..")],
    ids=["dotdot", "absolute", "nested-dotdot", "abs-symlink", "symlink-up"],
)
def test_get_dir_refuses_members_escaping_the_target(store, tmp_path, name, link):
    store.put_bytes("evil.tar.gz", evil_archive(name, symlink_to=link))
    out = tmp_path / "deep" / "out"
    with pytest.raises(UnsafeArchive, match="escapes|points outside"):
        store.get_dir("evil.tar.gz", out)
    assert not (tmp_path / "deep").exists()  # all or nothing: not even the target's parents remain
    assert not (tmp_path / "escape.txt").exists() and not list(tmp_path.rglob(".tmp-extract-*"))


def test_get_dir_extracts_only_into_a_missing_or_empty_folder(store, tmp_path):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    (out / "x").symlink_to(elsewhere)  # a link already in the target can never be written through
    store.put_bytes("evil.tar.gz", evil_archive("x/planted.txt"))
    with pytest.raises(FileExistsError, match="missing or an empty folder"):
        store.get_dir("evil.tar.gz", out)
    assert list(elsewhere.iterdir()) == [] and [p.name for p in out.iterdir()] == ["x"]
    (out / "x").unlink()
    store.get_dir("evil.tar.gz", out)  # an empty folder is replaced by the extracted tree
    assert sorted(p.name for p in out.iterdir()) == ["fine.txt", "x"]


# ---------------------------------------------------------------- S3 specifics


def test_s3_large_file_uses_multipart(make_store, tmp_path):
    store = make_store("s3", multipart_threshold=5 * MiB)
    data = os.urandom(11 * MiB)
    (tmp_path / "big").write_bytes(data)
    store.put_file("model/weights.bin", tmp_path / "big")
    head = store.client.head_object(Bucket=store.bucket, Key=f"{store.prefix}/model/weights.bin")
    assert head["ETag"].strip('"').endswith("-3")  # 5 + 5 + 1 MiB parts
    assert head["ContentLength"] == 11 * MiB
    assert store.sha256("model/weights.bin") == sha(data)
    (tmp_path / "small").write_bytes(data[:MiB])
    store.put_file("model/small.bin", tmp_path / "small")
    head = store.client.head_object(Bucket=store.bucket, Key=f"{store.prefix}/model/small.bin")
    assert "-" not in head["ETag"]  # below the threshold: one plain PUT


def test_s3_prefixes_isolate_stores_in_one_bucket(make_store):
    one, two = make_store("s3"), make_store("s3")
    one.put_bytes("a/x", b"1")
    assert one.list() == ["a/x"]
    assert two.list() == [] and not two.exists("a/x")


def test_s3_settings_from_the_standard_environment(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env["endpoint_url"])
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    store = open_store(f"s3://{s3_env['bucket']}/from-env/")
    assert isinstance(store, S3Store)
    assert (store.endpoint_url, store.region, store.prefix) == (s3_env["endpoint_url"], "us-east-1", "from-env")
    store.put_json("k.json", {"via": "env"})
    assert store.get_json("k.json") == {"via": "env"}
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    assert open_store(StoreSpec(uri=f"s3://{s3_env['bucket']}")).region == "eu-west-3"
    assert open_store(StoreSpec(uri=f"s3://{s3_env['bucket']}", region="ap-south-1")).region == "ap-south-1"


def test_open_store_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = open_store("file://rel/dir")
    assert isinstance(rel, FileStore) and rel.root == tmp_path / "rel" / "dir"
    assert open_store(StoreSpec(uri=f"file://{tmp_path}/abs")).root == tmp_path / "abs"
    for bad in ["ftp://host/x", "s3://", "file://", "/plain/path"]:
        with pytest.raises(ValueError, match="store uri"):
            open_store(bad)


def test_file_store_never_lists_in_flight_temp_files(make_store):
    store = make_store("file")
    store.put_bytes("a/done.txt", b"complete")
    # What a writer killed between write and rename leaves behind.
    (store.root / "a" / ".tmp-3f2a-half.txt").write_bytes(b"hal")
    assert store.list() == ["a/done.txt"]


class FlakyS3Proxy:
    """A loopback HTTP server in front of moto that fails the first `failures` requests.

    mode "503" answers 503 ServiceUnavailable; mode "drop" closes the connection without a reply.
    """

    def __init__(self, upstream: str, failures: int, mode: str):
        self.upstream = upstream.removeprefix("http://")
        self.failures, self.mode, self.requests = failures, mode, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def relay(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests += 1
                if proxy.requests <= proxy.failures:
                    if proxy.mode == "drop":
                        self.close_connection = True
                        return
                    error = b"<Error><Code>ServiceUnavailable</Code><Message>busy</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(error)))
                    self.end_headers()
                    self.wfile.write(error)
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                reply = conn.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                for name, value in reply.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["503", "drop"])
def test_s3_transient_errors_are_retried(s3_env, mode):
    proxy = FlakyS3Proxy(s3_env["endpoint_url"], failures=2, mode=mode)
    try:
        direct = open_store(f"s3://{s3_env['bucket']}/retry-{mode}", endpoint_url=s3_env["endpoint_url"])
        direct.put_bytes("obj", b"survives flaky networks")
        flaky = open_store(f"s3://{s3_env['bucket']}/retry-{mode}", endpoint_url=proxy.endpoint_url)
        assert flaky.get_bytes("obj") == b"survives flaky networks"
        assert proxy.requests == 3  # two failures, then the retry that succeeded
    finally:
        proxy.close()


def test_s3_gives_up_after_max_attempts(s3_env):
    from botocore.exceptions import ClientError

    proxy = FlakyS3Proxy(s3_env["endpoint_url"], failures=2, mode="503")
    try:
        flaky = open_store(f"s3://{s3_env['bucket']}/give-up", endpoint_url=proxy.endpoint_url, max_attempts=2)
        with pytest.raises(ClientError, match="503|ServiceUnavailable"):
            flaky.put_bytes("obj", b"x")
        assert proxy.requests == 2
    finally:
        proxy.close()


# ---------------------------------------------------------------- step manifests


def test_hash_inputs_is_canonical():
    assert hash_inputs({"a": 1, "b": [1, 2]}) == hash_inputs({"b": [1, 2], "a": 1})
    assert hash_inputs({"a": 1}) != hash_inputs({"a": 2})
    assert hash_inputs({"a": 1}) == sha(b'{"a":1}')


def test_step_is_skipped_on_rerun_with_same_inputs(store):
    calls = []

    def rank(inputs):
        step = Step(store, "run/gen-0/rank/t1", inputs)
        if step.done:
            return read_manifest(store, step.prefix)
        step.start()
        calls.append(inputs)
        store.put_json("run/gen-0/rank/t1.json", {"ranked": inputs})
        return step.finish(["run/gen-0/rank/t1.json"], extra={"pairs": 3})

    manifest = rank({"episodes": [1, 2], "seed": 0})
    assert manifest == {
        "step": "run/gen-0/rank/t1",
        "input_hash": hash_inputs({"episodes": [1, 2], "seed": 0}),
        "outputs": {"run/gen-0/rank/t1.json": store.sha256("run/gen-0/rank/t1.json")},
        "sizes": {"run/gen-0/rank/t1.json": len(store.get_bytes("run/gen-0/rank/t1.json"))},
        "extra": {"pairs": 3},
    }
    rank({"seed": 0, "episodes": [1, 2]})  # same inputs, other key order
    assert len(calls) == 1
    rank({"episodes": [1, 2], "seed": 1})  # changed inputs run again
    assert len(calls) == 2
    rank({"episodes": [1, 2], "seed": 1})
    assert len(calls) == 2
    assert store.list("run/gen-0/rank/t1/") == ["run/gen-0/rank/t1/_manifest.json"]


def test_a_step_pinning_another_steps_manifest_is_not_done_when_that_steps_output_is_damaged(store):
    """evaluate pins its rollouts' manifests: a rollout file damaged after both finished must make
    both pending, so a rerun redoes the rollout and evaluate (not done on a torn file)."""
    store.put_json("run/roll/status.json", {"outcome": "success"})
    rollout = Step(store, "run/roll", {"seed": 1})
    rollout.finish(["run/roll/status.json"])
    evaluate = Step(store, "run/eval", {"gen": 1})
    evaluate.finish(["run/roll/_manifest.json"])
    assert rollout.done and evaluate.done
    store.put_bytes("run/roll/status.json", store.get_bytes("run/roll/status.json") + b'{"extra": 1}\n')
    assert not rollout.done and not evaluate.done
    with pytest.raises(UnreadableObject, match=r"run/roll/status.json: expected JSON, Extra data"):
        store.get_json("run/roll/status.json")  # the read error names the object
    store.put_json("run/roll/status.json", {"outcome": "success"})  # redone, the same content
    assert rollout.done and evaluate.done


def test_start_drops_a_stale_manifest(store):
    old = Step(store, "s", {"v": 1})
    store.put_bytes("s/out", b"v1")
    old.finish(["s/out"])
    new = Step(store, "s", {"v": 2})
    assert old.done and not new.done
    new.start()  # a crash from here on must not leave v1's manifest over half-written v2 outputs
    assert not old.done and read_manifest(store, "s") is None


def test_finish_requires_every_output(store):
    step = Step(store, "s", {})
    store.put_bytes("s/a", b"a")
    with pytest.raises(MissingKey, match="without its output 's/b'"):
        step.finish(["s/a", "s/b"])
    assert not step.done and not store.exists("s/_manifest.json")


def test_corrupted_object_is_detected(store):
    step = Step(store, "gen-0/sft", {"n": 2})
    store.put_bytes("gen-0/sft/train.jsonl", b'{"x": 1}\n')
    store.put_bytes("gen-0/sft/val.jsonl", b'{"x": 2}\n')
    step.finish(["gen-0/sft/train.jsonl", "gen-0/sft/val.jsonl"])
    assert verify_manifest(store, "gen-0/sft")["outputs"]["gen-0/sft/val.jsonl"] == sha(b'{"x": 2}\n')

    expected, found = sha(b'{"x": 2}\n'), sha(b'{"x": 3}\n')
    store.put_bytes("gen-0/sft/val.jsonl", b'{"x": 3}\n')  # changed behind the manifest's back
    with pytest.raises(CorruptObject) as err:
        verify_manifest(store, "gen-0/sft")
    assert str(err.value).endswith(f"object 'gen-0/sft/val.jsonl' expected sha256 {expected}, found {found}")

    store.delete("gen-0/sft/val.jsonl")
    with pytest.raises(CorruptObject, match="found missing"):
        verify_manifest(store, "gen-0/sft")
    with pytest.raises(MissingKey, match="no manifest"):
        verify_manifest(store, "gen-1/sft")


def test_corruption_on_disk_is_detected(make_store):
    store = make_store("file")
    store.put_bytes("w/model.bin", b"\x01" * 1000)
    Step(store, "w", {}).finish(["w/model.bin"])
    path = store.root / "w" / "model.bin"
    flipped = bytearray(path.read_bytes())
    flipped[500] ^= 0xFF  # one bit-rotted byte
    path.write_bytes(bytes(flipped))
    with pytest.raises(CorruptObject, match=f"found {sha(bytes(flipped))}"):
        verify_manifest(store, "w")


PIPELINE = textwrap.dedent(
    """
    import sys, time
    from mass_jobs.config.run_spec import StoreSpec
    from mass_jobs.store import Step, open_store

    store = open_store(StoreSpec.model_validate_json(sys.argv[1]))
    log_path, stall = sys.argv[2], sys.argv[3] == "stall"

    def run_step(name, inputs, outputs):
        step = Step(store, f"pipe/{name}", inputs)
        if step.done:
            return
        step.start()
        with open(log_path, "a") as log:
            log.write(name + "\\n")
        for i, key in enumerate(outputs):
            store.put_bytes(key, f"{name} output {i}".encode())
            if stall and name == "second" and i == 0:
                print("stalled", flush=True)
                time.sleep(600)
        step.finish(outputs, extra={"outputs": len(outputs)})

    run_step("first", {"data": 1}, ["pipe/first/a.txt", "pipe/first/b.txt"])
    run_step("second", {"after": "first"}, ["pipe/second/a.txt", "pipe/second/b.txt"])
    print("pipeline done", flush=True)
    """
)


def test_killed_writer_leaves_no_manifest_and_rerun_redoes_only_that_step(store, tmp_path):
    script, log = tmp_path / "pipeline.py", tmp_path / "runs.log"
    script.write_text(PIPELINE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, str(script), store.spec.model_dump_json(), str(log)]

    child = subprocess.Popen([*argv, "stall"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "stalled"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert read_manifest(store, "pipe/first") is not None
    assert store.exists("pipe/second/a.txt") and not store.exists("pipe/second/b.txt")
    assert read_manifest(store, "pipe/second") is None  # a half-written step never looks done

    rerun = subprocess.run([*argv, "go"], capture_output=True, text=True, env=env, timeout=60)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == "pipeline done"
    assert log.read_text().split() == ["first", "second", "second"]  # first was skipped on rerun
    for prefix in ("pipe/first", "pipe/second"):
        assert verify_manifest(store, prefix)["extra"] == {"outputs": 2}
    assert store.get_bytes("pipe/second/b.txt") == b"second output 1"
