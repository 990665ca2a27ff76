"""The agent pod's two-container split, run here as two processes' worth of code: the harness side
(`run_episode(..., sandbox=SandboxClient)`) and the sandbox side (`mass_jobs.episodes.sandbox_service`)
over a real Unix socket. What runs in the sandbox must give the episode the local path gives it,
byte for byte, for the built-in harness and for the real qwen-code; and the recording proxy serves
only the harness that holds its token. The pod shape itself (uids, volumes, the sidecar) runs in
tests/test_argo_exec.py."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.harness import EpisodeInput, run_episode, validate_status
from mass_jobs.episodes.sandbox_client import SandboxClient
from mass_jobs.episodes.sandbox_service import SandboxError, serve
from mass_jobs.serving.proxy import RecordingProxy, read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply


@pytest.fixture
def sandbox(tmp_path):
    """A sandbox service on a Unix socket, in a thread of this process (the pod runs it as a sidecar)."""
    servers = []

    def ready(server):
        servers.append(server)
        started.set()

    started = threading.Event()
    sock, ws = tmp_path / "sbx" / "sandbox.sock", tmp_path / "sbx" / "workspace"
    sock.parent.mkdir()
    threading.Thread(target=serve, args=(sock, ws), kwargs={"ready": ready}, daemon=True).start()
    assert started.wait(10)
    yield SandboxClient(sock), ws
    servers[0].shutdown()


def builtin_script():
    return {
        "orchestrator": [
            Reply.call("delegate", assignment="write and run stats.py"),
            Reply.text("stats.py prints 2.0"),
        ],
        "worker-1": [
            Reply.call("write_file", path="stats.py", content="print(sum([1, 2, 3]) / 3)\n"),
            Reply.call("shell", command="python3 stats.py > out.txt; cat out.txt; ls"),
            Reply.call("read_file", path="seed/notes.md"),
            Reply.call("finish", summary="stats.py prints 2.0"),
        ],
    }


def episode(ep, **kw) -> EpisodeInput:
    limits = EpisodeLimits(wall_s=60, request_timeout_s=10, request_retries=0, shell_timeout_s=20)
    return EpisodeInput(
        prompt="Compute the mean.",
        endpoint=ep.endpoint,
        sampling=Sampling(),
        limits=limits,
        files={"seed/notes.md": "the numbers are 1, 2, 3\n"},
        seed=5,
        **kw,
    )


def timeless(out: Path) -> tuple[list[dict], dict]:
    trace = [
        {k: v for k, v in r.items() if k not in ("started_at", "duration_s")} for r in read_trace(out / "trace.jsonl")
    ]
    status = {k: v for k, v in json.loads((out / "status.json").read_text()).items() if k != "timings"}
    return trace, status


def archive(workspace: Path) -> bytes:
    from mass_jobs.store.archive import write_dir_archive

    buf = io.BytesIO()
    write_dir_archive(workspace, buf)
    return buf.getvalue()


def test_builtin_episode_in_the_sandbox_equals_the_local_one(scripted_endpoint, sandbox, tmp_path):
    client, sandbox_ws = sandbox
    local = run_episode(episode(scripted_endpoint(builtin_script())), tmp_path / "a" / "ws", tmp_path / "a" / "out")
    remote = run_episode(
        episode(scripted_endpoint(builtin_script())), tmp_path / "b" / "ws", tmp_path / "b" / "out", sandbox=client
    )
    validate_status(remote.status)
    assert remote.outcome == local.outcome == "success", (remote.reason, local.reason)
    assert timeless(tmp_path / "b" / "out") == timeless(tmp_path / "a" / "out")
    trace, status = timeless(tmp_path / "b" / "out")
    assert status["counts"] == {"turns": 6, "tool_calls": 5, "delegations": 1, "agents": 2, "tool_errors": 0}
    shell_result = [m["content"] for m in trace[3]["request"]["messages"] if m["role"] == "tool"][-1]
    assert "2.0" in shell_result and "stats.py" in shell_result
    # the tools worked in the sandbox's workspace; the harness got it back whole
    assert (sandbox_ws / "out.txt").read_text() == "2.0\n"
    assert archive(tmp_path / "b" / "ws") == archive(tmp_path / "a" / "ws") == archive(sandbox_ws)


def test_qwen_code_runs_in_the_sandbox(scripted_endpoint, sandbox, tmp_path):
    from tests.fixtures.scripted import MAIN, SUB

    client, sandbox_ws = sandbox
    code = "print(sum([1, 2, 3]) / 3)\n"
    ep = scripted_endpoint(
        {
            SUB: [
                Reply.call("write_file", file_path=str(sandbox_ws / "analysis.py"), content=code),
                Reply.text("Wrote analysis.py"),
            ],
            MAIN: [
                Reply.call(
                    "agent", description="write code", prompt="Write analysis.py.", subagent_type="general-purpose"
                ),
                Reply.text("Done: analysis.py prints 2.0"),
            ],
        }
    )
    inp = EpisodeInput(
        prompt="Write analysis.py.",
        endpoint=ep.endpoint,
        harness="qwen-code",
        seed=3,
        limits=EpisodeLimits(wall_s=90, request_retries=0, request_timeout_s=30),
        sampling=Sampling(max_output_tokens=256),
    )
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out", sandbox=client)
    assert (result.outcome, result.final_report) == ("success", "Done: analysis.py prints 2.0"), result.reason
    trace = read_trace(tmp_path / "out" / "trace.jsonl")
    assert len(trace) == 4 and all(r["status"] == 200 for r in trace)
    assert result.status["counts"] == {"turns": 4, "tool_calls": 2, "delegations": 1, "agents": 2}
    # qwen-code wrote into the sandbox's workspace, which came back to the harness
    assert (tmp_path / "ws" / "analysis.py").read_text() == code == (sandbox_ws / "analysis.py").read_text()
    # it reached the model only through the proxy, with the proxy's token, never passed upstream
    assert all(r["headers"].get("authorization") is None for r in ep.requests)


def test_proxy_serves_only_the_holder_of_its_token(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"*": [Reply.text("hello")]})
    trace = tmp_path / "t.jsonl"
    with RecordingProxy(ep.endpoint, trace, client_token="s3cret-token") as px:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        url = px.endpoint.url("chat/completions")
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-token"}):
            r = httpx.post(url, json=body, headers=headers)
            assert r.status_code == 401, (headers, r.text)
        assert read_trace(trace) == [] and ep.requests == []  # refused calls are neither forwarded nor recorded
        assert httpx.get(px.endpoint.url("models")).status_code == 401
        ok = httpx.post(url, json=body, headers={"authorization": f"Bearer {px.endpoint.api_key()}"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "hello"
    assert len(read_trace(trace)) == 1
    assert "authorization" not in {k.lower() for k in ep.requests[0]["headers"]}  # the token stays on this side


def test_a_sandbox_that_never_comes_up_is_an_infra_error_episode(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(builtin_script())
    from mass_jobs.episodes.sandbox_client import CONNECT_RETRY_S

    client = SandboxClient(tmp_path / "nobody.sock", ready_s=1)
    started = time.monotonic()
    result = run_episode(episode(ep), tmp_path / "ws", tmp_path / "out", sandbox=client)
    # ready_s bounds the wait: a connect's own retry (for a socket being bound again) does not outlast it
    assert time.monotonic() - started < CONNECT_RETRY_S
    validate_status(result.status)
    assert result.outcome == "infra_error" and "did not come up within 1s" in result.reason
    assert read_trace(tmp_path / "out" / "trace.jsonl") == [] and ep.requests == []


def hostile_archive() -> bytes:
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"pwned"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_workspace_is_seeded_once_and_what_comes_back_is_extracted_as_hostile(sandbox, tmp_path):
    import socketserver

    client, _ = sandbox
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "a.txt").write_text("A")
    client.put_workspace(tmp_path / "seed")
    with pytest.raises(SandboxError, match="seeded once"):
        client.put_workspace(tmp_path / "seed")
    assert client._call("PUT", "/workspace", b"not a tar.gz")[0] == 500
    client.get_workspace(tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["a.txt"]

    # the agent's code may replace the service with its own: its archive is refused, nothing written
    body = hostile_archive()

    class Hostile(socketserver.StreamRequestHandler):
        def handle(self):
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    fake = tmp_path / "fake.sock"
    server = socketserver.UnixStreamServer(str(fake), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SandboxError, match="refused"):
            SandboxClient(fake).get_workspace(tmp_path / "ws" / "again")
    finally:
        server.shutdown()
    assert not (tmp_path / "ws").exists() and not (tmp_path / "escaped.txt").exists()
