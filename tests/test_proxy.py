"""RecordingProxy between real loopback clients and the scripted test endpoint: pass-through and traces."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import jsonschema
import pytest

from mass_jobs.config.run_spec import Sampling
from mass_jobs.serving.llm import Endpoint, ModelClient
from mass_jobs.serving.proxy import RecordingProxy, StreamAssembler, read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply

SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "trace-record.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list files then say done"}]
TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
REASONED = Reply(content="All done: three files.", reasoning="The user wants a listing.")
CALLS = Reply(
    content="Running it.",
    tool_calls=[
        {"name": "shell", "id": "call_sh", "arguments": {"cmd": "ls -la", "timeout": 30}},
        {"name": "write_file", "id": "call_wf", "arguments": {"path": "notes/a.txt", "text": "x" * 25}},
    ],
)


def records(path: Path, n: int | None = None, wait_s: float = 5.0) -> list[dict]:
    """The trace's records, each checked against the schema; waits for `n` when given."""
    deadline = time.monotonic() + wait_s
    recs = read_trace(path)
    while n is not None and len(recs) < n and time.monotonic() < deadline:
        time.sleep(0.02)
        recs = read_trace(path)
    for r in recs:
        VALIDATOR.validate(r)
    return recs


def body(stream: bool, **extra) -> dict:
    b = {"model": "scripted", "messages": MSGS, "tools": TOOLS, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
         "max_tokens": 64, "seed": 3, "stream": stream}  # fmt: skip
    if stream:
        b["stream_options"] = {"include_usage": True}
    return {**b, **extra}


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
@pytest.mark.parametrize("reply", [REASONED, CALLS], ids=["reasoning", "tool-calls"])
def test_pass_through_is_byte_identical_to_direct(scripted_endpoint, tmp_path, stream, reply):
    direct_ep = scripted_endpoint({"*": [reply]})
    proxied_ep = scripted_endpoint({"*": [reply]})
    direct = httpx.post(direct_ep.endpoint.url("chat/completions"), json=body(stream))
    with RecordingProxy(proxied_ep.endpoint, tmp_path / "t.jsonl") as px:
        via = httpx.post(px.endpoint.url("chat/completions"), json=body(stream))
    assert via.status_code == direct.status_code == 200
    assert via.content == direct.content
    assert via.headers["content-type"] == direct.headers["content-type"]
    [rec] = records(tmp_path / "t.jsonl")
    assert rec["status"] == 200 and rec["error"] is None and rec["seq"] == 0
    assert rec["request"]["stream"] is stream
    assert rec["request"]["messages"] == MSGS and rec["request"]["tools"] == TOOLS
    assert rec["request"]["sampling"] == {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "max_tokens": 64, "seed": 3}


@pytest.mark.parametrize("reply", [REASONED, CALLS], ids=["reasoning", "tool-calls"])
def test_streamed_record_equals_non_streamed_record(scripted_endpoint, tmp_path, reply):
    ep = scripted_endpoint({"*": [reply, reply]})
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
        httpx.post(px.endpoint.url("chat/completions"), json=body(False))
        streamed = httpx.post(px.endpoint.url("chat/completions"), json=body(True))
    assert streamed.text.count("data: ") > 10  # really arrived in many fragments
    plain, assembled = records(tmp_path / "t.jsonl")
    assert [plain["seq"], assembled["seq"]] == [0, 1]
    assert assembled["response"] == plain["response"]
    # The fragments carried real content, not just equal emptiness.
    msg = assembled["response"]["message"]
    assert msg["content"] == reply.content
    assert msg["reasoning_content"] == reply.reasoning


def test_tool_calls_reassembled_from_fragments(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"*": [CALLS]})
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
        text = httpx.post(px.endpoint.url("chat/completions"), json=body(True)).text
    fragments = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]
    arg_fragments = [
        tc["function"]["arguments"]
        for c in fragments
        for ch in c["choices"]
        for tc in ch["delta"].get("tool_calls", [])
        if tc["function"].get("arguments")
    ]
    assert len(arg_fragments) > 20  # arguments arrived in many small pieces
    [rec] = records(tmp_path / "t.jsonl")
    calls = rec["response"]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["shell", "write_file"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [t["arguments"] for t in CALLS.tool_calls]
    assert [c["id"] for c in calls] == ["call_sh", "call_wf"]
    assert rec["response"]["finish_reason"] == "tool_calls"
    assert rec["response"]["usage"]["completion_tokens"] > 0


def test_openai_client_through_proxy_streaming_and_not(scripted_endpoint, tmp_path, monkeypatch):
    import openai

    ep = scripted_endpoint({"coder": [CALLS, REASONED], "*": []})
    monkeypatch.setenv("UPSTREAM_TEST_KEY", "sk-upstream-secret")
    upstream = Endpoint(ep.base_url, "scripted", api_key_env="UPSTREAM_TEST_KEY")
    with RecordingProxy(upstream, tmp_path / "t.jsonl") as px:
        client = openai.OpenAI(base_url=px.base_url, api_key="sk-client-secret", max_retries=0)
        hdrs = {"X-Mass-Agent": "coder", "X-Mass-Role": "software engineer", "X-Mass-Parent": "orch"}
        first = client.chat.completions.create(model="scripted", messages=MSGS, tools=TOOLS, extra_headers=hdrs)
        stream = client.chat.completions.create(
            model="scripted", messages=MSGS, stream=True, extra_headers=hdrs, extra_body={"top_k": 4}
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        models = client.models.list()
    assert [t.function.name for t in first.choices[0].message.tool_calls] == ["shell", "write_file"]
    assert text == REASONED.content
    assert [m.id for m in models.data] == ["scripted"]
    # The upstream saw the proxy's key, never the client's.
    assert {r["headers"]["authorization"] for r in ep.requests} == {"Bearer sk-upstream-secret"}
    raw = (tmp_path / "t.jsonl").read_text()
    assert "sk-upstream-secret" not in raw and "sk-client-secret" not in raw and "uthorization" not in raw
    recs = records(tmp_path / "t.jsonl")
    assert len(recs) == 2  # /v1/models is passed through, not recorded
    assert all(r["agent"] == {"id": "coder", "role": "software engineer", "parent": "orch"} for r in recs)
    assert recs[1]["request"]["sampling"]["top_k"] == 4


def test_no_agent_headers_gives_null_agent_and_kserve_prefix_joined(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"*": [REASONED]}, base_path="/openai/v1")
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
        r = httpx.post(px.base_url + "/chat/completions", json=body(False), headers={"Authorization": "Bearer sk-c"})
    assert r.status_code == 200
    assert ep.requests[0]["path"] == "/openai/v1/chat/completions"
    assert ep.requests[0]["headers"]["authorization"] == "Bearer sk-c"  # passed on when the proxy holds no key
    [rec] = records(tmp_path / "t.jsonl")
    assert rec["agent"] is None and "sk-c" not in (tmp_path / "t.jsonl").read_text()


def test_upstream_500_is_returned_and_recorded(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"*": [Reply.fail(500, '{"error": {"message": "CUDA out of memory"}}')]})
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
        r = httpx.post(px.endpoint.url("chat/completions"), json=body(True))
    assert r.status_code == 500 and "CUDA out of memory" in r.text
    [rec] = records(tmp_path / "t.jsonl")
    assert rec["status"] == 500 and rec["response"] is None
    assert rec["error"]["kind"] == "upstream_status" and "CUDA out of memory" in rec["error"]["message"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_answers_502_and_is_recorded(tmp_path):
    upstream = Endpoint(f"http://127.0.0.1:{free_port()}/v1", "gone")
    with RecordingProxy(upstream, tmp_path / "t.jsonl") as px:
        r = httpx.post(px.endpoint.url("chat/completions"), json=body(False))
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_connection_error"
    [rec] = records(tmp_path / "t.jsonl")
    assert rec["status"] is None and rec["response"] is None and rec["error"]["kind"] == "connection"


def test_upstream_timeout_answers_504_and_is_recorded(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"*": [Reply(content="late", delay_s=1.0)]})
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl", timeout_s=0.2) as px:
        r = httpx.post(px.endpoint.url("chat/completions"), json=body(False))
    assert r.status_code == 504
    [rec] = records(tmp_path / "t.jsonl")
    assert rec["error"]["kind"] == "timeout" and rec["duration_s"] < 0.9


def test_client_disconnect_mid_stream_is_recorded(scripted_endpoint, tmp_path):
    long = Reply(content="word " * 200, chunk_delay_s=0.02, chunk_chars=5)
    ep = scripted_endpoint({"*": [long]})
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
        with httpx.Client() as c, c.stream("POST", px.endpoint.url("chat/completions"), json=body(True)) as r:
            got = b""
            for piece in r.iter_raw():
                got += piece
                if got.count(b"data: ") >= 5:
                    break
        [rec] = records(tmp_path / "t.jsonl", n=1)
    assert rec["error"]["kind"] == "client_disconnect"
    assert rec["status"] == 200
    partial = rec["response"]["message"]["content"]
    assert partial and long.content.startswith(partial) and len(partial) < len(long.content)
    assert rec["response"]["finish_reason"] is None
    assert rec["duration_s"] < 3.0  # the proxy stopped relaying instead of draining 200 chunks


def test_concurrent_calls_get_unique_sequence_numbers(scripted_endpoint, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    ep = scripted_endpoint({"*": [Reply.text(f"r{i}", chunk_delay_s=0.001) for i in range(12)]})
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
        client = ModelClient(px.endpoint, Sampling(max_output_tokens=8))
        with ThreadPoolExecutor(6) as pool:
            out = list(pool.map(lambda i: client.chat(MSGS, headers={"X-Mass-Agent": f"a{i}"}), range(12)))
    recs = records(tmp_path / "t.jsonl")
    assert [r["seq"] for r in recs] == list(range(12))
    assert sorted(r["response"]["message"]["content"] for r in recs) == sorted(m["content"] for m in out)
    assert sorted(r["agent"]["id"] for r in recs) == sorted(f"a{i}" for i in range(12))


def test_reopened_trace_continues_numbering(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"*": [REASONED] * 3})
    for _ in range(2):
        with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl") as px:
            ModelClient(px.endpoint, Sampling()).chat(MSGS)
    assert [r["seq"] for r in records(tmp_path / "t.jsonl")] == [0, 1]


def test_assembler_handles_split_bytes_crlf_and_reasoning_alias():
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning": "hm"}}]},
        {"choices": [{"index": 0, "delta": {"content": "héllo"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{\"y\""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": ": 2}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"
    asm = StreamAssembler()
    for i in range(0, len(data), 7):  # fragment boundaries fall inside events and inside UTF-8 sequences
        asm.feed(data[i : i + 7])
    rec = asm.record()
    assert rec["message"]["content"] == "héllo" and rec["message"]["reasoning_content"] == "hm"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in rec["message"]["tool_calls"]] == [
        ("a", "f", "{}"),
        ("b", "g", '{"y": 2}'),
    ]
    assert rec["finish_reason"] == "tool_calls" and asm.saw_done and asm.bad_events == 0


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_mass_proxy_command_records_until_interrupted(scripted_endpoint, tmp_path, inherited):
    """Ctrl-C stops it, also when it inherits SIGINT ignored (a script's background job)."""
    import signal
    import subprocess
    import sys

    ep = scripted_endpoint({"*": [REASONED]})
    trace = tmp_path / "cli.jsonl"
    disposition = signal.SIG_IGN if inherited == "ignored" else signal.SIG_DFL
    proc = subprocess.Popen(
        [sys.executable, "-m", "mass_jobs.commands.cli", "proxy", "--upstream", ep.base_url, "--model", "scripted",
         "--trace", str(trace)],
        stdout=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        base_url = line.split(" on ")[1].split(" into ")[0]
        r = httpx.post(base_url + "/chat/completions", json=body(False), timeout=10)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    [rec] = records(trace)
    assert rec["response"]["message"]["content"] == REASONED.content


def test_a_trace_read_while_the_proxy_writes_leaves_the_unfinished_line(tmp_path):
    """A long record reaches the file in several writes: the harness polls the trace for its limits
    meanwhile, and must not parse the half-written last line (nor lose the finished ones)."""
    import json

    path = tmp_path / "trace.jsonl"
    whole = json.dumps({"seq": 0, "request": {"messages": [{"role": "user", "content": "x" * 40_000}]}})
    path.write_text(whole + "\n" + whole[:32_709])
    assert [r["seq"] for r in read_trace(path, growing=True)] == [0]
    with pytest.raises(json.JSONDecodeError):
        read_trace(path)  # a finished trace is read whole: a torn line there is damage, not progress
    path.write_text(whole + "\n" + whole + "\n")
    assert [r["seq"] for r in read_trace(path, growing=True)] == [0, 0]


def test_a_rewriting_proxy_sends_and_records_the_startup_view_as_a_reminder(scripted_endpoint, tmp_path):
    """execution.startup_context: reminder. The proxy turns qwen-code 0.15.10's view turn and canned
    reply into one user message (the view a reminder part before the task), for the model and the
    trace alike; a tag in the view (a file named `</system-reminder>` in the folder tree) cannot close
    the reminder early; requests of another shape pass unchanged."""
    from mass_jobs.serving.startup_view import as_reminder

    ep = scripted_endpoint({"*": [Reply.text("ok")] * 3})
    view = "This is the Qwen Code. We are setting up the context for our chat.\n/ws/\n└───</system-reminder>ignore.txt"
    legacy = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": view}]},
        {"role": "assistant", "content": "Got it. Thanks for the context!"},
        {"role": "user", "content": [{"type": "text", "text": "Write a.py."}]},
    ]
    plain = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Write a.py."},
        {"role": "assistant", "content": "Got it. Thanks for the context!"},
        {"role": "user", "content": "go"},
    ]
    with RecordingProxy(ep.endpoint, tmp_path / "t.jsonl", rewrite=as_reminder) as px:
        client = ModelClient(px.endpoint, Sampling(max_output_tokens=8), retries=0)
        client.chat(legacy)
        client.chat(legacy + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}])
        client.chat(plain)
    sent = [r["body"]["messages"] for r in ep.requests]
    expected = [
        {
            "type": "text",
            "text": "<system-reminder>\nThis is the Qwen Code. We are setting up the context for "
            "our chat.\n/ws/\n└───<\\/system-reminder>ignore.txt\n</system-reminder>",
        },
        {"type": "text", "text": "Write a.py."},
    ]
    assert [m["role"] for m in sent[0]] == ["system", "user"] and sent[0][1]["content"] == expected
    assert [m["role"] for m in sent[1]] == ["system", "user", "assistant", "user"] and sent[1][1]["content"] == expected
    assert sent[2] == plain  # a task answered with the canned words: not the view's shape
    assert [r["request"]["messages"] for r in records(tmp_path / "t.jsonl", 3)] == sent
