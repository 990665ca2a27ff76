"""Built-in harness episodes against the scripted endpoint (test fixture) and the tiny model server.

Each test scripts the model's replies per agent (keyed by the X-Mass-Agent header the harness sends)
and checks the workspace, the trace the recording proxy wrote, and the classified status.json.
"""

from __future__ import annotations

import json

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.audit import audit_episode
from mass_jobs.episodes.harness import OUTCOMES, EpisodeInput, run_episode, validate_status
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed
from mass_jobs.serving.proxy import read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply

ANALYSIS_PY = "import json\nprint(json.dumps({'mean': sum([1, 2, 3]) / 3}))\n"


def limits(**kw) -> EpisodeLimits:
    base = dict(wall_s=60, request_timeout_s=10, request_retries=0, shell_timeout_s=20, loop_repeats=3)
    return EpisodeLimits(**{**base, **kw})


def episode(ep, tmp_path, prompt="Analyse the numbers 1, 2, 3.", **kw):
    inp = EpisodeInput(
        prompt=prompt, endpoint=ep.endpoint, limits=kw.pop("limits", limits()), sampling=Sampling(), **kw
    )
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    validate_status(status)
    assert status == result.status and status["outcome"] in OUTCOMES
    return result, status, read_trace(tmp_path / "out" / "trace.jsonl")


def tool_messages(record: dict) -> list[str]:
    return [m["content"] for m in record["request"]["messages"] if m["role"] == "tool"]


def handoff_scripts() -> dict[str, list[Reply]]:
    return {
        "orchestrator": [
            Reply.call(
                "delegate", agent_id="worker-1", role="coder", assignment="Write analysis.py that prints the mean."
            ),
            Reply.call(
                "delegate", agent_id="worker-2", role="reviewer", assignment="Run analysis.py; write report.md."
            ),
            Reply.call("read_file", path="report.md"),
            Reply.call("finish", summary="report.md has the mean", status="success"),
        ],
        "worker-1": [
            Reply.call("write_file", path="analysis.py", content=ANALYSIS_PY),
            Reply.call("finish", summary="analysis.py written"),
        ],
        "worker-2": [
            Reply.call("read_file", path="analysis.py"),
            Reply.call("shell", command="python3 analysis.py > result.json && cat result.json"),
            Reply.call("write_file", path="report.md", content="mean = 2.0\n"),
            Reply.text("report.md written"),
        ],
    }


def test_orchestrator_two_workers_files_trace_and_audit(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(handoff_scripts())
    result, status, trace = episode(ep, tmp_path, seed=7)
    assert (result.outcome, result.final_report) == ("success", "report.md has the mean")
    assert status["counts"] == {"turns": 10, "tool_calls": 9, "delegations": 2, "agents": 3, "tool_errors": 0}
    ws = tmp_path / "ws"
    assert (ws / "analysis.py").read_text() == ANALYSIS_PY
    assert json.loads((ws / "result.json").read_text()) == {"mean": 2.0}
    assert (ws / "report.md").read_text() == "mean = 2.0\n"
    # Every call is in the trace, labelled by the harness headers, with the tool definitions.
    agents = [(r["agent"]["id"], r["agent"]["role"], r["agent"]["parent"]) for r in trace]
    assert (
        agents
        == [("orchestrator", "orchestrator", None)]
        + [("worker-1", "worker", "orchestrator")] * 2
        + [("orchestrator", "orchestrator", None)]
        + [("worker-2", "worker", "orchestrator")] * 4
        + [("orchestrator", "orchestrator", None)] * 2
    )
    assert [t["function"]["name"] for t in trace[0]["request"]["tools"]] == [
        "delegate",
        "read_file",
        "list_files",
        "finish",
    ]
    assert {t["function"]["name"] for t in trace[1]["request"]["tools"]} == {
        "read_file",
        "write_file",
        "list_files",
        "shell",
        "finish",
    }
    assert all(r["status"] == 200 and r["request"]["sampling"]["seed"] == 7 for r in trace)
    usage = [r["response"]["usage"] for r in trace]
    assert status["tokens"] == {
        "prompt": sum(u["prompt_tokens"] for u in usage),
        "completion": sum(u["completion_tokens"] for u in usage),
    }
    assert status["tokens"]["prompt"] > 0
    # The worker's report reaches the orchestrator as the delegate result; the shell output reaches worker-2.
    delegated = json.loads(tool_messages(trace[3])[0])
    assert delegated == {"agent_id": "worker-1", "status": "success", "report": "analysis.py written"}
    assert '{"mean": 2.0}' in tool_messages(trace[6])[-1]
    # status.json records what the sandbox gave the shell calls on this machine.
    probe = run_sandboxed("true", tmp_path, SandboxLimits(timeout_s=10))
    assert status["sandbox"]["network_isolated"] is probe.network_isolated
    assert status["sandbox"]["note"].startswith("1 shell command(s) ran sandboxed")
    audit = audit_episode(tmp_path / "out")
    assert (audit.threads, audit.workers, audit.delegation, audit.delegations_ok) == (3, 2, True, 2)
    assert audit.code_handoff and audit.handoffs == [
        {"file": "analysis.py", "writer": "worker-1", "reader": "worker-2", "read_seq": 4}
    ]


def test_mass_episode_command_reads_episode_json_and_writes_out(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"orchestrator": [Reply.call("list_files", path="."), Reply.text("seen data.csv")]})
    src = tmp_path / "in"
    (src / "workspace").mkdir(parents=True)
    (src / "workspace" / "data.csv").write_text("x\n1\n")
    doc = {
        "prompt": "Look at the data.",
        "endpoint": {"base_url": ep.base_url, "model": "scripted"},
        "limits": {"turns_per_agent": 4, "request_retries": 0},
        "sampling": {"max_output_tokens": 64},
        "harness": "builtin",
        "seed": 1,
        "files": {"notes/readme.txt": "hello"},
    }
    (src / "episode.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert cli_main(["episode", "--in", str(src), "--out", str(out)]) == 0
    status = json.loads((out / "status.json").read_text())
    assert (status["outcome"], status["counts"]["turns"]) == ("success", 2)
    assert (out / "workspace" / "data.csv").read_text() == "x\n1\n"
    assert (out / "workspace" / "notes" / "readme.txt").read_text() == "hello"
    trace = read_trace(out / "trace.jsonl")
    assert trace[0]["request"]["sampling"]["max_tokens"] == 64
    assert "data.csv\t4" in tool_messages(trace[1])[0] and "notes/readme.txt\t5" in tool_messages(trace[1])[0]
    doc["limits"] = {"turns_per_agnet": 4}
    (src / "episode.json").write_text(json.dumps(doc))
    assert cli_main(["episode", "--in", str(src), "--out", str(tmp_path / "out2")]) == 2


@pytest.mark.parametrize(
    "replies, retries, outcome, records, reason",
    [
        pytest.param([Reply.fail(500), Reply.fail(503)], 1, "infra_error", 2, "upstream_status", id="http-500s"),
        pytest.param([Reply(content="late", delay_s=3)], 0, "infra_error", 1, "timeout", id="request-timeout"),
        pytest.param([Reply.fail(400, "bad request")], 3, "infra_error", 1, "HTTP 400", id="http-400-no-retry"),
    ],
)
def test_endpoint_failures_are_classified(scripted_endpoint, tmp_path, replies, retries, outcome, records, reason):
    ep = scripted_endpoint({"orchestrator": replies})
    result, status, trace = episode(ep, tmp_path, limits=limits(request_retries=retries, request_timeout_s=1))
    assert result.outcome == outcome and reason in result.reason
    assert len(trace) == records
    assert status["counts"]["turns"] == 1 and status["counts"]["tool_calls"] == 0


def test_malformed_tool_call_json_goes_back_to_the_model(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(
        {
            "orchestrator": [
                Reply(tool_calls=[{"name": "delegate", "arguments": '{"assignment": "write x.py"'}]),
                Reply(tool_calls=[{"name": "no_such_tool", "arguments": {}}]),
                Reply(tool_calls=[{"name": "delegate", "arguments": {"assignment": 5}}]),
                Reply.text("I could not delegate."),
            ]
        }
    )
    result, status, trace = episode(ep, tmp_path)
    assert result.outcome == "no_work" and result.final_report == "I could not delegate."  # every call failed
    assert status["counts"] == {"turns": 4, "tool_calls": 3, "delegations": 0, "agents": 1, "tool_errors": 3}
    errors = tool_messages(trace[3])
    assert len(errors) == 3 and all(e.startswith("ERROR:") for e in errors)
    assert "not valid JSON" in errors[0] and "unknown tool 'no_such_tool'" in errors[1]
    assert "'assignment' must be a string" in errors[2]


def test_repeated_malformed_calls_end_as_loop(scripted_endpoint, tmp_path):
    bad = Reply(tool_calls=[{"name": "read_file", "arguments": "{path: x}"}])
    ep = scripted_endpoint({"orchestrator": [bad]}, repeat_last=True)
    result, status, trace = episode(ep, tmp_path)
    assert result.outcome == "loop_detected" and "read_file({path: x}) 3 times" in result.reason
    assert len(trace) == 3 and status["counts"]["tool_calls"] == 3 and status["counts"]["tool_errors"] == 2


def test_loop_detection_in_a_worker_ends_the_episode(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="list the files")],
            "worker-1": [Reply.call("list_files", path=".")],
        },
        repeat_last=True,
    )
    result, status, trace = episode(ep, tmp_path, limits=limits(loop_repeats=4))
    assert result.outcome == "loop_detected" and result.reason.startswith("worker-1 made the same call list_files")
    assert [r["agent"]["id"] for r in trace] == ["orchestrator"] + ["worker-1"] * 4
    assert status["counts"]["tool_calls"] == 5


@pytest.mark.parametrize("wall_s, request_timeout_s, outcome", [(5, 30, "timeout"), (60, 10, "infra_error")])
def test_a_request_timing_out_on_what_is_left_of_the_wall_time_is_the_episodes_timeout(
    scripted_endpoint, tmp_path, monkeypatch, wall_s, request_timeout_s, outcome
):
    """A call's timeout is what is left of the wall time when that is shorter than request_timeout_s;
    the client's timer and the harness's wait then end together, and whichever is first the episode
    ran out of time (`timeout`). With the request's own, shorter timeout, it is the endpoint's."""
    from mass_jobs.serving import llm

    def times_out(self, *args, **kwargs):
        raise llm.ModelError("timeout after the time left", kind="timeout", attempts=1)

    monkeypatch.setattr(llm.ModelClient, "chat", times_out)
    ep = scripted_endpoint({"orchestrator": [Reply(content="never asked")]})
    result, _, _ = episode(ep, tmp_path, limits=limits(wall_s=wall_s, request_timeout_s=request_timeout_s))
    assert result.outcome == outcome, result.reason


def test_wall_time_limit_gives_timeout(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("list_files", path="."), Reply(content="too late", delay_s=5)],
        }
    )
    result, status, trace = episode(ep, tmp_path, limits=limits(wall_s=1.5, request_timeout_s=30))
    assert result.outcome == "timeout" and "1.5s" in result.reason
    assert 1.4 <= status["timings"]["wall_s"] < 4.5
    assert status["counts"]["turns"] == 2


def test_depth_limit_returns_an_error_to_the_caller(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(
        {
            "orchestrator": [
                Reply.call("delegate", assignment="do it"),
                Reply.call("finish", summary="nobody to delegate to", status="failure"),
            ]
        }
    )
    result, status, trace = episode(ep, tmp_path, limits=limits(delegation_depth=0))
    assert result.outcome == "failed" and "nobody to delegate to" in result.reason
    assert tool_messages(trace[1]) == ["ERROR: delegation depth limit 0 reached: orchestrator may not delegate"]
    assert status["counts"]["delegations"] == 0 and status["counts"]["agents"] == 1
    assert not audit_episode(tmp_path / "out").delegation


def test_nested_delegation_within_depth_and_beyond(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", agent_id="lead", assignment="organise"), Reply.text("done")],
            "lead": [Reply.call("delegate", agent_id="helper", assignment="help"), Reply.text("lead done")],
            "helper": [Reply.call("delegate", assignment="deeper"), Reply.text("helper done")],
        }
    )
    result, status, trace = episode(ep, tmp_path, limits=limits(delegation_depth=2))
    assert result.outcome == "no_work"  # delegations all the way down, and nobody touched the workspace
    helper = [r for r in trace if r["agent"]["id"] == "helper"]
    assert helper[0]["agent"]["parent"] == "lead"
    assert "delegate" not in [t["function"]["name"] for t in helper[0]["request"]["tools"]]
    assert tool_messages(helper[1]) == [
        "ERROR: unknown tool 'delegate'; available: finish, list_files, read_file, shell, write_file"
    ]
    assert status["counts"]["delegations"] == 2 and status["counts"]["agents"] == 3


def test_turn_and_tool_call_limits_fail_the_episode(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({"orchestrator": [Reply.call("list_files", path="."), Reply.call("list_files", path="a")]})
    result, _, _ = episode(ep, tmp_path, limits=limits(turns_per_agent=2))
    assert result.outcome == "failed" and "used all 2 turns" in result.reason
    ep = scripted_endpoint({"orchestrator": [Reply.call("list_files", path="."), Reply.call("list_files", path="a")]})
    result, status, _ = episode(ep, tmp_path / "b", limits=limits(tool_calls=1))
    assert result.outcome == "failed" and "tool-call limit of 1" in result.reason
    assert status["counts"]["tool_calls"] == 2


def test_limits_default_to_upstreams_and_an_uncapped_episode_runs_past_the_old_caps(scripted_endpoint, tmp_path):
    """Upstream's run_episode.sh caps no turn, tool call or wall time (600 s per shell command,
    1,800 s per response): the defaults; a 45-turn, 250-call episode (past the project's former
    40 turns and 200 calls) runs to its own end."""
    d = EpisodeLimits()
    assert (d.turns_per_agent, d.tool_calls, d.wall_s, d.shell_timeout_s, d.request_timeout_s) == (
        None,
        None,
        None,
        600,
        1800,
    )
    calls = [Reply.call("list_files", path=".")] + [Reply.call("list_files", path=f"d{i}") for i in range(1, 44)]
    many = Reply(tool_calls=[{"name": "list_files", "arguments": {"path": f"m{i}"}} for i in range(207)])
    ep = scripted_endpoint({"orchestrator": calls + [many, Reply.call("finish", summary="done", status="success")]})
    uncapped = limits(turns_per_agent=None, tool_calls=None, wall_s=None)
    result, status, trace = episode(ep, tmp_path, limits=uncapped)
    assert result.outcome == "success", result.reason
    assert (status["counts"]["turns"], status["counts"]["tool_calls"], len(trace)) == (46, 252, 46)


def test_worker_turn_limit_is_an_error_for_the_caller_not_the_episode(scripted_endpoint, tmp_path):
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="work"), Reply.text("worker failed, stopping")],
            "worker-1": [Reply.call("list_files", path="."), Reply.call("list_files", path="x")],
        }
    )
    result, status, trace = episode(ep, tmp_path, limits=limits(turns_per_agent=2))
    assert result.outcome == "success"
    (report,) = tool_messages(trace[3])
    assert report.startswith("ERROR: worker did not succeed") and "used all 2 turns" in report
    assert not audit_episode(tmp_path / "out").delegation


def test_shell_cannot_see_secrets_or_files_outside_the_workspace(scripted_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("MASS_TEST_SECRET", "hunter2")
    (tmp_path / "outside.txt").write_text("TOPSECRET")
    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="find secrets"), Reply.text("done")],
            "worker-1": [
                Reply.call("shell", command='echo "secret=[$MASS_TEST_SECRET]"; env'),
                Reply.call("read_file", path="../outside.txt"),
                Reply.call("write_file", path="../escaped.txt", content="x"),
                Reply.call("shell", command="cat ../outside.txt"),
                Reply.text("nothing found"),
            ],
        }
    )
    result, status, trace = episode(ep, tmp_path)
    assert result.outcome == "success"
    env_out, read_out, write_out, cat_out = tool_messages(trace[5])
    assert "secret=[]" in env_out and "hunter2" not in json.dumps(trace)
    assert read_out.startswith("ERROR: path '../outside.txt' is outside the workspace")
    assert write_out.startswith("ERROR: path '../escaped.txt' is outside the workspace")
    assert not (tmp_path / "escaped.txt").exists()
    assert cat_out.startswith("ERROR: command failed") and "TOPSECRET" not in cat_out
    assert status["counts"]["tool_errors"] == 3


@pytest.mark.slow(cost=10)  # a model server and a whole episode on it: the slow tier
def test_tiny_model_episode_ends_with_a_classified_status(tiny_model_dir, tmp_path):
    from mass_jobs.serving.serve import ModelServer

    with ModelServer(tiny_model_dir, served_name="tiny") as srv:
        inp = EpisodeInput(
            prompt="Write hello.py that prints hello.",
            endpoint=srv.endpoint,
            limits=limits(turns_per_agent=2, request_timeout_s=120, wall_s=240),
            sampling=Sampling(max_output_tokens=32),
            seed=0,
        )
        result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    validate_status(status)
    assert result.outcome in ("success", "no_work", "failed", "loop_detected") and result.outcome == status["outcome"]
    assert result.outcome != "success" or status["counts"]["tool_calls"] > 0
    trace = read_trace(tmp_path / "out" / "trace.jsonl")
    assert 1 <= len(trace) == status["counts"]["turns"] <= 2 * status["counts"]["agents"]
    assert all(r["status"] == 200 and r["request"]["sampling"]["max_tokens"] == 32 for r in trace)
    assert all(r["response"]["usage"]["completion_tokens"] <= 32 for r in trace)
    assert status["tokens"]["completion"] == sum(r["response"]["usage"]["completion_tokens"] for r in trace)


def test_status_schema_is_closed_and_names_bad_fields():
    good = {
        "outcome": "success", "reason": "r", "harness": "builtin",
        "counts": {"turns": 1, "tool_calls": 0, "delegations": 0, "agents": 1},
        "tokens": {"prompt": 1, "completion": 1}, "timings": {"wall_s": 0.1},
        "sandbox": {"network_isolated": True, "note": ""},
    }  # fmt: skip
    validate_status(good)
    with pytest.raises(
        ValueError, match=r"\$\.counts: Additional properties are not allowed \('turn' was unexpected\)"
    ):
        validate_status({**good, "counts": {**good["counts"], "turn": 1}})
    with pytest.raises(ValueError, match=r"\$\.outcome: 'crashed' is not one of"):
        validate_status({**good, "outcome": "crashed"})


def test_a_no_work_reason_says_that_its_tool_calls_ran_and_were_killed(scripted_endpoint, tmp_path):
    """Every shell call killed by a limit is no work, and the reason points at the limit, not at a
    model that never called a tool."""
    ep = scripted_endpoint(
        {"*": [Reply.call("shell", command="sleep 5"), Reply.call("shell", command="sleep 6"), Reply.text("done")]}
    )
    limits = EpisodeLimits(shell_timeout_s=0.5)
    inp = EpisodeInput(prompt="Sleep.", endpoint=ep.endpoint, limits=limits, single_agent=True, seed=0)
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    assert (result.outcome, result.reason) == (
        "no_work",
        "agent finished, but every workspace tool call failed: 2 ran and failed; 2 killed by a limit (wall_timeout)",
    )
