"""The network of model-written code: a recording egress proxy with an allow-list.

A sandboxed command has no network of its own (its own network namespace, loopback only). With
`execution.network` set to a list of hosts, the episode's harness starts an `EgressProxy` on a
Unix socket outside the sandbox; the socket is bound into each sandboxed command, where a small
relay (`egress_relay.FORWARDER`, started before the command) listens on the namespace's loopback, and
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
HEAD_LIMIT = 64 * 1024  # request line and headers
MAX_REQUESTS = 10_000  # per episode: past it requests are refused and only counted
CHUNK = 64 * 1024


class EgressUnavailable(Exception):
    """The episode's record of its network is not whole: a proxy unreachable, restarted, or past its cap."""


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

    def __init__(
        self,
        allow: list[str] | tuple[str, ...],
        record_path: Path,
        socket_path: Path,
        connect_timeout_s: float = 30,
        idle_timeout_s: float = 600,
    ):
        self.record_path = Path(record_path)
        self.socket_path = Path(socket_path)
        self.connect_timeout_s, self.idle_timeout_s = connect_timeout_s, idle_timeout_s
        self.ledger = Ledger(AllowList(allow), write=self._write)
        self._server: _Server | None = None

    @property
    def way(self) -> str:
        """What a sandboxed command is given to get out: this proxy's socket (bound in, relayed)."""
        return str(self.socket_path)

    def __enter__(self) -> EgressProxy:
        import os

        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        self.record_path.write_text("")
        self.socket_path.unlink(missing_ok=True)
        self._server = _Server(str(self.socket_path), _Handler)
        self._server.admit = lambda *_: self.ledger  # type: ignore[attr-defined]
        self._server.connect_timeout_s, self._server.idle_timeout_s = self.connect_timeout_s, self.idle_timeout_s
        os.chmod(self.socket_path, 0o666)  # the sandbox's leased uid connects
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.socket_path.unlink(missing_ok=True)

    def _write(self, rec: dict) -> None:
        with self.record_path.open("a") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")

    def settled_summary(self, wait_s: float = 5) -> dict:
        """The summary once the connections still open have ended and recorded (the sandboxes that
        made them are gone by now), waiting at most `wait_s`. EgressUnavailable when the record is
        not whole (requests past the cap)."""
        records = self.ledger.settle(wait_s)
        if (why := self.ledger.over_cap()) is not None:
            raise EgressUnavailable(why)
        return summarize(records)


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


class Ledger:
    """Where one client's requests are counted and recorded: an episode's (the Unix-socket proxy has
    one; the run's proxy, egress_service.py, one per rollout). `seq`: a connection's place in the
    order of arrival."""

    def __init__(self, allow: AllowList, write=None, cap: int = MAX_REQUESTS):
        self.allow = allow
        self.records: list[dict] = []
        self.active = 0  # connections being served (each records when it ends)
        self.started = 0
        self.overflow = 0  # requests refused past `cap`, not recorded one by one
        self.cap = cap
        self._write = write  # persists each record too (the episode's network.jsonl)
        self._lock = threading.Lock()

    def open(self) -> int:
        """The new connection's seq; past `cap` requests it is refused (429) and only counted, so a
        flood costs the proxy no memory (and the episode its record: see over_cap)."""
        with self._lock:
            if self.started >= self.cap:
                self.overflow += 1
                raise _Refused(429, f"over {self.cap} requests in this episode")
            self.active += 1
            seq, self.started = self.started, self.started + 1
            return seq

    def over_cap(self) -> str | None:
        """Why the record is not whole (requests past the cap), or None."""
        return (
            (f"the episode's code made over {self.cap} network requests ({self.overflow} more were refused unrecorded)")
            if self.overflow
            else None
        )

    def close(self, rec: dict) -> None:
        with self._lock:
            self.active -= 1
            self.records.append(rec)
            if self._write is not None:
                self._write(rec)

    def settle(self, wait_s: float) -> list[dict]:
        """The records once the connections still open have ended (waiting at most `wait_s`)."""
        deadline = time.monotonic() + wait_s
        while self.active and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            return list(self.records)


class _Handler(socketserver.BaseRequestHandler):
    """One client connection. The server's `admit(method, target, headers)` names the Ledger it counts
    in, or refuses it (_Refused 407: then only the server's `refused` hook, if any, sees it); a request
    in origin form (`GET /path`) is for the proxy itself: its `control` hook answers, if it has one."""

    def handle(self) -> None:
        server = self.server
        client: socket.socket = self.request
        client.settimeout(server.idle_timeout_s)  # type: ignore[attr-defined]
        started = time.time()
        rec: dict = {
            "seq": 0,
            "t": round(started, 3),
            "method": "",
            "host": "",
            "port": 0,
            "allowed": False,
            "status": 0,
            "bytes_up": 0,
            "bytes_down": 0,
        }
        ledger: Ledger | None = None
        try:
            head, rest = _read_head(client)
            method, target, version, headers = _parse_head(head)
            control = getattr(server, "control", None)
            if target.startswith("/") and control is not None:
                status, doc = control(method, target, headers)
                _send(client, status, json.dumps(doc, sort_keys=True).encode(), "application/json")
                return
            rec["method"] = method
            admitted = server.admit(method, target, headers)  # type: ignore[attr-defined]
            rec["seq"] = admitted.open()
            ledger = admitted
            _forward(server, ledger.allow, client, rec, method, target, version, headers, rest)
        except _Refused as exc:
            rec.update(reason=exc.why, status=exc.status)
            _send(client, exc.status, f"mass-jobs egress proxy: {exc.why}\n".encode(), "text/plain", exc.extra)
            if exc.status == 407 and getattr(server, "refused", None) is not None:  # nobody's: the proxy's log
                server.refused(dict(rec, client=str(self.client_address[0]) if self.client_address else ""))
        except OSError as exc:
            rec.setdefault("reason", f"connection ended: {exc}")
        finally:
            if ledger is not None:
                rec["duration_s"] = round(time.time() - started, 3)
                ledger.close(rec)


def _forward(
    server,
    allow: AllowList,
    client: socket.socket,
    rec: dict,
    method: str,
    target: str,
    version: str,
    headers: list[tuple[str, str]],
    rest: bytes,
) -> None:
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
    addr, why = allow.decide(host, port)
    if addr is None:
        raise _Refused(403, why)
    try:
        upstream = socket.create_connection(addr, timeout=server.connect_timeout_s)
    except OSError as exc:
        raise _Refused(502, f"cannot connect to {host}:{port}: {exc}") from exc
    rec["allowed"] = True
    with upstream:
        upstream.settimeout(server.idle_timeout_s)
        if method == "CONNECT":
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rec["status"] = 200
            up, down = _relay(client, upstream, rest)
        else:
            kept = [
                (k, v)
                for k, v in headers
                if not k.lower().startswith("proxy-") and k.lower() not in ("connection", "keep-alive")
            ]
            out = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
            sent = (out + "Connection: close\r\n\r\n").encode("latin-1")
            upstream.sendall(sent)
            first: list[bytes] = []
            up, down = _relay(client, upstream, rest, first_reply=first)
            up += len(sent)
            rec["status"] = _status_of(b"".join(first))
        rec["bytes_up"], rec["bytes_down"] = up, down


def _send(client: socket.socket, status: int, body: bytes, ctype: str, extra: str = "") -> None:
    try:
        client.sendall(
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Refused'}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode()
            + body
        )
    except OSError:
        pass


class _Refused(Exception):
    def __init__(self, status: int, why: str, extra: str = ""):
        super().__init__(why)
        self.status, self.why, self.extra = status, why, extra  # extra: more header lines


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


def _relay(
    client: socket.socket, upstream: socket.socket, up_first: bytes, first_reply: list[bytes] | None = None
) -> tuple[int, int]:
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
