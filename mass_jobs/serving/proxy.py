"""Recording proxy: an OpenAI-compatible pass-through that writes one JSON line per model call.

Any harness (the built-in one, qwen-code, ...) talks to the proxy as if it were the model server;
the proxy forwards `/v1/chat/completions` to the upstream endpoint (any API root, e.g. KServe's
`/openai/v1`) and `/v1/models` and other `/v1/*` routes unrecorded. Streams are forwarded byte for
byte as they arrive (the upstream is asked for identity encoding; an answer compressed anyway is
relayed decoded) and reassembled on the side into one message (content, reasoning, tool calls by
index) for the record. Each line follows schemas/trace-record.schema.json; authorization headers are
never written. Upstream errors, connection failures (answered 502) and client disconnects are
recorded too. `X-Mass-Agent` / `X-Mass-Role` / `X-Mass-Parent` request headers label the call.
With `client_token` only callers that present it (`Authorization: Bearer TOKEN`, what `endpoint`
carries) are served: in an agent pod the agent's code shares the loopback with the proxy, and a call
it made on its own would otherwise land in the trace as the harness's. With `peer_uids` a caller
must also connect from a socket one of those uids owns (the kernel's /proc/net/tcp of the shared
network namespace says whose it is): in an agent pod, the harness's uid or qwen-code's, never the
sandbox's, even if its code got hold of the token.

    with RecordingProxy(upstream=endpoint, trace_path=path) as px:
        ModelClient(px.endpoint, sampling).chat(...)

Command: `mass proxy --upstream URL --model NAME --trace FILE [--port P]`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mass_jobs.serving.llm import Endpoint, tls_context
from mass_jobs.serving.proxy_records import (
    StreamAssembler,
    agent_from_headers,
    read_trace,
    request_record,
    response_record,
    utc_now,
)

BODY_EXCERPT = 2000
# Line breaks to str.splitlines() that json.dumps(ensure_ascii=False) leaves raw (tool output of a
# binary file carries them): written escaped, so a trace line is one line to every reader.
LINE_SEPARATORS = ("\x85", "\u2028", "\u2029")
# Hop-by-hop and framing headers are the proxy's own business on each side. The upstream is asked
# for identity (httpx would otherwise ask for gzip on its own), and what it sends is relayed and
# recorded decoded, so content-encoding is never forwarded: the bytes no longer carry it.
REQUEST_DROP = {
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
    "proxy-authorization", "proxy-connection", "accept-encoding",
}  # fmt: skip
RESPONSE_DROP = {
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "trailer",
    "upgrade",
    "content-encoding",
}


def _addr(hex_addr: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6} ('0100007F:1F90') as (dotted or IPv6 text, port)."""
    import ipaddress

    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host order
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip), int(port_hex, 16)


def peer_uid(client_host: str, client_port: int, server_port: int) -> int | None:
    """The uid owning the client end of a loopback TCP connection to `server_port`, as the kernel
    lists it in /proc/net/tcp{,6} of this network namespace; None when no such socket is listed."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) < 8:
                continue
            try:
                local, remote = _addr(f[1]), _addr(f[2])
            except ValueError:
                continue
            if local == (client_host, client_port) and remote[1] == server_port:
                return int(f[7])
    return None


class RecordingProxy:
    """Serves on 127.0.0.1 (a free port unless `port` is given) in a background thread until stopped."""

    def __init__(
        self,
        upstream: Endpoint,
        trace_path: str | Path,
        api_key: str | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        timeout_s: float = 600,
        client_token: str | None = None,
        peer_uids: frozenset[int] | None = None,
        max_reply_bytes: int = 64 * 2**20,
        rewrite: Callable[[list], list | None] | None = None,
    ):
        self.upstream = upstream
        self.trace_path = Path(trace_path)
        self._api_key = api_key
        self.client_token = client_token
        self.peer_uids = peer_uids
        self.host, self._port = host, port
        self.timeout_s = timeout_s
        # a reply past this is neither buffered nor recorded further: the call ends reply_too_large
        self.max_reply_bytes = max_reply_bytes
        # messages -> the messages the model is sent instead (None: as they came); the record is what it got
        self.rewrite = rewrite
        # the trace could not be written (disk full): every later call is refused, the episode ends
        # infra_error, and the trace keeps only whole lines
        self.write_error: OSError | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._file = None
        self._server = None
        self._thread: threading.Thread | None = None
        self._http = None  # httpx.AsyncClient, created inside the server's event loop

    # ------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self._port}/v1"

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(base_url=self.base_url, model=self.upstream.model, key=self.client_token)

    def start(self) -> RecordingProxy:
        import uvicorn

        # The upstream key is read once, up front, so a missing variable fails here and not per call.
        self._auth = self._api_key or self.upstream.api_key()
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        self._seq = len(read_trace(self.trace_path))  # appending to an existing trace continues its numbering
        # unbuffered bytes: a failed write leaves nothing pending that a later close could tear
        self._file = self.trace_path.open("ab", buffering=0)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, interface="asgi3", lifespan="off", log_level="warning", access_log=False, proxy_headers=False,
            server_header=False, date_header=False, timeout_graceful_shutdown=2,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, args=(sock,), name="recording-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"recording proxy did not start on {self.host}:{self._port}")
            time.sleep(0.01)
        return self

    def _run(self, sock: socket.socket) -> None:
        asyncio.run(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), verify=tls_context()) as http:
            self._http = http
            await self._server.serve(sockets=[sock])

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def records(self) -> list[dict]:
        return read_trace(self.trace_path)

    # ------------------------------------------------------------ recording
    def _write(self, record: dict) -> None:
        with self._lock:
            line = json.dumps({"seq": self._seq, **record}, ensure_ascii=False)
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate the endpoint sent: escaped, the file stays UTF-8
                line = json.dumps({"seq": self._seq, **record})
            for sep in LINE_SEPARATORS:  # str.splitlines() of any reader would cut the record there
                line = line.replace(sep, f"\\u{ord(sep):04x}")
            if self.write_error is not None:
                return
            start = self._file.tell()
            data = memoryview((line + "\n").encode("utf-8"))
            try:
                while data:
                    data = data[self._file.write(data) :]
            except OSError as exc:  # disk full: cut the torn line off, record nothing more
                self.write_error = exc
                try:
                    self._file.truncate(start)
                    self._file.seek(start)
                except (OSError, ValueError):
                    pass
                return
            self._seq += 1

    # ------------------------------------------------------------ ASGI
    async def app(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if not path.startswith("/v1/"):
            await _send_json(send, 404, {"error": {"message": f"no route {path}; the proxy serves /v1/*"}})
            return
        raw = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.peer_uids is not None:  # whose socket it is, first: a token found does not help another uid
            client = scope.get("client") or ("", 0)
            uid = peer_uid(client[0], int(client[1]), self._port)
            if uid not in self.peer_uids:
                await _send_json(
                    send,
                    403,
                    {
                        "error": {
                            "message": f"this proxy serves its episode's harness only (the call came from uid {uid})"
                        }
                    },
                )
                return
        if self.client_token and not hmac.compare_digest(
            headers.get("authorization", "").encode(), f"Bearer {self.client_token}".encode()
        ):
            await _send_json(send, 401, {"error": {"message": "this proxy serves its episode's harness only"}})
            return
        if self.write_error is not None:  # calls no trace would hold: the episode cannot be taught from
            await _send_json(
                send,
                507,
                _error_body(
                    f"the trace could not be written ({self.write_error}); no call is served after that",
                    "trace_unwritable",
                    507,
                ),
            )
            return
        sub = path[len("/v1/") :]
        url = self.upstream.url(sub)
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        fwd = {k: v for k, v in headers.items() if k not in REQUEST_DROP and k != "authorization"}
        fwd["accept-encoding"] = "identity"
        if self._auth:
            fwd["authorization"] = f"Bearer {self._auth}"
        elif "authorization" in headers and not self.client_token:
            fwd["authorization"] = headers["authorization"]  # transparent when the proxy holds no key
        if scope["method"] == "POST" and sub.rstrip("/") == "chat/completions":
            await self._chat(scope, receive, send, raw, headers, url, fwd)
        else:
            await self._passthrough(scope, send, raw, url, fwd)

    async def _passthrough(self, scope: dict, send: Any, raw: bytes, url: str, fwd: dict) -> None:
        import httpx

        try:
            resp = await self._http.request(scope["method"], url, content=raw, headers=fwd)
        except httpx.HTTPError as e:
            await _send_json(send, 502, _error_body(f"upstream unreachable: {e!r}", "upstream_connection_error", 502))
            return
        await _send_full(send, resp.status_code, _response_headers(resp), resp.content)

    async def _chat(self, scope, receive, send, raw: bytes, headers: dict, url: str, fwd: dict) -> None:
        t0 = time.perf_counter()
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        if self.rewrite is not None and isinstance(body, dict):
            messages = self.rewrite(body.get("messages"))
            if messages is not None:
                body = {**body, "messages": messages}
                raw = json.dumps(body, ensure_ascii=False).encode()
        rec: dict[str, Any] = {
            "started_at": utc_now(),
            "duration_s": 0.0,
            "path": scope["path"],
            "status": None,
            "agent": agent_from_headers(headers),
            "request": request_record(body),
            "response": None,
            "error": None,
        }
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, disconnected))
        try:
            await self._forward_chat(send, raw, url, fwd, rec, disconnected)
        finally:
            watcher.cancel()
            rec["duration_s"] = round(time.perf_counter() - t0, 6)
            self._write(rec)

    async def _forward_chat(self, send, raw: bytes, url: str, fwd: dict, rec: dict, disconnected) -> None:
        import httpx

        request = self._http.build_request("POST", url, content=raw, headers=fwd)
        sending = asyncio.create_task(self._http.send(request, stream=True))
        if not await _first_or_disconnect(sending, disconnected):
            rec["error"] = {"kind": "client_disconnect", "message": "client went away before the upstream answered"}
            return
        try:
            resp = sending.result()
        except httpx.TimeoutException as e:
            rec["error"] = {"kind": "timeout", "message": f"upstream {url} timed out: {e!r}"}
            await _send_json(send, 504, _error_body(rec["error"]["message"], "upstream_timeout", 504))
            return
        except httpx.HTTPError as e:
            rec["error"] = {"kind": "connection", "message": f"upstream {url} unreachable: {e!r}"}
            await _send_json(send, 502, _error_body(rec["error"]["message"], "upstream_connection_error", 502))
            return
        rec["status"] = resp.status_code
        try:
            is_stream = resp.headers.get("content-type", "").startswith("text/event-stream")
            if resp.status_code < 300 and is_stream:
                await self._relay_stream(send, resp, rec, disconnected)
                return
            try:
                data = await self._read_bounded(resp)
            except httpx.HTTPError as e:
                rec["error"] = {"kind": "connection", "message": f"upstream body broke off: {e!r}"}
                await _send_json(send, 502, _error_body(rec["error"]["message"], "upstream_connection_error", 502))
                return
            if data is None:
                rec["error"] = {
                    "kind": "reply_too_large",
                    "message": f"upstream reply over {self.max_reply_bytes} "
                    "bytes (limits.reply_bytes): neither buffered nor recorded",
                }
                await _send_json(send, 502, _error_body(rec["error"]["message"], "reply_too_large", 502))
                return
            if resp.status_code >= 300:
                excerpt = data[:BODY_EXCERPT].decode("utf-8", "replace")
                rec["error"] = {"kind": "upstream_status", "message": f"HTTP {resp.status_code}: {excerpt}"}
            else:
                try:
                    rec["response"] = response_record(json.loads(data))
                except (ValueError, RecursionError) as e:  # RecursionError: JSON nested past any sense
                    excerpt = data[:BODY_EXCERPT].decode("utf-8", "replace")
                    rec["error"] = {"kind": "invalid_response", "message": f"{e}: {excerpt}"}
            try:
                await _send_full(send, resp.status_code, _response_headers(resp), data)
            except OSError:
                rec["error"] = rec["error"] or {"kind": "client_disconnect", "message": "client went away"}
        finally:
            await resp.aclose()

    async def _read_bounded(self, resp) -> bytes | None:
        """The body, or None once it grows past max_reply_bytes (the rest is never read)."""
        parts, size = [], 0
        async for piece in resp.aiter_bytes():  # decoded if the upstream compressed anyway
            size += len(piece)
            if size > self.max_reply_bytes:
                return None
            parts.append(piece)
        return b"".join(parts)

    async def _relay_stream(self, send, resp, rec: dict, disconnected) -> None:
        import httpx

        asm = StreamAssembler()
        state = {"complete": False, "too_large": False}

        async def pump() -> None:
            await send({"type": "http.response.start", "status": resp.status_code, "headers": _response_headers(resp)})
            size = 0
            async for piece in resp.aiter_bytes():  # decoded if the upstream compressed anyway
                size += len(piece)
                if size > self.max_reply_bytes:  # the client gets the stream cut, the trace what fit
                    state["too_large"] = True
                    break
                asm.feed(piece)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            state["complete"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        task = asyncio.create_task(pump())
        finished = await _first_or_disconnect(task, disconnected)
        rec["response"] = asm.record()
        if not finished and not state["complete"]:
            rec["error"] = {"kind": "client_disconnect", "message": "client closed the stream before it ended"}
            return
        exc = task.exception() if finished else None
        if state["too_large"]:
            rec["error"] = {
                "kind": "reply_too_large",
                "message": f"upstream stream over {self.max_reply_bytes} bytes "
                "(limits.reply_bytes): cut there, the rest neither relayed nor recorded",
            }
        elif isinstance(exc, httpx.TimeoutException):
            rec["error"] = {"kind": "timeout", "message": f"upstream stream stalled: {exc!r}"}
        elif isinstance(exc, httpx.HTTPError):
            rec["error"] = {"kind": "connection", "message": f"upstream stream broke off: {exc!r}"}
        elif exc is not None and not state["complete"]:
            rec["error"] = {"kind": "client_disconnect", "message": f"sending to the client failed: {exc!r}"}
        elif exc is not None:
            raise exc
        elif asm.errors:
            rec["error"] = {
                "kind": "invalid_response",
                "message": f"error event in stream: {json.dumps(asm.errors[0])}",
            }
        elif not asm.saw_done and asm.finish_reason is None:
            rec["error"] = {"kind": "invalid_response", "message": "stream ended without finish_reason or [DONE]"}


async def _watch_disconnect(receive: Any, flag: asyncio.Event) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            flag.set()
            return


async def _first_or_disconnect(task: asyncio.Task, disconnected: asyncio.Event) -> bool:
    """Wait for `task`; on a client disconnect first, cancel it and return False."""
    waiter = asyncio.create_task(disconnected.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task in done:
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return task.done() and not task.cancelled() and task.exception() is None


def _response_headers(resp: Any) -> list[tuple[bytes, bytes]]:
    return [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in resp.headers.multi_items()
        if k.lower() not in RESPONSE_DROP
    ]


def _error_body(message: str, kind: str, code: int) -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}


async def _send_full(send: Any, status: int, headers: list, data: bytes) -> None:
    headers = [*headers, (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def _send_json(send: Any, status: int, obj: Any) -> None:
    await _send_full(send, status, [(b"content-type", b"application/json")], json.dumps(obj).encode())
