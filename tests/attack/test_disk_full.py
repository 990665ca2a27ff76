"""A full disk during an episode: the trace keeps only whole lines (a torn one is cut off), no call
is served once its record could not be written, the episode ends infra_error with a status that
is whole or absent, and `mass episode` exits 1 naming the full device, never a traceback. The
disk is a small tmpfs mounted for the test (root, as in CI)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mass_jobs.serving.proxy import RecordingProxy, read_trace
from tests.attack.test_endpoint_faults import FINISH, RawEndpoint, completion


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill the disk, then free `leave` bytes of it again."""
    import os

    fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        os.close(fd)


def test_a_full_disk_leaves_whole_trace_lines_and_refuses_later_calls(small_disk):
    reply = completion({"role": "assistant", "content": "y" * 30000})
    upstream = RawEndpoint(reply)
    trace = small_disk / "trace.jsonl"
    try:
        with RecordingProxy(upstream=upstream.endpoint, trace_path=trace) as px:
            url = f"{px.base_url}/chat/completions"
            body = {"model": "raw", "messages": [{"role": "user", "content": "hi"}]}
            assert httpx.post(url, json=body, timeout=30).status_code == 200  # recorded whole
            for _ in range(200):  # the record is written once the reply went out
                if read_trace(trace):
                    break
                time.sleep(0.01)
            fill(small_disk, leave=20000)  # the next record (about 30 kB) no longer fits
            httpx.post(url, json=body, timeout=30)
            later = httpx.post(url, json=body, timeout=30)
            assert px.write_error is not None
    finally:
        upstream.close()
    assert later.status_code == 507 and "trace_unwritable" in later.text
    lines = trace.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x) for x in lines[:-1])  # no torn last line
    assert [r["seq"] for r in read_trace(trace)] == [0]


def test_mass_episode_on_a_full_disk_exits_1_naming_it(small_disk, tmp_path):
    from mass_jobs.config.run_spec import EpisodeLimits, Sampling
    from mass_jobs.episodes.harness import EpisodeInput, episode_file_json

    upstream = RawEndpoint(completion({"role": "assistant", "tool_calls": [FINISH]}))
    try:
        inp = EpisodeInput(
            prompt="p",
            endpoint=upstream.endpoint,
            limits=EpisodeLimits(wall_s=60, request_retries=0),
            sampling=Sampling(max_output_tokens=64, context_length=4096),
            seed=1,
        )
        in_dir = tmp_path / "in"
        in_dir.mkdir()
        (in_dir / "episode.json").write_text(json.dumps(episode_file_json(inp)))
        fill(small_disk, leave=0)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mass_jobs.commands.cli",
                "episode",
                "--in",
                str(in_dir),
                "--out",
                str(small_disk / "out"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        upstream.close()
    assert out.returncode == 1, out.stderr[-2000:]
    assert "no space left on the device" in out.stderr and "Traceback" not in out.stderr
    status = small_disk / "out" / "status.json"
    assert not status.exists() or json.loads(status.read_text())["outcome"] == "infra_error"


def test_an_episode_whose_trace_fills_the_disk_ends_infra_error(small_disk):
    from mass_jobs.config.run_spec import EpisodeLimits, Sampling
    from mass_jobs.episodes.harness import EpisodeInput, run_episode

    # a long reply the model keeps giving: its record does not fit in what is left
    upstream = RawEndpoint(completion({"role": "assistant", "content": "z" * 40000}))
    try:
        inp = EpisodeInput(
            prompt="p",
            endpoint=upstream.endpoint,
            limits=EpisodeLimits(wall_s=60, request_retries=0),
            sampling=Sampling(max_output_tokens=64, context_length=4096),
            seed=1,
        )
        fill(small_disk, leave=24000)
        result = run_episode(inp, small_disk / "ws", small_disk / "out")
    finally:
        upstream.close()
    assert result.outcome == "infra_error" and "the trace could not be written" in result.reason, result.reason
    status = json.loads((small_disk / "out" / "status.json").read_text())
    assert status["outcome"] == "infra_error"
    trace = small_disk / "out" / "trace.jsonl"
    assert not trace.exists() or trace.read_bytes() in (b"",) or trace.read_bytes().endswith(b"\n")
