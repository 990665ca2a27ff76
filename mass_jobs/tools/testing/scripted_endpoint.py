"""TEST FIXTURE — NEVER A PRODUCT PATH. A scripted OpenAI-compatible server that replays canned replies.

`ScriptedEndpoint` is a real HTTP server on 127.0.0.1 that answers `/v1/chat/completions` (streaming
and non-streaming) and `/v1/models` from queues of scripted `Reply`s, so harness, proxy and
rendering tests can run without a model. It is no model and must never stand in for one outside
tests (tests/fixtures/scripted.py exposes it as the `scripted_endpoint` pytest fixture).

Which queue answers a request: the `X-Mass-Agent` header, then `X-Mass-Role`, then the first
script key that appears as text in the system prompt (a marker such as "[agent:coder]"), then "*".
Failures are scripted too: `Reply(status=500)`, `Reply(delay_s=5)` for timeouts, tool-call arguments
that are not JSON, `chunk_delay_s` for slow streams. Every request is kept in `.requests`.

    with ScriptedEndpoint({"*": [Reply.call("shell", cmd="ls"), Reply.text("done")]}) as ep:
        ModelClient(ep.endpoint, sampling).chat([...])
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mass_jobs.serving.llm import Endpoint


@dataclass
class Reply:
    """One scripted answer. `tool_calls` items: {"name", "arguments": dict | str (str is sent verbatim), "id"?}."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    status: int = 200
    error_body: str | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    chunk_chars: int = 3

    @classmethod
    def text(cls, content: str, reasoning: str | None = None, **kw: Any) -> Reply:
        return cls(content=content, reasoning=reasoning, **kw)

    @classmethod
    def call(cls, name: str, _content: str | None = None, **arguments: Any) -> Reply:
        return cls(content=_content, tool_calls=[{"name": name, "arguments": arguments}])

    @classmethod
    def fail(cls, status: int = 500, body: str | None = None) -> Reply:
        return cls(status=status, error_body=body)


class ScriptExhausted(RuntimeError):
    pass


class ScriptedEndpoint:
    """Loopback server replaying `scripts[key]` queues in order; see the module docstring."""

    def __init__(
        self,
        scripts: dict[str, list[Reply]] | None = None,
        model: str = "scripted",
        base_path: str = "/v1",
        repeat_last: bool = False,
        port: int = 0,
    ):
        self.model = model
        self._port = port
        self.base_path = "/" + base_path.strip("/")
        self.repeat_last = repeat_last
        self._queues: dict[str, deque[Reply]] = {k: deque(v) for k, v in (scripts or {}).items()}
        self._last: dict[str, Reply] = {}
        self._lock = threading.Lock()
        self.requests: list[dict] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ scripting
    def add(self, key: str, *replies: Reply) -> None:
        with self._lock:
            self._queues.setdefault(key, deque()).extend(replies)

    def remaining(self, key: str) -> int:
        with self._lock:
            return len(self._queues.get(key, ()))

    def choose_key(self, headers: dict[str, str], body: dict) -> str | None:
        for name in ("x-mass-agent", "x-mass-role"):
            value = headers.get(name)
            if value and value in self._queues:
                return value
        system = " ".join(
            m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
            for m in body.get("messages") or []
            if isinstance(m, dict) and m.get("role") == "system"
        )
        for key in self._queues:
            if key != "*" and key in system:
                return key
        return "*" if "*" in self._queues else None

    def next_reply(self, headers: dict[str, str], body: dict) -> tuple[str | None, Reply]:
        with self._lock:
            key = self.choose_key(headers, body)
            queue = self._queues.get(key) if key else None
            if queue:
                reply = queue.popleft()
                self._last[key] = reply
                return key, reply
            if key in self._last and self.repeat_last:
                return key, self._last[key]
        raise ScriptExhausted(f"no scripted reply left for key {key!r} (headers/system prompt matched nothing else)")

    # ------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        assert self._server is not None, "ScriptedEndpoint is not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_path}"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(base_url=self.base_url, model=self.model)

    def start(self) -> ScriptedEndpoint:
        self._server = _bind(self._port, _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="scripted-endpoint", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- wire format


def completion_id(n: int) -> str:
    return f"chatcmpl-scripted-{n}"


def _tool_calls(reply: Reply, n: int) -> list[dict]:
    calls = []
    for i, tc in enumerate(reply.tool_calls):
        args = tc.get("arguments", {})
        calls.append(
            {
                "id": tc.get("id") or f"call_{n}_{i}",
                "type": "function",
                "function": {"name": tc["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    return calls


def _usage(body: dict, reply: Reply) -> dict:
    # Deterministic word counts: enough for tests to check that usage is carried through.
    prompt = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [] if isinstance(m, dict))
    completion = len((reply.content or "").split()) + len((reply.reasoning or "").split())
    completion += sum(len(json.dumps(tc.get("arguments", {})).split()) for tc in reply.tool_calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def completion(body: dict, reply: Reply, n: int, model: str) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply, n)
    return {
        "id": completion_id(n),
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model") or model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
        "usage": _usage(body, reply),
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_chunks(body: dict, reply: Reply, n: int, model: str) -> list[dict]:
    """The chunks of a streamed answer: role, reasoning, content, tool calls in argument fragments, finish, usage."""
    base = {
        "id": completion_id(n),
        "object": "chat.completion.chunk",
        "created": 0,
        "model": body.get("model") or model,
    }

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    size = max(1, reply.chunk_chars)
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": p}) for p in _pieces(reply.reasoning or "", size)]
    out += [chunk({"content": p}) for p in _pieces(reply.content or "", size)]
    for i, tc in enumerate(_tool_calls(reply, n)):
        fn = tc["function"]
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": tc["id"],
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        out += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in _pieces(fn["arguments"], size)
        ]
    out.append(chunk({}, _finish(reply)))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append({**base, "choices": [], "usage": _usage(body, reply)})
    return out


def _handler_for(ep: ScriptedEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def _json(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == ep.base_path + "/models":
                self._json(
                    200, {"object": "list", "data": [{"id": ep.model, "object": "model", "owned_by": "scripted"}]}
                )
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "body is not JSON"}})
                return
            with ep._lock:
                n = len(ep.requests)
                record = {"path": self.path, "headers": headers, "body": body, "key": None}
                ep.requests.append(record)
            if self.path.rstrip("/") != ep.base_path + "/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                key, reply = ep.next_reply(headers, body)
            except ScriptExhausted as e:
                self._json(500, {"error": {"message": str(e), "type": "script_exhausted"}})
                return
            record["key"] = key
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.status >= 400:
                text = reply.error_body or json.dumps({"error": {"message": f"scripted HTTP {reply.status}"}})
                data = text.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if not body.get("stream"):
                self._json(200, completion(body, reply, n, ep.model))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for c in stream_chunks(body, reply, n, ep.model):
                    self._chunk(b"data: " + json.dumps(c).encode() + b"\n\n")
                    if reply.chunk_delay_s:
                        time.sleep(reply.chunk_delay_s)
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                record["disconnected"] = True
                self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def _bind(port: int, handler) -> ThreadingHTTPServer:
    """The fixture's server on `port`, or with 0 on a free port *below* the kernel's ephemeral range.
    Model servers and proxies take ephemeral ports (bind to 0) and free them when they stop; a
    fixture given one of those ports would answer a client still holding the old URL (another
    test's, on another worker), and record its requests as its own."""
    import random

    if port:
        return ThreadingHTTPServer(("127.0.0.1", port), handler)
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    below = range(max(1024, low - 12000), low)
    for candidate in random.sample(below, min(200, len(below))):
        try:
            return ThreadingHTTPServer(("127.0.0.1", candidate), handler)
        except OSError:
            continue
    return ThreadingHTTPServer(("127.0.0.1", 0), handler)
