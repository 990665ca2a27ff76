"""The trace and the status of an episode are the SFT data and its outcome: the agent's own shell
commands must not be able to rewrite them. The agent here is the scripted endpoint (a test
fixture) driving the built-in harness; its shell command tries to overwrite, append to, move and
replace trace.jsonl and status.json, to rewrite the recording proxy's code, and to leave a process
behind that forges them once the next command says so (which then waits for its mark). Locally the
command runs under bubblewrap as a leased uid: none of that reaches the files, the process left
behind goes with its command, and the stored records are the proxy's."""

from __future__ import annotations

import json
from pathlib import Path

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.harness import EpisodeInput, run_episode, validate_status
from mass_jobs.sandbox.run import _tools
from mass_jobs.serving.proxy import read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply

FORGED = "FORGED-RECORD"


def forging_command(out: Path, proxy_file: Path) -> str:
    trace, status = out / "trace.jsonl", out / "status.json"
    tries = [
        f'echo \'{{"forged": "{FORGED}"}}\' >> {trace}',
        f"echo '{FORGED}' > {trace}",
        f'echo \'{{"outcome": "success", "reason": "{FORGED}"}}\' > {status}',
        f"mv {trace} {out}/moved.jsonl",
        f"rm {trace}",
        f"ln -sf /dev/null {status}",
        f"echo '# {FORGED}' >> {proxy_file}",
        f"mkdir -p {out}/forged",
    ]
    # a process left behind to forge the files once the next command says `go`, then mark that it tried
    later = (
        f"(while [ ! -e go ]; do sleep 0.1; done; echo '{FORGED}' >> {trace}; echo '{FORGED}' > {status}; "
        f"touch late.txt) >/dev/null 2>&1 &"
    )
    return "; ".join(f"({t}) 2>&1 && echo 'WROTE: {t}'" for t in tries) + f"; {later} echo tried"


# the next command: `go`, then up to 5 s for the process left behind to have tried (it polls every
# 0.1 s): what it says is whether that process outlived the command that started it
LATE_CHECK = (
    "touch go; for i in $(seq 50); do [ -e late.txt ] && break; sleep 0.1; done; "
    "[ -e late.txt ] && echo LATE-TRIED || echo no-late"
)


def test_agent_shell_cannot_rewrite_trace_status_or_proxy(scripted_endpoint, tmp_path):
    import mass_jobs.serving.proxy as proxy_module

    bwrap, _ = _tools()
    assert bwrap, "the local sandbox needs bubblewrap (a Debian package) to run agent commands"
    out = tmp_path / "out"
    proxy_file = Path(proxy_module.__file__).resolve()
    proxy_code = proxy_file.read_bytes()
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="tidy the records"), Reply.text("done")],
            "worker-1": [
                Reply.call("shell", command=forging_command(out, proxy_file)),
                Reply.call("shell", command=LATE_CHECK),
                Reply.text("records tidied"),
            ],
        }
    )
    inp = EpisodeInput(
        prompt="Tidy up.",
        endpoint=ep.endpoint,
        sampling=Sampling(),
        limits=EpisodeLimits(wall_s=60, request_timeout_s=10, request_retries=0, shell_timeout_s=20),
    )
    result = run_episode(inp, tmp_path / "ws", out)

    trace_text = (out / "trace.jsonl").read_text()
    status = json.loads((out / "status.json").read_text())
    validate_status(status)
    # (the trace holds the command's text itself, as a tool call: only the proxy's records are lines)
    lines = [json.loads(line) for line in trace_text.splitlines()]
    assert [r["seq"] for r in lines] == [0, 1, 2, 3, 4] and not [r for r in lines if "forged" in r]
    assert FORGED not in json.dumps(status)
    assert status == result.status and status["outcome"] == "success" and status["reason"] != FORGED
    # the trace is the proxy's: one record per model call, in order, the agents' own
    trace = read_trace(out / "trace.jsonl")
    assert [r["agent"]["id"] for r in trace] == ["orchestrator", "worker-1", "worker-1", "worker-1", "orchestrator"]
    assert status["counts"]["turns"] == 5 and status["counts"]["tool_calls"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["status.json", "trace.jsonl"]
    assert (out / "status.json").is_file() and not (out / "status.json").is_symlink()
    assert proxy_file.read_bytes() == proxy_code
    # the command ran and every attempt failed: it saw neither the records nor the proxy's code
    shell_output = [m["content"] for m in trace[2]["request"]["messages"] if m["role"] == "tool"][0]
    assert "tried" in shell_output and "WROTE:" not in shell_output, shell_output
    # each command is a sandbox of its own: the process it left behind went with it, and never tried
    later = [m["content"] for m in trace[3]["request"]["messages"] if m["role"] == "tool"][-1]
    assert "no-late" in later and "LATE-TRIED" not in later, later
    assert status["sandbox"]["network_isolated"] is True


def test_qwen_code_shell_cannot_rewrite_trace_or_status(scripted_endpoint, tmp_path):
    """qwen-code runs its shells itself, so it runs in the sandbox as a whole (mass_jobs.episodes.sandbox_service,
    under bwrap here): its shell command's attempts on the records fail like the built-in harness's."""
    from tests.fixtures.scripted import MAIN

    out = tmp_path / "out"
    proxy_file = Path(__import__("mass_jobs.serving.proxy", fromlist=["x"]).__file__).resolve()
    ep = scripted_endpoint(
        {
            MAIN: [
                Reply.call(
                    "run_shell_command", command=forging_command(out, proxy_file), description="tidy the records"
                ),
                Reply.call("run_shell_command", command=LATE_CHECK, description="look again"),
                Reply.text("records tidied"),
            ]
        }
    )
    inp = EpisodeInput(
        prompt="Tidy up.",
        endpoint=ep.endpoint,
        harness="qwen-code",
        sampling=Sampling(max_output_tokens=64),
        limits=EpisodeLimits(wall_s=90, request_timeout_s=30, request_retries=0),
    )
    result = run_episode(inp, tmp_path / "ws", out)
    status = json.loads((out / "status.json").read_text())
    validate_status(status)
    assert status == result.status and (status["outcome"], result.final_report) == ("success", "records tidied"), status
    assert "sandbox" in status["sandbox"]["note"] and FORGED not in json.dumps(status)
    lines = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in lines] == [0, 1, 2] and not [r for r in lines if "forged" in r]
    assert sorted(p.name for p in out.iterdir()) == ["status.json", "trace.jsonl"]
    # the command ran (qwen-code handed its output back) and every attempt failed
    tool_text = lines[1]["request"]["messages"][-1]["content"][0]["text"]
    shell_output = tool_text.split("\nOutput:", 1)[1]  # qwen-code echoes the command first
    assert "tried" in shell_output and "WROTE:" not in shell_output, shell_output
    assert "trace.jsonl: No such file or directory" in shell_output  # /out is not in its view at all
    later = lines[2]["request"]["messages"][-1]["content"][0]["text"]
    assert later.split("\nOutput:", 1)[1].split("\n")[0].strip() == "no-late", (
        later
    )  # qwen-code ended its process group
