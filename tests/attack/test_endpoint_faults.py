"""Endpoint faults: whatever a model endpoint answers (absurd usage, tool_calls of any shape,
messages that are not objects, broken JSON, nesting past any sense, lone surrogates, malformed
streams, error statuses), the episode ends classified with a valid status.json, and the recording
proxy answers with the upstream's own status (or 502/504), never a 500 of its own."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.harness import OUTCOMES, EpisodeInput, run_episode, validate_status
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.proxy import RecordingProxy, read_trace


class LoopbackEndpoint:
    """An HTTP server on loopback serving `handler`, its API root as `endpoint`."""

    def _serve(self, handler) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = Endpoint(f"http://127.0.0.1:{self.server.server_address[1]}/v1", "raw")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class RawEndpoint(LoopbackEndpoint):
    """An HTTP server that answers every POST with the same raw bytes, status and content type."""

    def __init__(self, body: bytes, status: int = 200, content_type: str = "application/json"):
        answer = (body, status, content_type)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                data, code, ctype = answer
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._serve(Handler)


def completion(message, usage=None, finish="stop", **extra) -> bytes:
    doc = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        doc["usage"] = usage
    doc.update(extra)
    return json.dumps(doc).encode()


FINISH = {"id": "c1", "type": "function", "function": {"name": "finish", "arguments": '{"summary": "done"}'}}
TEXT = {"role": "assistant", "content": "done"}
SSE = "text/event-stream"

FAULTS = {
    "usage-negative": (completion(TEXT, {"prompt_tokens": -5, "completion_tokens": -1}),),
    "usage-absurd": (completion(TEXT, {"prompt_tokens": 10**30, "completion_tokens": 10**20}),),
    "usage-strings": (completion(TEXT, {"prompt_tokens": "12", "completion_tokens": "many"}),),
    "usage-floats-bools": (completion(TEXT, {"prompt_tokens": 1.5, "completion_tokens": True}),),
    "usage-list": (completion(TEXT, [1, 2]),),
    "usage-number": (completion(TEXT, -1),),
    "tool_calls-object": (completion({"role": "assistant", "tool_calls": FINISH}),),
    "tool_calls-string": (completion({"role": "assistant", "tool_calls": "finish"}),),
    "tool_calls-number": (completion({"role": "assistant", "tool_calls": 42}),),
    "tool_calls-mixed-items": (completion({"role": "assistant", "tool_calls": [1, "x", None, [FINISH]]}),),
    "tool_calls-function-string": (
        completion({"role": "assistant", "tool_calls": [{"id": "a", "function": "finish"}]}),
    ),
    "tool_calls-name-number": (
        completion({"role": "assistant", "tool_calls": [{"function": {"name": 7, "arguments": "{}"}}]}),
    ),
    "tool_calls-args-object": (
        completion(
            {"role": "assistant", "tool_calls": [{"function": {"name": "finish", "arguments": {"summary": "x"}}}]}
        ),
    ),
    "tool_calls-args-list": (
        completion({"role": "assistant", "tool_calls": [{"function": {"name": "finish", "arguments": [1]}}]}),
    ),
    "tool_calls-id-object": (completion({"role": "assistant", "tool_calls": [{**FINISH, "id": {"a": 1}}]}),),
    "content-list-of-parts": (completion({"role": "assistant", "content": [{"type": "text", "text": "done"}]}),),
    "content-number": (completion({"role": "assistant", "content": 12345}),),
    "content-lone-surrogate": (b'{"choices":[{"message":{"content":"bad \\ud800 text"},"finish_reason":"stop"}]}',),
    "args-lone-surrogate": (
        b'{"choices":[{"message":{"tool_calls":[{"function":{"name":"finish","arguments":"{\\"summary\\": \\"\\\\ud800\\"}"}}]}}]}',
    ),
    "finish_reason-number": (completion(TEXT, finish=5),),
    "message-string": (completion("hello"),),
    "message-list": (completion([TEXT]),),
    "message-null": (completion(None),),
    "choices-number-item": (b'{"choices": [42]}',),
    "choices-object": (b'{"choices": {"0": {"message": {"content": "x"}}}}',),
    "choices-empty": (b'{"choices": []}',),
    "no-choices": (b'{"id": "x"}',),
    "body-array": (b"[1, 2, 3]",),
    "body-not-json": (b"<html>gateway</html>",),
    "body-empty": (b"",),
    "body-deep-nesting": (b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",),
    "body-invalid-utf8": (b'{"choices":[{"message":{"content":"\xff\xfe"}}]}',),
    "status-500": (b'{"error": "boom"}', 500),
    "status-404": (b"not here", 404),
    "status-302": (b"", 302),
    "stream-garbage": (b"data: {not json}\n\ndata: [1,2]\n\n", 200, SSE),
    "stream-bad-shapes": (
        b'data: {"choices": 5}\n\ndata: {"choices": [{"delta": "x"}]}\n\n'
        b'data: {"choices": [{"delta": {"tool_calls": [{"index": "a"}, 3, {"index": 0, "function": {"arguments": 5}}]}}]}\n\n'
        b"data: [DONE]\n\n",
        200,
        SSE,
    ),
    "stream-lone-surrogate": (
        b'data: {"choices": [{"delta": {"content": "\\ud800"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n',
        200,
        SSE,
    ),
}


@pytest.fixture
def raw_endpoint():
    made = []

    def make(body: bytes, status: int = 200, content_type: str = "application/json") -> RawEndpoint:
        made.append(RawEndpoint(body, status, content_type))
        return made[-1]

    yield make
    for ep in made:
        ep.close()


LIMITS = EpisodeLimits(turns_per_agent=2, tool_calls=6, wall_s=60, request_timeout_s=15, request_retries=0)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_endpoint_answer_ends_as_a_classified_episode(raw_endpoint, tmp_path, fault):
    ep = raw_endpoint(*FAULTS[fault])
    inp = EpisodeInput(prompt="Do it.", endpoint=ep.endpoint, limits=LIMITS, sampling=Sampling(max_output_tokens=16))
    res = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    validate_status(status)
    assert status["outcome"] in OUTCOMES and status == res.status
    assert min(status["tokens"].values()) >= 0 and max(status["tokens"].values()) <= 10**8 * 4
    if status["outcome"] == "infra_error":  # the endpoint's own fault, not a harness crash
        assert "harness error" not in status["reason"] and "did not validate" not in status["reason"]
    if FAULTS[fault][1:2] != (500,):
        assert "HTTP 500" not in status["reason"]  # the proxy never failed on its own
    trace = read_trace(tmp_path / "out" / "trace.jsonl")
    assert trace and all(r["response"] is not None or r["error"] is not None for r in trace)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_proxy_answers_the_upstreams_status_never_its_own_500(raw_endpoint, tmp_path, fault):
    ep = raw_endpoint(*FAULTS[fault])
    upstream_status = (FAULTS[fault][1:2] or (200,))[0]
    with RecordingProxy(upstream=ep.endpoint, trace_path=tmp_path / "trace.jsonl", timeout_s=15) as px:
        r = httpx.post(
            px.endpoint.url("chat/completions"),
            json={"model": "raw", "messages": [{"role": "user", "content": "x"}]},
            timeout=30,
        )
    assert r.status_code == upstream_status
    (rec,) = read_trace(tmp_path / "trace.jsonl")
    assert rec["status"] == upstream_status and (rec["response"] is not None or rec["error"] is not None)


def test_line_separators_in_an_answer_keep_one_trace_record_per_line(raw_endpoint, tmp_path):
    """U+2028, U+2029 and NEL are line breaks to str.splitlines(), which several trace readers use."""
    from mass_jobs.episodes.audit import audit_episode

    ep = raw_endpoint(completion({"role": "assistant", "content": "a\u2028b\u2029c\x85d"}))
    inp = EpisodeInput(prompt="x\u2028y", endpoint=ep.endpoint, limits=LIMITS, sampling=Sampling(max_output_tokens=16))
    res = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    text = (tmp_path / "out" / "trace.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert len(records) == 1 and records[0]["response"]["message"]["content"] == "a\u2028b\u2029c\x85d"
    assert res.outcome == "no_work" and res.final_report == "a\u2028b\u2029c\x85d"
    assert audit_episode(tmp_path / "out").calls == 1


class StallingEndpoint:
    """Answers headers promising a body, then sends a byte now and then, forever (or hangs up)."""

    def __init__(self, hang_up: bool = False):
        stop = self.stop = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "1000000")
                self.end_headers()
                self.wfile.write(b'{"choices": [')
                self.wfile.flush()
                if hang_up:
                    return
                while not stop.wait(0.5):
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = Endpoint(f"http://127.0.0.1:{self.server.server_address[1]}/v1", "stall")

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("hang_up", [False, True], ids=["trickle", "hang-up"])
def test_a_stalling_endpoint_ends_the_episode_at_its_wall_limit(tmp_path, hang_up):
    ep = StallingEndpoint(hang_up)
    limits = EpisodeLimits(turns_per_agent=2, wall_s=3, request_timeout_s=60, request_retries=0)
    inp = EpisodeInput(prompt="x", endpoint=ep.endpoint, limits=limits, sampling=Sampling(max_output_tokens=16))
    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault("r", run_episode(inp, tmp_path / "ws", tmp_path / "out")), daemon=True
    )
    try:
        t.start()
        t.join(120)
        assert not t.is_alive(), "the episode outlived its wall limit by minutes"
    finally:
        ep.close()
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    validate_status(status)
    assert status["outcome"] == ("infra_error" if hang_up else "timeout"), status["reason"]


class GzipEndpoint(LoopbackEndpoint):
    """Answers gzip-compressed whenever the request accepts gzip (as many servers behind a CDN do),
    or always with `always`; streamed or not as the request asks."""

    def __init__(self, always: bool = False):
        import gzip

        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                accept = self.headers.get("accept-encoding") or ""
                seen.append(accept)
                if body.get("stream"):
                    data = (
                        b'data: {"choices": [{"delta": {"content": "done"}, "finish_reason": "stop"}]}\n\n'
                        b"data: [DONE]\n\n"
                    )
                    ctype = SSE
                else:
                    data, ctype = completion(TEXT), "application/json"
                compress = always or "gzip" in accept
                if compress:
                    data = gzip.compress(data)
                self.send_response(200)
                self.send_header("content-type", ctype)
                if compress:
                    self.send_header("content-encoding", "gzip")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.seen = seen
        self._serve(Handler)


@pytest.mark.parametrize("always", [False, True], ids=["when-accepted", "always"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_gzip_answering_endpoint_is_recorded_and_relayed_as_text(tmp_path, always, stream):
    """The proxy asks for identity; an answer compressed anyway is relayed decoded, without a
    Content-Encoding the bytes no longer have, and recorded as text."""
    ep = GzipEndpoint(always=always)
    try:
        with RecordingProxy(upstream=ep.endpoint, trace_path=tmp_path / "trace.jsonl", timeout_s=15) as px:
            r = httpx.post(
                px.endpoint.url("chat/completions"),
                timeout=30,
                json={"model": "raw", "stream": stream, "messages": [{"role": "user", "content": "x"}]},
            )
        assert r.status_code == 200 and "content-encoding" not in r.headers
        assert ("done" in r.text) if stream else r.json()["choices"][0]["message"]["content"] == "done"
        (rec,) = read_trace(tmp_path / "trace.jsonl")
        assert rec["response"]["message"]["content"] == "done" and rec["error"] is None
        assert ep.seen == ["identity"]
        if not stream:  # a whole built-in episode through it ends as the model said
            inp = EpisodeInput(
                prompt="Do it.", endpoint=ep.endpoint, limits=LIMITS, sampling=Sampling(max_output_tokens=16)
            )
            res = run_episode(inp, tmp_path / "ws", tmp_path / "out")
            assert (res.outcome, res.final_report) == ("no_work", "done")  # a text answer: no tool call
    finally:
        ep.close()


# ---------------------------------------------------------------- replies without end


class EndlessEndpoint(LoopbackEndpoint):
    """Answers every POST with a body (or an SSE stream) that never ends: `piece` forever."""

    def __init__(self, piece: bytes, content_type: str):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    while True:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                except OSError:  # the proxy stopped reading: the point
                    pass

            def log_message(self, *args):
                pass

        self._serve(Handler)


REQUEST = {"model": "raw", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("kind", ["body", "stream", "stream-without-separators"])
def test_a_reply_without_end_is_cut_at_its_byte_limit(tmp_path, kind):
    """Endless bodies and streams (one without any event separator, once quadratic to assemble)
    are read up to limits.reply_bytes, the call ends reply_too_large, and the trace line holds at
    most that much: nothing buffered or recorded past it."""
    delta = json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 900}}]})
    piece = {
        "body": b"[" + b"0," * 32768,
        "stream": f"data: {delta}\n\n".encode(),
        "stream-without-separators": b"data: " + b"x" * 65536,
    }[kind]
    upstream = EndlessEndpoint(piece, "application/json" if kind == "body" else SSE)
    limit = 4 * 2**20
    try:
        with RecordingProxy(upstream=upstream.endpoint, trace_path=tmp_path / "t.jsonl", max_reply_bytes=limit) as px:
            body = {**REQUEST, "stream": kind != "body"}
            with httpx.Client(timeout=120) as client:
                resp = client.post(f"{px.base_url}/chat/completions", json=body)
                received = len(resp.content)
    finally:
        upstream.close()
    (rec,) = read_trace(tmp_path / "t.jsonl")
    assert rec["error"]["kind"] == "reply_too_large", rec["error"]
    assert received <= limit + 2**16
    line = (tmp_path / "t.jsonl").read_bytes()
    assert len(line) <= limit * 1.1, len(line)
    if kind == "body":
        assert resp.status_code == 502 and rec["response"] is None
    elif kind == "stream":
        assert 0 < len(rec["response"]["message"]["content"]) <= limit


def test_the_stream_assembler_is_linear_in_what_it_is_fed():
    """Fed 16 MiB without a separator in 4 KiB pieces, it searches each byte a bounded number of
    times (the old one re-copied and re-searched the whole buffer on every piece)."""
    from mass_jobs.serving.proxy import StreamAssembler

    asm = StreamAssembler()
    searched = {"bytes": 0}
    real_end = asm._end

    def counting(since):
        searched["bytes"] += len(asm._buf) - since
        return real_end(since)

    asm._end = counting
    piece = b"x" * 4096
    for _ in range(4096):
        asm.feed(piece)
    assert searched["bytes"] <= 2 * 4096 * 4096
    asm.feed(b'\n\ndata: {"choices": [{"index": 0, "delta": {"content": "ok"}}]}\r\n\r\n')
    assert asm.record()["message"]["content"] == "ok" and asm.bad_events == 0
