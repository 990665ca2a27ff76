"""execution.network: model-written code reaches allowed hosts through the episode's recording egress
proxy and nothing else, with every request recorded outside the agent's view.

The hosts are HTTP servers of this test on loopback, allowed by address (a name that resolves to an
internal address is refused, so an allowed name cannot be pointed at the host's own services). The
sandbox's own loopback is not the host's: without the proxy the same URLs are unreachable.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from mass_jobs.config.run_spec import EpisodeLimits, RunSpec, Sampling
from mass_jobs.episodes.harness import EpisodeInput, episode_file_json, episode_input, run_episode, validate_status
from mass_jobs.sandbox.egress import AllowList, EgressProxy, summarize
from mass_jobs.sandbox.run import SandboxLimits, _tools, run_sandboxed
from mass_jobs.serving.proxy import read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply

needs_bwrap = pytest.mark.skipif(_tools()[0] is None, reason="bwrap cannot build a sandbox here")
LIMITS = SandboxLimits(timeout_s=30, cpu_s=20, memory_mb=1024, processes=32)


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.answer(self.path)  # type: ignore[attr-defined]
        self.send_response(200 if body is not None else 404)
        body = (body or "").encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _servers(names, answer):
    """One HTTP server on loopback per name, answering a GET of PATH with `answer(name, path)` (None:
    404); yields {name: port}."""
    servers = {}
    for name in names:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
        srv.answer = lambda path, name=name: answer(name, path)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers[name] = srv
    yield {n: s.server_address[1] for n, s in servers.items()}
    for s in servers.values():
        s.shutdown()
        s.server_close()


@pytest.fixture
def hosts():
    """Two HTTP servers on loopback: `allowed` and `denied` (name -> port)."""
    yield from _servers(("allowed", "denied"), lambda name, path: f"page {name} {path}")


FETCH = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        print(url, urllib.request.urlopen(url, timeout=10).read().decode())\n"
    "    except Exception as exc:\n"
    "        print(url, 'FAILED', getattr(exc, 'code', type(exc).__name__))\n"
)


def records(path: Path) -> list[dict]:
    """The proxy's records in order of arrival (each is written when its connection ends)."""
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["seq"])


@needs_bwrap
def test_a_command_reaches_an_allowed_host_through_the_proxy_and_not_a_denied_one(hosts, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "fetch.py").write_text(FETCH)
    a, d = (f"http://127.0.0.1:{hosts[n]}/data.csv" for n in ("allowed", "denied"))
    with EgressProxy(
        [f"127.0.0.1:{hosts['allowed']}"], tmp_path / "out" / "network.jsonl", tmp_path / "egress.sock"
    ) as proxy:
        limits = SandboxLimits(**{**LIMITS.__dict__, "egress_socket": str(proxy.socket_path)})
        r = run_sandboxed(
            f"python fetch.py {a} {d}; "
            # https goes as a CONNECT tunnel (curl -p forces one for http too); no proxy: nothing is there
            f"curl -sS -p {a}; echo; curl -sS --noproxy '*' {a} >/dev/null 2>&1 || echo direct-failed; "
            "ls -A /run",
            ws,
            limits,
        )
        summary = proxy.settled_summary()
    assert r.exit_code == 0 and r.applied["egress_proxy"] is True, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == [f"{a} page allowed /data.csv", f"{d} FAILED 403"]
    assert lines[2:] == ["page allowed /data.csv", "direct-failed", "mass-egress.sock"]
    got = records(tmp_path / "out" / "network.jsonl")
    assert [(x["method"], x["port"], x["allowed"], x["status"]) for x in got] == [
        ("GET", hosts["allowed"], True, 200),
        ("GET", hosts["denied"], False, 403),
        ("CONNECT", hosts["allowed"], True, 200),
    ]
    assert got[1]["reason"] == f"127.0.0.1:{hosts['denied']} is not on the allow-list" and got[1]["bytes_down"] == 0
    assert all(x["bytes_down"] > len("page allowed /data.csv") and x["bytes_up"] > 0 for x in got if x["allowed"])
    assert summary == {**summarize(got), "requests": 3, "allowed": 2, "denied": 1, "hosts": ["127.0.0.1"]}


@needs_bwrap
def test_with_the_network_off_neither_host_is_reached(hosts, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "fetch.py").write_text(FETCH)
    urls = [f"http://127.0.0.1:{hosts[n]}/x" for n in ("allowed", "denied")]
    r = run_sandboxed(f"python fetch.py {' '.join(urls)}; echo proxy: ${{HTTPS_PROXY:-none}}", ws, LIMITS)
    assert r.exit_code == 0 and r.applied["egress_proxy"] is False
    assert [line.split(" ", 1)[1] for line in r.stdout.splitlines()] == ["FAILED URLError", "FAILED URLError", "none"]


@needs_bwrap
def test_code_that_talks_to_the_socket_itself_still_meets_the_allow_list(hosts, tmp_path):
    """The relay in the sandbox is the agent's to replace: a CONNECT written straight to the socket is
    refused and recorded all the same, and the record file is nowhere in the sandbox's view."""
    ws = tmp_path / "ws"
    ws.mkdir()
    raw = (
        "import socket, sys, os\n"
        "s = socket.socket(socket.AF_UNIX); s.connect('/run/mass-egress.sock')\n"
        "s.sendall(b'CONNECT 127.0.0.1:%s HTTP/1.1\\r\\nProxy-Authorization: Basic eA==\\r\\n\\r\\n' % sys.argv[1].encode())\n"
        "print(s.recv(200).split(b'\\r\\n')[0].decode())\n"
        "print([p for p in ('/out', '/run/network.jsonl') if os.path.exists(p)])\n"
    )
    (ws / "raw.py").write_text(raw)
    out = tmp_path / "out"
    with EgressProxy([f"127.0.0.1:{hosts['allowed']}"], out / "network.jsonl", tmp_path / "egress.sock") as proxy:
        limits = SandboxLimits(**{**LIMITS.__dict__, "egress_socket": str(proxy.socket_path)})
        r = run_sandboxed(
            f"python raw.py {hosts['denied']}; [ -e {out}/network.jsonl ] && echo seen || echo unseen", ws, limits
        )
    assert r.stdout.splitlines() == ["HTTP/1.1 403 Refused", "[]", "unseen"], r.stderr
    [rec] = records(out / "network.jsonl")
    assert (rec["method"], rec["allowed"], rec["port"]) == ("CONNECT", False, hosts["denied"])


def test_the_allow_list_matches_names_ports_and_refuses_internal_addresses_behind_a_name():
    rules = AllowList(["pypi.org", "*.stooq.com", "files.example.org:8443", "127.0.0.1:9"])
    assert rules.decide("example.com", 443) == (None, "example.com:443 is not on the allow-list")
    assert rules.decide("pypi.org", 8080)[0] is None  # a name alone allows 80 and 443 only
    assert rules.decide("files.example.org", 443)[0] is None  # a port given is the only one
    assert rules.decide("stooq.com", 443)[0] is None  # '*.stooq.com' is its subdomains
    assert rules.decide("127.0.0.1", 9) == (("127.0.0.1", 9), "")
    named = AllowList(["localhost:9"])
    addr, why = named.decide("localhost", 9)
    assert addr is None and "resolves to an internal address only" in why
    with pytest.raises(ValueError, match="'bad host' is not a host name"):
        AllowList(["bad host"])


def spec_doc(network, mode="local") -> dict:
    return {
        "name": "n",
        "model": {"base": "org/m"},
        "store": {"uri": "file:///tmp/s"},
        "tasks": [{"id": "a", "prompt": "p", "split": "train"}, {"id": "b", "prompt": "p", "split": "test"}],
        "execution": {"mode": mode, "network": network},
    }


def test_the_spec_field_names_each_bad_entry_and_reaches_the_episode_file():
    from pydantic import ValidationError

    from mass_jobs.episodes.episode import EpisodeRequest
    from mass_jobs.serving.llm import Endpoint

    with pytest.raises(ValidationError) as err:
        RunSpec.model_validate(spec_doc(["pypi.org", "no spaces", "x:70000"]))
    text = str(err.value)
    assert "execution.network" in text and "[1] 'no spaces'" in text and "[2] 'x:70000' names a port" in text
    assert RunSpec.model_validate(spec_doc(["pypi.org"], mode="argo")).execution.network == ["pypi.org"]
    with pytest.raises(ValidationError, match="an empty list allows nothing"):
        RunSpec.model_validate(spec_doc([]))
    ep = Endpoint("http://127.0.0.1:1/v1", "m")
    request = EpisodeRequest(prompt="p", seed=1, files={})
    on = EpisodeInput.from_spec(RunSpec.model_validate(spec_doc(["pypi.org", "*.stooq.com"])), ep, request)
    off = EpisodeInput.from_spec(RunSpec.model_validate(spec_doc("off")), ep, request)
    assert (on.network, off.network) == (("pypi.org", "*.stooq.com"), None)
    assert episode_input(episode_file_json(on)).network == on.network  # what an agent pod receives
    assert "network" not in episode_file_json(off)  # files of runs without network stay as they were


def test_a_task_names_its_own_hosts_merged_with_the_spec_s():
    from mass_jobs.episodes.episode import EpisodeRequest
    from mass_jobs.serving.llm import Endpoint
    from mass_jobs.spec.load import SpecError, validate_document

    ep = Endpoint("http://127.0.0.1:1/v1", "m")
    task = EpisodeRequest(prompt="p", seed=1, files={}, network=("files.rcsb.org", "pypi.org"))
    on = EpisodeInput.from_spec(RunSpec.model_validate(spec_doc(["pypi.org", "*.stooq.com"])), ep, task)
    off = EpisodeInput.from_spec(RunSpec.model_validate(spec_doc("off")), ep, task)
    assert on.network == ("pypi.org", "*.stooq.com", "files.rcsb.org")  # the spec's first, each once
    assert off.network == ("files.rcsb.org", "pypi.org")  # off: no host of the spec's own, the task's still
    doc = spec_doc("off")
    doc["tasks"][0]["network"] = ["files.rcsb.org", "no spaces"]
    with pytest.raises(SpecError) as err:  # what `mass validate` says
        validate_document(doc)
    assert any(
        i.path == "$.tasks[0].network" and "[1] 'no spaces' is not a host name" in i.message for i in err.value.issues
    ), err.value.issues


def fetching_team(scripted_endpoint, a: str, d: str, python: str = "python"):
    """A scripted team whose worker writes fetch.py and runs it on the URLs `a` and `d`."""
    return scripted_endpoint(
        {
            "orchestrator": [
                Reply.call("delegate", agent_id="worker-1", role="fetcher", assignment="Fetch the prices."),
                Reply.call("finish", summary="fetched", status="success"),
            ],
            "worker-1": [
                Reply.call("write_file", path="fetch.py", content=FETCH),
                Reply.call("shell", command=f"{python} fetch.py {a} {d}"),
                Reply.call("finish", summary="fetched"),
            ],
        }
    )


def fetch_episode(scripted_endpoint, hosts, network: bool, python: str = "python") -> tuple[EpisodeInput, str, str]:
    """A builtin episode whose worker fetches the allowed host's page and the denied one's; (input, a, d)."""
    a, d = (f"http://127.0.0.1:{hosts[n]}/prices.csv" for n in ("allowed", "denied"))
    ep = fetching_team(scripted_endpoint, a, d, python)
    inp = EpisodeInput(
        prompt="Fetch the prices.",
        endpoint=ep.endpoint,
        sampling=Sampling(),
        limits=EpisodeLimits(wall_s=60, turns_per_agent=5, memory_mb=1024),
        network=(f"127.0.0.1:{hosts['allowed']}",) if network else None,
    )
    return inp, a, d


def check_fetch_record(result, out: Path, hosts, a: str, d: str, network: bool) -> None:
    """What the fetch episode's trace, network.jsonl and status show, with the network or without."""
    validate_status(result.status)
    tool_text = json.dumps([r["request"]["messages"] for r in read_trace(out / "trace.jsonl")])
    if network:
        assert f"{a} page allowed /prices.csv" in tool_text and f"{d} FAILED 403" in tool_text
        got = records(out / "network.jsonl")
        assert [(x["port"], x["allowed"]) for x in got] == [(hosts["allowed"], True), (hosts["denied"], False)]
        assert result.status["network"] == {**summarize(got), "allow": [f"127.0.0.1:{hosts['allowed']}"]}
        assert result.status["network"]["denied"] == 1
    else:  # no proxy named: the commands' own isolation holds them (in a pod, the policy)
        assert tool_text.count("FAILED URLError") == 2
        assert "network" not in result.status and not (out / "network.jsonl").exists()


@needs_bwrap
@pytest.mark.parametrize("network", [True, False], ids=["network", "off"])
def test_a_builtin_episode_records_its_requests_beside_the_trace_and_counts_them(
    scripted_endpoint, hosts, tmp_path, network
):
    inp, a, d = fetch_episode(scripted_endpoint, hosts, network)
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    check_fetch_record(result, tmp_path / "out", hosts, a, d, network)


@needs_bwrap
def test_a_qwen_code_episode_s_shell_commands_use_the_proxy(scripted_endpoint, hosts, tmp_path):
    """The paper's harness: qwen-code's shell commands leave its sandbox through the shell service,
    each in a sandbox of its own whose only way out is the episode's egress proxy."""
    a, d = (f"http://127.0.0.1:{hosts[n]}/series.csv" for n in ("allowed", "denied"))
    ep = scripted_endpoint(
        {
            "You are Qwen Code": [
                Reply.call("run_shell_command", command=f"python fetch.py {a} {d}", description="fetch the series"),
                Reply.text("done"),
            ]
        }
    )
    inp = EpisodeInput(
        prompt="Fetch the series.",
        endpoint=ep.endpoint,
        harness="qwen-code",
        sampling=Sampling(max_output_tokens=64),
        files={"fetch.py": FETCH},
        limits=EpisodeLimits(wall_s=90, request_timeout_s=30, request_retries=0),
        network=(f"127.0.0.1:{hosts['allowed']}",),
    )
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    assert result.outcome == "success", result.reason
    trace = read_trace(tmp_path / "out" / "trace.jsonl")
    # qwen-code's own fetch tool is not offered: its process is not behind the egress proxy
    offered = {t["function"]["name"] for t in trace[0]["request"]["tools"]}
    assert "run_shell_command" in offered and "web_fetch" not in offered
    tool_text = json.dumps([r["request"]["messages"] for r in trace])
    assert f"{a} page allowed /series.csv" in tool_text and f"{d} FAILED 403" in tool_text
    got = records(tmp_path / "out" / "network.jsonl")
    assert [(x["port"], x["allowed"], x["status"]) for x in got] == [
        (hosts["allowed"], True, 200),
        (hosts["denied"], False, 403),
    ]
    assert result.status["network"] == {**summarize(got), "allow": list(inp.network)}


def test_a_network_record_the_harness_did_not_write_is_refused_at_ingest(tmp_path):
    """network.jsonl is one of the outputs an agent pod's harness signs: one written by anything else
    (a sidecar adding records to an episode that had none, or editing them) fails the proof."""
    from mass_jobs.episodes import proof

    key = proof.new_key()
    out = tmp_path / "out"
    out.mkdir()
    for name, blob in (("workspace.tar.gz", b"ws"), ("trace.jsonl", b""), ("status.json", b"{}")):
        (out / name).write_bytes(blob)
    proof.sign_outputs(key, out, proof.EPISODE_OUTPUTS)
    uploaded = {n: (out / n).read_bytes() if (out / n).exists() else None for n in proof.EPISODE_OUTPUTS}
    assert uploaded["network.jsonl"] is None and proof.refusal(key, (out / proof.PROOF).read_bytes(), uploaded) is None
    forged = {**uploaded, "network.jsonl": b'{"host": "pypi.org", "allowed": true}\n'}
    assert "network.jsonl differ" in proof.refusal(key, (out / proof.PROOF).read_bytes(), forged)


def _index(root: Path) -> Path:
    """A package index (PEP 503 simple layout) with one pure wheel, `tinypkg` 1.0."""
    import base64
    import hashlib
    import zipfile

    files = {
        "tinypkg/__init__.py": "VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = (
        "".join(f"{p},{digest(c)},{len(c.encode())}\n" for p, c in files.items()) + "tinypkg-1.0.dist-info/RECORD,,\n"
    )
    wheel = "tinypkg-1.0-py3-none-any.whl"
    (root / "simple" / "tinypkg").mkdir(parents=True)
    with zipfile.ZipFile(root / "simple" / "tinypkg" / wheel, "w") as z:
        for path, text in {**files, "tinypkg-1.0.dist-info/RECORD": record}.items():
            z.writestr(path, text)
    (root / "simple" / "tinypkg" / "index.html").write_text(f'<a href="{wheel}">{wheel}</a>')
    (root / "simple" / "index.html").write_text('<a href="tinypkg/">tinypkg</a>')
    return root


@needs_bwrap
def test_uv_adds_a_package_from_an_allowed_index_and_not_from_a_denied_one(tmp_path):
    """What the paper's tasks do (`uv add`): uv, on the sandbox's PATH, installs through the proxy."""
    import functools

    _index(tmp_path / "index")
    servers = []
    for _ in range(2):
        handler = functools.partial(_Quiet, directory=str(tmp_path / "index"))
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    allowed, denied = (s.server_address[1] for s in servers)
    ws = tmp_path / "ws"
    ws.mkdir()
    install = "uv pip install -q --python .venv/bin/python --index-url http://127.0.0.1:{}/simple tinypkg"
    try:
        with EgressProxy([f"127.0.0.1:{allowed}"], tmp_path / "network.jsonl", tmp_path / "egress.sock") as proxy:
            limits = SandboxLimits(
                **{**LIMITS.__dict__, "egress_socket": str(proxy.socket_path), "limit_address_space": False}
            )
            r = run_sandboxed(
                f"uv venv -q .venv && {install.format(denied)} >/dev/null 2>&1; echo denied=$?; "
                f"{install.format(allowed)} && .venv/bin/python -c 'import tinypkg; print(tinypkg.VALUE)'",
                ws,
                limits,
            )
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == ["denied=1", "42"]
    got = records(tmp_path / "network.jsonl")
    assert {x["port"] for x in got if not x["allowed"]} == {denied} and {x["port"] for x in got if x["allowed"]} == {
        allowed
    }
    assert any(x["allowed"] and x["status"] == 200 and x["bytes_down"] > 500 for x in got)  # the wheel


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


# ---------------------------------------------------------------- the run's proxy (agent pods on a cluster)


def _sandbox_service(tmp_path: Path):
    """An agent pod's sandbox container in a thread: its commands get no namespace of their own."""
    from mass_jobs.episodes.sandbox_client import SandboxClient
    from mass_jobs.episodes.sandbox_service import serve

    started, servers = threading.Event(), []
    sock = tmp_path / "sbx" / "sandbox.sock"
    sock.parent.mkdir()

    def ready(server):
        servers.append(server)
        started.set()

    threading.Thread(target=serve, args=(sock, tmp_path / "sbx" / "ws"), kwargs={"ready": ready}, daemon=True).start()
    assert started.wait(10)
    return SandboxClient(sock), servers


def _get(url: str, proxy: str) -> str:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
    try:
        return opener.open(url, timeout=10).read().decode()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"


def test_the_run_s_proxy_counts_a_request_for_the_rollout_whose_key_made_its_token(hosts, tmp_path):
    """One proxy for all agent pods: a rollout's token (HMAC of its key) is its only way to be served,
    and what it sent is in its ledger alone; a wrong token, another run's rollout or none: 407."""
    from mass_jobs.sandbox.egress_service import EgressService, client_id, proxy_url, token

    keys = {"gen-0/collect/a/ep-0": b"k" * 32, "gen-0/collect/a/ep-1": b"j" * 32}
    a, d = (f"http://127.0.0.1:{hosts[n]}/x.csv" for n in ("allowed", "denied"))
    with EgressService([f"127.0.0.1:{hosts['allowed']}"], keys.get, ("127.0.0.1", 0), log=lambda doc: None) as s:
        addr = f"http://127.0.0.1:{s.address[1]}"
        p0, p1 = (proxy_url(addr, r, k) for r, k in keys.items())
        assert (
            _get(a, p0) == "page allowed /x.csv" and _get(d, p0) == "HTTP 403" and _get(a, p1) == "page allowed /x.csv"
        )
        forged = f"http://{client_id('gen-0/collect/a/ep-0')}:{token(b'x' * 32)}@127.0.0.1:{s.address[1]}"
        other = proxy_url(addr, "gen-0/collect/a/ep-9", b"k" * 32)  # a key, but not this rollout's
        assert _get(a, forged) == _get(a, other) == _get(a, addr) == "HTTP 407"
        e0, e1 = (s.ledgers[r].settle(5) for r in keys)
        assert [(r["port"], r["allowed"], r["status"]) for r in sorted(e0, key=lambda r: r["seq"])] == [
            (hosts["allowed"], True, 200),
            (hosts["denied"], False, 403),
        ]
        assert [(r["port"], r["allowed"]) for r in e1] == [(hosts["allowed"], True)]
        assert set(s.ledgers) == set(keys)  # the refused ones opened no ledger


def test_the_run_s_proxy_holds_each_rollout_to_the_hosts_its_prepared_input_names(hosts):
    """Per-task hosts on the cluster: `mass egress-serve`'s allow-list for a rollout is the network of
    the episode.json prepare stored for it (the spec's hosts and its task's; no agent pod can write the
    store), else the spec's. Here the spec allows nothing and one rollout's task names the host."""
    from mass_jobs.sandbox.egress_service import EgressService, proxy_url

    keys = {"gen-0/collect/a/ep-0": b"k" * 32, "gen-0/collect/b/ep-0": b"j" * 32}
    own = {"gen-0/collect/a/ep-0": [f"127.0.0.1:{hosts['allowed']}"]}
    a = f"http://127.0.0.1:{hosts['allowed']}/x.csv"
    with EgressService([], keys.get, ("127.0.0.1", 0), log=lambda doc: None, allow_of=own.get) as s:
        addr = f"http://127.0.0.1:{s.address[1]}"
        named, other = (proxy_url(addr, r, k) for r, k in keys.items())
        assert _get(a, named) == "page allowed /x.csv" and _get(a, other) == "HTTP 403"


@pytest.mark.parametrize("network", [True, False], ids=["network", "off"])
def test_an_agent_pod_s_commands_go_through_the_run_s_proxy_and_its_record_is_the_rollout_s(
    scripted_endpoint, hosts, tmp_path, network
):
    """The agent pod's flow without the cluster: the harness takes the cursor, hands the proxy to the
    sandbox container, and writes what the proxy recorded for this rollout (and nothing another
    rollout sent meanwhile) to network.jsonl; status.json counts it. Network off: no proxy at all."""
    from mass_jobs.sandbox.egress_service import EgressService, RemoteEgress, proxy_url

    rollout, key = "gen-0/collect/a/ep-0", b"k" * 32
    inp, a, d = fetch_episode(scripted_endpoint, hosts, network, python="python3")
    client, servers = _sandbox_service(tmp_path)
    keys = {rollout: key, "gen-0/collect/a/ep-1": b"j" * 32}
    with EgressService([f"127.0.0.1:{hosts['allowed']}"], keys.get, ("127.0.0.1", 0), log=lambda doc: None) as s:
        addr = f"http://127.0.0.1:{s.address[1]}"
        _get(a, proxy_url(addr, "gen-0/collect/a/ep-1", b"j" * 32))  # another rollout, before and apart
        egress = RemoteEgress(addr, rollout, key, tmp_path / "out" / "network.jsonl") if network else None
        (tmp_path / "out").mkdir()
        result = run_episode(inp, tmp_path / "ws", tmp_path / "out", sandbox=client, egress=egress)
    servers[0].shutdown()
    assert result.outcome == "success", result.reason
    check_fetch_record(result, tmp_path / "out", hosts, a, d, network)


def test_an_unreachable_or_restarted_run_proxy_makes_the_episode_an_infra_error(scripted_endpoint, hosts, tmp_path):
    from mass_jobs.sandbox.egress_service import EgressService, RemoteEgress

    ep = scripted_endpoint({"orchestrator": [Reply.call("finish", summary="nothing", status="success")]})
    inp = EpisodeInput(
        prompt="p", endpoint=ep.endpoint, sampling=Sampling(), limits=EpisodeLimits(wall_s=30), network=("pypi.org",)
    )
    client, servers = _sandbox_service(tmp_path)
    (tmp_path / "out").mkdir()
    gone = RemoteEgress(
        "http://127.0.0.1:9", "gen-0/a/ep-0", b"k" * 32, tmp_path / "out" / "network.jsonl", timeout_s=2
    )
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out", sandbox=client, egress=gone)
    servers[0].shutdown()
    assert result.outcome == "infra_error" and "egress proxy" in result.reason, result.reason
    # a proxy that restarted between the cursor and the record: the record is not whole
    with EgressService([], {"r": b"k" * 32}.get, ("127.0.0.1", 0), log=lambda doc: None) as s:
        answer = s._server.control

        def restart_after_the_cursor(method, target, headers):
            reply = answer(method, target, headers)
            if target.startswith("/egress/cursor"):
                s.boot = "another"
            return reply

        s._server.control = restart_after_the_cursor
        remote = RemoteEgress(f"http://127.0.0.1:{s.address[1]}", "r", b"k" * 32, tmp_path / "out2" / "network.jsonl")
        (tmp_path / "out2").mkdir()
        (tmp_path / "again").mkdir()
        client, servers = _sandbox_service(tmp_path / "again")
        result = run_episode(inp, tmp_path / "ws2", tmp_path / "out2", sandbox=client, egress=remote)
        servers[0].shutdown()
    assert result.outcome == result.status["outcome"] == "infra_error"
    assert "restarted during the episode" in result.reason


def kill_the_proxy(ex) -> None:
    """The cycle's egress proxy pod dies (OOM, a lost node); returns once its Deployment has a ready
    replacement."""
    ((kind, name),) = [k for k in ex.cluster.procs if k[0] == "Deployment"]
    (handle,) = ex.cluster.procs[(kind, name)]
    os.kill(handle.pod.proc.pid, signal.SIGKILL)
    for _ in range(300):
        if ex.cluster.restarts[name] == 1 and (ex.cluster.get(kind, name)["status"].get("readyReplicas") == 1):
            return
        time.sleep(0.1)
    raise AssertionError(f"the proxy was not replaced: {ex.cluster.get(kind, name)['status']}")


@pytest.mark.argo_exec
@pytest.mark.parametrize(
    "network,restart", [(True, False), (False, False), (True, True)], ids=["network", "off", "proxy-killed"]
)
def test_through_the_agent_pod_template_a_command_reaches_an_allowed_host_and_not_a_denied_one(
    executor_for, s3_env, scripted_endpoint, hosts, network, restart, tmp_path
):
    """The generated templates under the test executor: the cycle's egress proxy (a Deployment of
    `mass egress-serve`, which reads the spec and the rollout's key from S3, behind a Service), then
    the agent pod, whose NetworkPolicy lets it reach the model and that proxy only. The sandbox
    container's command fetches through the proxy (allowed: the page; denied: 403) and directly
    (unreachable: the policy); the record Argo uploads beside the trace is the proxy's, signed by the
    harness. A proxy pod killed after the cycle started it is replaced, and the agent pod reaches
    the replacement by the same name: the episode is whole."""
    from mass_jobs.episodes import proof
    from tests.fixtures.argo_cluster import KEY, run_agent_episode, tempfile_dir

    a, d = (f"http://127.0.0.1:{hosts[n]}/prices.csv" for n in ("allowed", "denied"))
    command = f"python3 fetch.py {a} {d}; env -u http_proxy -u HTTP_PROXY python3 fetch.py {a}"
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="Fetch the prices."), Reply.text("fetched")],
            "worker-1": [
                Reply.call("write_file", path="fetch.py", content=FETCH),
                Reply.call("shell", command=command),
                Reply.call("finish", summary="fetched"),
            ],
        }
    )
    inp = EpisodeInput(
        prompt="Fetch the prices.",
        endpoint=ep.endpoint,
        sampling=Sampling(),
        limits=EpisodeLimits(wall_s=90, request_timeout_s=20, request_retries=0, shell_timeout_s=30),
        network=(f"127.0.0.1:{hosts['allowed']}",) if network else None,
    )
    with tempfile_dir() as seed:
        wf, output = run_agent_episode(
            executor_for,
            f"net-{'on' if network else 'off'}",
            inp,
            seed,
            before_agent=kill_the_proxy if restart else None,
        )
    assert wf.phase == "Succeeded", wf.summary()
    assert [n.phase for n in wf.find(type="Pod")] == ["Succeeded"]  # the agent pod, on its first attempt
    if network and not restart:  # an operator's view of the run (`mass pods`), through the API: its episode's pod
        from tests.fixtures.kube_api import operator_view

        cluster = wf.executor.cluster
        view = operator_view(
            tmp_path, "net-on", pods=lambda: cluster.scheduler.api_pods(cluster.namespace), namespace=cluster.namespace
        )
        (agent,) = [p for p in view["pods"] if p["step"] == "episode"]
        assert (agent["generation"], agent["task"], agent["episode"], agent["phase"], agent["reason"]) == (
            "0",
            "t",
            "ep-0",
            "Succeeded",
            "",
        ), agent
        assert agent["name"] == wf.find(type="Pod")[0].pod and agent["node"] == "node-0"
    status = json.loads(output("status.json"))
    assert status["outcome"] == "success", status
    trace = [json.loads(x) for x in output("trace.jsonl").decode().splitlines()]
    shell_output = [m["content"] for m in trace[3]["request"]["messages"] if m["role"] == "tool"][-1]
    lines = [x for x in shell_output.splitlines() if x.startswith("http://")]
    if network:
        assert lines == [f"{a} page allowed /prices.csv", f"{d} FAILED 403", f"{a} FAILED URLError"], shell_output
        got = sorted((json.loads(x) for x in output("network.jsonl").decode().splitlines()), key=lambda r: r["seq"])
        assert [(r["port"], r["allowed"], r["status"]) for r in got] == [
            (hosts["allowed"], True, 200),
            (hosts["denied"], False, 403),
        ]
        assert status["network"] == {**summarize(got), "allow": [f"127.0.0.1:{hosts['allowed']}"]}
        signed = {n: output(n) for n in proof.EPISODE_OUTPUTS}
    else:  # no proxy for the command, and the policy drops the direct connections
        assert lines == [f"{a} FAILED URLError", f"{d} FAILED URLError", f"{a} FAILED URLError"], shell_output
        assert "network" not in status
        signed = {n: output(n) for n in proof.EPISODE_OUTPUTS if n != "network.jsonl"} | {"network.jsonl": None}
    assert proof.refusal(KEY, output(proof.PROOF), signed) is None


def test_a_flood_of_requests_is_refused_past_the_cap_and_the_episode_loses_its_record(hosts, tmp_path):
    """Past the cap a proxy refuses (429) and only counts, so a flood costs it no memory; the record
    is then not whole, which the harness makes an infra_error (locally and from the run's proxy)."""
    from mass_jobs.sandbox.egress_service import EgressService, EgressUnavailable, RemoteEgress, proxy_url

    a = f"http://127.0.0.1:{hosts['allowed']}/x"
    with EgressService(
        [f"127.0.0.1:{hosts['allowed']}"], {"r": b"k" * 32}.get, ("127.0.0.1", 0), log=lambda doc: None
    ) as s:
        addr = f"http://127.0.0.1:{s.address[1]}"
        remote = RemoteEgress(addr, "r", b"k" * 32, tmp_path / "network.jsonl")
        remote.begin()
        s.ledger("r").cap = 3
        got = [_get(a, proxy_url(addr, "r", b"k" * 32)) for _ in range(5)]
        assert got == ["page allowed /x"] * 3 + ["HTTP 429"] * 2
        assert len(s.ledger("r").records) == 3 and s.ledger("r").overflow == 2
        with pytest.raises(EgressUnavailable, match="over 3 network requests"):
            remote.settled_summary()
    with EgressProxy([f"127.0.0.1:{hosts['allowed']}"], tmp_path / "local.jsonl", tmp_path / "e.sock") as local:
        local.ledger.cap = 1
        replies = []
        for _ in range(2):  # as the relay in a sandbox sends them, onto the episode proxy's socket
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(str(local.socket_path))
                c.sendall(f"GET {a} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                replies.append(c.makefile("rb").readline().split()[1])
        assert replies == [b"200", b"429"]
        with pytest.raises(EgressUnavailable, match="over 1 network requests"):
            local.settled_summary()


# Toy-sized stand-ins for two of the paper's data hosts, at the paths their prompts name: the PDB's
# file server (a structure of three atoms) and FRED's graph export (a small CSV).
STAND_INS = {
    "/download/1abc.pdb": "ATOM      1  N   GLY A   1       0.000   0.000   0.000\n"
    "ATOM      2  CA  GLY A   1       1.458   0.000   0.000\n"
    "ATOM      3  C   GLY A   1       2.009   1.420   0.000\nEND\n",
    "/graph/fredgraph.csv": "DATE,DGS10\n2024-01-02,3.95\n2024-01-03,3.91\n",
}


@pytest.fixture
def stand_ins():
    """The PDB's and FRED's stand-ins, each a server on loopback: {"pdb": port, "fred": port}."""
    yield from _servers(("pdb", "fred"), lambda _name, path: STAND_INS.get(path.split("?")[0]))


@needs_bwrap
def test_an_imported_task_s_episode_reaches_the_host_its_prompt_names_and_no_other(
    scripted_endpoint, stand_ins, tmp_path
):
    """`mass import upstream` of paper-shaped tasks gives each the hosts its prompt names (local
    servers stand in for the PDB's and FRED's at toy size); under a spec with the network off, the
    structure task's episode fetches its structure through the egress proxy, recorded beside its
    requests, and FRED's series, which its prompt does not name, is refused."""
    import yaml

    from mass_jobs.commands.cli import main
    from mass_jobs.config.task_spec import Task
    from mass_jobs.episodes.episode import EpisodeRequest
    from mass_jobs.spec.upstream_format import UPSTREAM_MARKER

    a = f"http://127.0.0.1:{stand_ins['pdb']}/download/1abc.pdb"
    d = f"http://127.0.0.1:{stand_ins['fred']}/graph/fredgraph.csv?id=DGS10"
    src = tmp_path / "upstream"
    (src / "initial").mkdir(parents=True)
    (src / "splits.json").write_text(json.dumps({"designated_train": [1], "test": [2]}))
    agents = [{"agent_id": "agent_lead", "role": "Lead", "instruction": "Fetch and report."}]
    for tid, task in (
        (1, f"Fetch the structure {a} and report its atom count.\\nDeliverables:\\n1) report.md"),
        (2, f"Fit an AR(1) to the series at {d}."),
    ):
        (src / "initial" / f"query{tid}_ourTeam.txt").write_text(
            f"{task}\n\n{UPSTREAM_MARKER}\n{json.dumps(agents)}\n\nUse uv for all Python workflows."
        )
    assert main(["import", "upstream", str(src), "--out", str(tmp_path / "tasks")]) == 0
    doc = yaml.safe_load((tmp_path / "tasks" / "query1.yaml").read_text())
    assert doc["network"] == [f"127.0.0.1:{stand_ins['pdb']}"] and doc["deliverables"] == ["report.md"]
    task = Task.model_validate(doc)
    spec = RunSpec.model_validate({**spec_doc("off"), "tasks": [doc, {"id": "b", "prompt": "p", "split": "test"}]})
    ep = fetching_team(scripted_endpoint, a, d)
    request = EpisodeRequest(prompt=task.prompt, files={}, seed=1, network=tuple(task.network))
    inp = EpisodeInput.from_spec(spec, ep.endpoint, request)
    inp = dataclasses.replace(inp, limits=EpisodeLimits(wall_s=60, turns_per_agent=5, memory_mb=1024))
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    tool_text = json.dumps([r["request"]["messages"] for r in read_trace(tmp_path / "out" / "trace.jsonl")])
    assert tool_text.count("ATOM  ") == 3 and f"{d} FAILED 403" in tool_text  # the structure, at toy size
    got = records(tmp_path / "out" / "network.jsonl")
    assert [(x["port"], x["allowed"]) for x in got] == [(stand_ins["pdb"], True), (stand_ins["fred"], False)]
    assert result.status["network"]["allow"] == [f"127.0.0.1:{stand_ins['pdb']}"]  # recorded beside its requests
