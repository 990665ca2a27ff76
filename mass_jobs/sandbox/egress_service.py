"""The run's egress proxy on a cluster: one per cycle (a Deployment behind a Service) for all its agent pods.

On a cluster a sandboxed command cannot get a network namespace of its own (seccomp RuntimeDefault),
so the boundary is the pod's: the agent pods' NetworkPolicy lets them reach this pod and nothing
outside the cluster, and this pod's policy lets it reach public addresses only. It serves what the
episode's Unix-socket proxy serves (egress.py: CONNECT and absolute-form HTTP to the allow-list,
which is the run spec's `execution.network`, names resolved here, internal addresses refused), with
two differences a shared proxy needs:

- Whose request it is. Every request carries `Proxy-Authorization: Basic ID:TOKEN`, ID the rollout
  (base64url of its path in the run) and TOKEN = HMAC-SHA256(the rollout's key, "mass-egress"):
  prepare writes one random key per rollout into the store (episodes/proof.py), only that rollout's
  harness container gets it, and this proxy reads it from the store. So a request counts for the
  rollout whose key made its token and no other; an agent pod of another rollout or another run has
  no key to make one. A request without a valid token is refused (407) and logged on stdout.
- Where the record goes. Records are kept per rollout, in order of arrival. The rollout's harness
  asks, with the same token, `GET /egress/cursor` when it starts and `GET /egress/record?from=N` when
  its commands are done (connections still open are waited for), and writes them to network.jsonl,
  which proof.json signs. A sandboxed command holding the token can read its own records, never
  change them. `boot` changes when the process restarts: the harness then knows its record is not
  whole.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import socketserver
import sys
import threading
import urllib.parse
from collections.abc import Callable

from mass_jobs.sandbox.egress import AllowList, EgressUnavailable, Ledger, _Handler, _Refused

PORT = 3128
TOKEN_MESSAGE = b"mass-egress"
SETTLE_S = 5.0  # how long a record request waits for the rollout's open connections
_ROLLOUT = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")


def token(key: bytes) -> str:
    """The rollout's proxy password: it proves the key without giving it away."""
    return hmac.new(key, TOKEN_MESSAGE, hashlib.sha256).hexdigest()


def client_id(rollout: str) -> str:
    """The rollout as a proxy user name: base64url, which needs no escaping in a URL's userinfo."""
    return base64.urlsafe_b64encode(rollout.encode()).decode().rstrip("=")


def proxy_url(address: str, rollout: str, key: bytes) -> str:
    """HTTP(S)_PROXY for a rollout's commands; `address` is `http://host:port`."""
    parts = urllib.parse.urlsplit(address)
    return f"http://{client_id(rollout)}:{token(key)}@{parts.hostname}:{parts.port or PORT}"


def authorization(rollout: str, key: bytes) -> str:
    raw = f"{client_id(rollout)}:{token(key)}".encode()
    return "Basic " + base64.b64encode(raw).decode()


class EgressService:
    """`with EgressService(allow, keys, address) as s:` serves until the block ends. `keys(rollout)`
    returns the rollout's key, or None when there is none; `allow_of(rollout)`, the rollout's own
    allow-list (its task's hosts with the spec's, as prepare stored them), or None for `allow`."""

    def __init__(
        self,
        allow: list[str] | tuple[str, ...],
        keys: Callable[[str], bytes | None],
        address: tuple[str, int] = ("0.0.0.0", PORT),
        connect_timeout_s: float = 30,
        idle_timeout_s: float = 600,
        log=None,
        allow_of: Callable[[str], list[str] | None] | None = None,
    ):
        self.allow = AllowList(allow)
        self.allow_of = allow_of or (lambda rollout: None)
        self.keys = keys
        self.boot = secrets.token_hex(8)
        self.ledgers: dict[str, Ledger] = {}
        self._known: dict[str, bytes] = {}  # rollout -> key, read once
        self._lock = threading.Lock()
        self._log = log or (lambda doc: print(json.dumps(doc, sort_keys=True), file=sys.stdout, flush=True))
        self._server = _TcpServer(address, _Handler)
        srv = self._server
        srv.admit, srv.control, srv.refused = self._admit, self._control, self._refused
        srv.connect_timeout_s, srv.idle_timeout_s = connect_timeout_s, idle_timeout_s

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    def __enter__(self) -> EgressService:
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- who is asking
    def _rollout(self, headers: list[tuple[str, str]]) -> str:
        value = next((v for k, v in headers if k.lower() == "proxy-authorization"), "")
        scheme, _, cred = value.partition(" ")
        if scheme.lower() != "basic" or not cred:
            raise _Refused(
                407,
                "expected Proxy-Authorization: Basic (the rollout's id and token)",
                'Proxy-Authenticate: Basic realm="mass-egress"\r\n',
            )
        try:
            user, _, password = base64.b64decode(cred.strip(), validate=True).decode().partition(":")
            rollout = base64.urlsafe_b64decode(user + "=" * (-len(user) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise _Refused(407, "malformed proxy credentials") from None
        if not _ROLLOUT.match(rollout) or ".." in rollout.split("/"):
            raise _Refused(407, "the proxy user names no rollout")
        key = self._key(rollout)
        if key is None or not hmac.compare_digest(token(key), password):
            raise _Refused(407, f"no valid token for rollout {rollout}")
        return rollout

    def _key(self, rollout: str) -> bytes | None:
        with self._lock:
            if rollout in self._known:
                return self._known[rollout]
        key = self.keys(rollout)  # outside the lock: a store read
        if key is not None:
            with self._lock:
                self._known[rollout] = key
        return key

    def ledger(self, rollout: str) -> Ledger:
        with self._lock:
            if rollout in self.ledgers:
                return self.ledgers[rollout]
        own = self.allow_of(rollout)  # outside the lock: a store read
        with self._lock:
            if rollout not in self.ledgers:
                self.ledgers[rollout] = Ledger(self.allow if own is None else AllowList(own))
            return self.ledgers[rollout]

    # -- the server's hooks
    def _admit(self, method: str, target: str, headers) -> Ledger:
        return self.ledger(self._rollout(headers))

    def _refused(self, rec: dict) -> None:
        self._log({"refused": rec})

    def _control(self, method: str, target: str, headers) -> tuple[int, dict]:
        path, _, query = target.partition("?")
        if path == "/healthz":
            return 200, {"ok": True, "boot": self.boot}
        if method != "GET" or path not in ("/egress/cursor", "/egress/record"):
            return 404, {"error": f"no route {method} {path}"}
        try:
            rollout = self._rollout(headers)
        except _Refused as exc:
            return exc.status, {"error": exc.why}
        ledger = self.ledger(rollout)
        if path == "/egress/cursor":
            return 200, {"boot": self.boot, "next": ledger.started}
        try:
            start = int(urllib.parse.parse_qs(query).get("from", ["0"])[0])
        except ValueError:
            return 400, {"error": "from: expected an integer"}
        records = sorted((r for r in ledger.settle(SETTLE_S) if r["seq"] >= start), key=lambda r: r["seq"])
        return 200, {"boot": self.boot, "records": records, "open": ledger.active, "over_cap": ledger.over_cap()}


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class RemoteEgress:
    """The harness's side of the run's proxy, for one rollout: `way` is what the sandbox's commands
    get (HTTP(S)_PROXY), `begin()` takes the cursor, `settled_summary()` reads the rollout's records
    since then into `record_path` (network.jsonl) and counts them."""

    def __init__(self, address: str, rollout: str, key: bytes, record_path, timeout_s: float = 30):
        parts = urllib.parse.urlsplit(address)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--egress-proxy: expected http://host:port, got {address!r}")
        self.host, self.port = parts.hostname, parts.port or PORT
        self.rollout, self.key, self.timeout_s = rollout, key, timeout_s
        self.record_path = record_path
        self.way = proxy_url(address, rollout, key)
        self._cursor: dict | None = None

    def _get(self, path: str) -> dict:
        import http.client

        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s + SETTLE_S)
        try:
            conn.request("GET", path, headers={"Proxy-Authorization": authorization(self.rollout, self.key)})
            reply = conn.getresponse()
            body = reply.read(64 * 1024 * 1024)
        except OSError as exc:
            raise EgressUnavailable(f"the run's egress proxy at {self.host}:{self.port}: {exc}") from exc
        finally:
            conn.close()
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if reply.status != 200 or not isinstance(doc, dict):
            raise EgressUnavailable(f"the run's egress proxy answered {path} with HTTP {reply.status}: {body[:300]!r}")
        return doc

    def begin(self) -> None:
        self._cursor = self._get("/egress/cursor")

    def settled_summary(self) -> dict:
        from mass_jobs.sandbox.egress import summarize

        if self._cursor is None:
            raise EgressUnavailable("the run's egress proxy was never reached")
        doc = self._get(f"/egress/record?from={int(self._cursor['next'])}")
        if doc.get("boot") != self._cursor.get("boot"):
            raise EgressUnavailable("the run's egress proxy restarted during the episode: its record is not whole")
        if doc.get("over_cap"):
            raise EgressUnavailable(str(doc["over_cap"]))
        records = doc.get("records")
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise EgressUnavailable("the run's egress proxy sent no list of records")
        with open(self.record_path, "w") as f:
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        return summarize(records)
