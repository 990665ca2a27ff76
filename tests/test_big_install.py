"""The paper's tasks add multi-GB packages (`uv add torch`): a wheel larger than 1 GiB installs with uv
from a package index, through the episode's egress proxy, inside a sandboxed episode under
`examples/paper.yaml`'s limits, and the default limits refuse it. The index is a server of this test
on loopback (tests/fixtures/big_wheel.py), allowed by address as a task's stand-in host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.harness import EpisodeInput, run_episode
from mass_jobs.sandbox.run import _tools
from mass_jobs.serving.proxy import read_trace
from mass_jobs.spec.load import load_spec
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures import big_wheel

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_tools()[0] is None, reason="bwrap cannot build a sandbox here")]
CAPS = {"wall_s": 300, "turns_per_agent": 4, "tool_calls": 8, "request_timeout_s": 60, "request_retries": 0}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    folder = tmp_path_factory.mktemp("index")
    wheel = big_wheel.build(folder)
    assert wheel.stat().st_size > 1 << 30 and wheel.stat().st_blocks * 512 < 1 << 20  # sparse: no disk spent
    with big_wheel.Index(folder) as idx:
        yield idx


@pytest.mark.parametrize("machine", ["paper", "default"])
def test_a_wheel_over_a_gib_installs_through_the_egress_proxy_on_the_papers_machine(
    scripted_endpoint, index, tmp_path, machine
):
    paper = load_spec(ROOT / "examples" / "paper.yaml").execution.limits
    limits = paper.model_copy(update=CAPS) if machine == "paper" else EpisodeLimits(**CAPS)
    # uv, the paper's tasks' package manager: it unpacks the wheel into its cache in /tmp, then copies
    # it into the workspace; the blob's size is read, then it goes (the workspace is archived after)
    install = (
        f"uv pip install --no-deps --index-url {index.url} --target deps bigpkg > uv.log 2>&1; "
        "echo uv_exit=$?; grep -m1 -o 'No space left on device' uv.log; "
        "python -c \"import os; print('blob', os.path.getsize('deps/bigpkg/blob.bin'))\"; rm -rf deps"
    )
    ep = scripted_endpoint(
        {
            "orchestrator": [
                Reply.call("delegate", agent_id="worker-1", role="installer", assignment="Install bigpkg."),
                Reply.call("finish", summary="installed", status="success"),
            ],
            "worker-1": [Reply.call("shell", command=install), Reply.call("finish", summary="installed")],
        }
    )
    inp = EpisodeInput(
        prompt="Install bigpkg.", endpoint=ep.endpoint, sampling=Sampling(), limits=limits, network=(index.host,)
    )
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    tool_text = json.dumps([r["request"]["messages"] for r in read_trace(tmp_path / "out" / "trace.jsonl")])
    got = [json.loads(line) for line in (tmp_path / "out" / "network.jsonl").read_text().splitlines()]
    wheel = [r for r in got if r["bytes_down"] > 1 << 30]
    if machine == "paper":
        assert "uv_exit=0" in tool_text and f"blob {(1 << 30) + (1 << 26)}" in tool_text
        assert len(wheel) == 1 and wheel[0]["allowed"] and wheel[0]["status"] == 200  # recorded beside the trace
    else:  # a 256 MiB /tmp in memory: uv's cache fills it, nothing is installed
        assert "uv_exit=1" in tool_text and "No space left on device" in tool_text
        assert "blob " not in tool_text and "No such file or directory" in tool_text
        assert result.status["network"]["allow"] == [index.host]
