"""The network of model-written code: a recording egress proxy with an allow-list.

A sandboxed command has no network of its own (its own network namespace, loopback only). With
`execution.network` set to a list of hosts, the episode's harness starts an `EgressProxy` on a
Unix socket outside the sandbox; the socket is bound into each sandboxed command, where a small
relay (`FORWARDER`, started before the command) listens on the namespace's loopback, and
`HTTP(S)_PROXY` point there. So the only way out is the proxy, which:
- serves HTTP CONNECT tunnels (https, what pip, uv and curl use) and plain-HTTP requests in
  absolute form, to hosts on the allow-list only (`host`, `host:port`, `*.domain`; without a port,
  80 and 443);
- resolves names itself, and refuses a loopback, private, link-local or reserved address unless
  the allow-list names that address literally (an allowed name cannot be pointed at the cluster's
  or the host's own services);
- adds nothing: it holds no credential, and drops the client's `Proxy-*` headers;
- records every request, allowed or not, as one JSON line in the episode's `network.jsonl` (beside
  the trace, out of the agent's view) when its connection ends: `seq` (order of arrival), method,
  host, port, allowed, status, bytes each way, and why a refused one was refused.

Everything the relay in the sandbox does is the agent's to tamper with; nothing it can do reaches
past the proxy, and the record is written by the proxy's process alone.
"""

from __future__ import annotations

import ipaddress
import json
import re
import select
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mass_jobs.config.hosts import host_rule_error, is_address, split_entry

DEFAULT_PORTS = (80, 443)
SANDBOX_PORT = 3128  # where the relay listens on the sandbox's own loopback
SANDBOX_SOCKET = "/run/mass-egress.sock"  # where the proxy's socket shows inside the sandbox
HEAD_LIMIT = 64 * 1024  # request line and headers
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Rule:
    host: str  # a name, '*.domain' or an address
    port: int | None  # None: 80 and 443

    @classmethod
    def parse(cls, entry: str) -> Rule:
        return cls(*split_entry(entry))

    def matches(self, host: str, port: int) -> bool:
        if (self.port is None and port not in DEFAULT_PORTS) or (self.port is not None and port != self.port):
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host

    @property
    def literal(self) -> bool:
        return is_address(self.host)


class AllowList:
    def __init__(self, entries: list[str] | tuple[str, ...]):
        for e in entries:
            if (why := host_rule_error(e)) is not None:
                raise ValueError(f"execution.network: {why}")
        self.rules = [Rule.parse(e) for e in entries]

    def decide(self, host: str, port: int) -> tuple[tuple[str, int] | None, str]:
        """(the address to connect to, '') when allowed, else (None, why not)."""
        host = host.strip().lower().strip("[]")
        rules = [r for r in self.rules if r.matches(host, port)]
        if not rules:
            return None, f"{host}:{port} is not on the allow-list"
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return None, f"{host} does not resolve: {exc}"
        for *_, addr in infos:
            ip = ipaddress.ip_address(addr[0])
            internal = ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_reserved or ip.is_multicast
            if not internal or any(r.literal for r in rules):
                return (addr[0], port), ""
        return None, f"{host} resolves to an internal address only ({infos[0][-1][0]}); name the address to allow it"


class EgressProxy:
    """The proxy of one episode, on a Unix socket; `with EgressProxy(...) as p:` serves until the block ends."""

    def __init__(self, allow: list[str] | tuple[str, ...], record_path: Path, socket_path: Path,
                 connect_timeout_s: float = 30, idle_timeout_s: float = 600):
        self.allow = AllowList(allow)
        self.record_path = Path(record_path)
        self.socket_path = Path(socket_path)
        self.connect_timeout_s, self.idle_timeout_s = connect_timeout_s, idle_timeout_s
        self.records: list[dict] = []
        self.active = 0  # connections being served (each records when it ends)
        self.started = 0  # connections accepted: a record's `seq`, its place in order of arrival
        self._lock = threading.Lock()
        self._server: _Server | None = None

    def __enter__(self) -> EgressProxy:
        import os

        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        self.record_path.write_text("")
        self.socket_path.unlink(missing_ok=True)
        self._server = _Server(str(self.socket_path), _Handler)
        self._server.proxy = self
        os.chmod(self.socket_path, 0o666)  # the sandbox's leased uid connects
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.socket_path.unlink(missing_ok=True)

    def record(self, rec: dict) -> None:
        with self._lock:
            self.records.append(rec)
            with self.record_path.open("a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")

    def settled_summary(self, wait_s: float = 5) -> dict:
        """The summary once the connections still open have ended and recorded (the sandboxes that
        made them are gone by now), waiting at most `wait_s`."""
        deadline = time.monotonic() + wait_s
        while self.active and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            return summarize(self.records)


def summarize(records: list[dict]) -> dict:
    """What status.json and the report count of an episode's network records."""
    allowed = [r for r in records if r.get("allowed")]
    return {
        "requests": len(records),
        "allowed": len(allowed),
        "denied": len(records) - len(allowed),
        "bytes_up": sum(int(r.get("bytes_up", 0)) for r in allowed),
        "bytes_down": sum(int(r.get("bytes_down", 0)) for r in allowed),
        "hosts": sorted({r["host"] for r in allowed}),
    }


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    proxy: EgressProxy


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        proxy: EgressProxy = self.server.proxy  # type: ignore[attr-defined]
        with proxy._lock:
            proxy.active += 1
            seq, proxy.started = proxy.started, proxy.started + 1
        try:
            self._serve(proxy, seq)
        finally:
            with proxy._lock:
                proxy.active -= 1

    def _serve(self, proxy: EgressProxy, seq: int) -> None:
        client: socket.socket = self.request
        client.settimeout(proxy.idle_timeout_s)
        started = time.time()
        rec: dict = {"seq": seq, "t": round(started, 3), "method": "", "host": "", "port": 0, "allowed": False, "status": 0,
                     "bytes_up": 0, "bytes_down": 0}
        try:
            head, rest = _read_head(client)
            method, target, version, headers = _parse_head(head)
            rec["method"] = method
            if method == "CONNECT":
                host, port = _split_host(target, 443)
                path = ""
            else:
                m = re.match(r"^http://([^/?#]+)([^#]*)$", target, re.I)
                if not m:
                    raise _Refused(400, "expected CONNECT host:port or an absolute http:// URL")
                host, port = _split_host(m.group(1), 80)
                path = m.group(2) or "/"
            rec.update(host=host, port=port)
            addr, why = proxy.allow.decide(host, port)
            if addr is None:
                raise _Refused(403, why)
            try:
                upstream = socket.create_connection(addr, timeout=proxy.connect_timeout_s)
            except OSError as exc:
                raise _Refused(502, f"cannot connect to {host}:{port}: {exc}") from exc
            rec["allowed"] = True
            with upstream:
                upstream.settimeout(proxy.idle_timeout_s)
                if method == "CONNECT":
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    rec["status"] = 200
                    up, down = _relay(client, upstream, rest)
                else:
                    kept = [(k, v) for k, v in headers if not k.lower().startswith("proxy-")
                            and k.lower() not in ("connection", "keep-alive")]
                    out = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
                    sent = (out + "Connection: close\r\n\r\n").encode("latin-1")
                    upstream.sendall(sent)
                    first: list[bytes] = []
                    up, down = _relay(client, upstream, rest, first_reply=first)
                    up += len(sent)
                    rec["status"] = _status_of(b"".join(first))
                rec["bytes_up"], rec["bytes_down"] = up, down
        except _Refused as exc:
            rec["reason"] = exc.why
            rec["status"] = exc.status
            body = f"mass-jobs egress proxy: {exc.why}\n".encode()
            try:
                client.sendall(f"HTTP/1.1 {exc.status} Refused\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}"
                               f"\r\nConnection: close\r\n\r\n".encode() + body)
            except OSError:
                pass
        except OSError as exc:
            rec.setdefault("reason", f"connection ended: {exc}")
        finally:
            rec["duration_s"] = round(time.time() - started, 3)
            if rec["method"]:  # a connection that never sent a request line records nothing
                proxy.record(rec)


class _Refused(Exception):
    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status, self.why = status, why


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEAD_LIMIT:
            raise _Refused(431, f"request head over {HEAD_LIMIT} bytes")
        chunk = sock.recv(CHUNK)
        if not chunk:
            raise _Refused(400, "the connection closed before a full request head")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    return head, rest


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _Refused(400, "malformed request line")
    headers = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:] if ":" in line]
    return parts[0].upper(), parts[1], parts[2], headers  # type: ignore[return-value]


def _split_host(hostport: str, default: int) -> tuple[str, int]:
    hostport = hostport.rsplit("@", 1)[-1]  # user:pass@ in a URL never goes further than here
    m = re.match(r"^\[([0-9a-f:.]+)\](?::(\d+))?$", hostport, re.I) or re.match(r"^([^:]+)(?::(\d+))?$", hostport)
    if not m:
        raise _Refused(400, f"malformed host {hostport!r}")
    port = int(m.group(2)) if m.group(2) else default
    if not 0 < port < 65536:
        raise _Refused(400, f"port {port} out of range")
    return m.group(1).lower(), port


def _status_of(first: bytes) -> int:
    m = re.match(rb"^HTTP/\d(?:\.\d)? (\d{3})", first)
    return int(m.group(1)) if m else 0


def _relay(client: socket.socket, upstream: socket.socket, up_first: bytes,
           first_reply: list[bytes] | None = None) -> tuple[int, int]:
    """Copy both ways until both sides are done; (bytes to upstream, bytes to the client)."""
    up = down = 0
    if up_first:
        upstream.sendall(up_first)
        up += len(up_first)
    open_from = {client: upstream, upstream: client}
    while open_from:
        ready, _, _ = select.select(list(open_from), [], [], upstream.gettimeout())
        if not ready:
            break  # idle past the timeout
        for src in ready:
            data = src.recv(CHUNK)
            dst = open_from[src]
            if not data:
                del open_from[src]
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                continue
            dst.sendall(data)
            if src is client:
                up += len(data)
            else:
                if first_reply is not None and down < 64:
                    first_reply.append(data)
                down += len(data)
    return up, down


# The relay inside the sandbox (stdlib only; run with `python -I -S -c`): the namespace's loopback
# port -> the proxy's socket. It forks once it listens, so the command starts after it is ready.
FORWARDER = r"""
import os, selectors, socket, sys
port, path = int(sys.argv[1]), sys.argv[2]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(64)
if os.fork():
    os._exit(0)
sel = selectors.DefaultSelector()
sel.register(srv, selectors.EVENT_READ)
peer = {}
def close(s):
    for x in (s, peer.pop(s, None)):
        if x is not None:
            peer.pop(x, None)
            try:
                sel.unregister(x)
            except Exception:
                pass
            x.close()
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s is srv:
            c, _ = srv.accept()
            u = socket.socket(socket.AF_UNIX)
            try:
                u.connect(path)
            except OSError:
                c.close(); u.close(); continue
            peer[c], peer[u] = u, c
            sel.register(c, selectors.EVENT_READ); sel.register(u, selectors.EVENT_READ)
            continue
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if not data:
            close(s); continue
        try:
            peer[s].sendall(data)
        except (OSError, KeyError):
            close(s)
"""


def sandbox_proxy_env() -> dict[str, str]:
    """The proxy variables a sandboxed command gets (curl reads the lower-case ones, most tools either)."""
    url = f"http://127.0.0.1:{SANDBOX_PORT}"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": "", "no_proxy": ""}
