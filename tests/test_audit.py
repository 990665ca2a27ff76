"""Behaviour audit over hand-written traces: D, H and revisions for both tool vocabularies, and the CLI."""

from __future__ import annotations

import json

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.episodes.audit import DELEGATE_TOOLS, audit_episode, audit_records, split_threads
from mass_jobs.episodes.delegation import DELEGATION_TOOLS, can_delegate, delegation_tools
from mass_jobs.episodes.harness import HARNESSES


def tools(*names: str) -> list[dict]:
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


# What each kind of thread is offered, as the harnesses send it (tool lists are per request).
TOOLS = {
    "orchestrator": tools("delegate", "read_file", "list_files", "finish"),
    "worker": tools("write_file", "read_file", "shell", "finish"),
    "main": tools("agent", "write_file", "read_file", "run_shell_command"),
    "sub": tools("write_file", "read_file", "run_shell_command"),
}


class TraceBuilder:
    """Writes trace records the way the recording proxy does: full request messages + response message."""

    def __init__(self, with_agents: bool = True, ids: str = "unique"):
        self.ids = (
            ids  # "unique"; "missing": the server sent none (the harness made its own); "reused": call_0 every turn
        )
        self.records: list[dict] = []
        self.convs: dict[str, list[dict]] = {}
        self.tools: dict[str, list[dict] | None] = {}
        self.with_agents = with_agents
        self.n = 0

    def start(self, thread: str, system: str, user: str, tools: list[dict] | None = None) -> None:
        self.convs[thread] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.tools[thread] = tools

    def turn(self, thread: str, role: str, *, calls=(), text=None, parent=None) -> list[str]:
        """One model call of `thread`; calls = [(name, args_dict_or_raw_str)]. Returns the call ids."""
        msgs = self.convs[thread]
        ids, tool_calls = [], []
        for i, (name, args) in enumerate(calls):
            self.n += 1
            ids.append(f"call_{i}" if self.ids == "reused" else f"c{self.n}")
            raw = args if isinstance(args, str) else json.dumps(args)
            tool_calls.append({"id": ids[-1], "type": "function", "function": {"name": name, "arguments": raw}})
        sent = [{**c, "id": None} for c in tool_calls] if self.ids == "missing" else tool_calls
        response = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": sent}
        self.records.append(
            {
                "seq": len(self.records),
                "agent": {"id": thread, "role": role, "parent": parent} if self.with_agents else None,
                "request": {"model": "m", "messages": [dict(m) for m in msgs], "tools": self.tools[thread]},
                "response": {"message": response, "finish_reason": "stop", "usage": None},
                "status": 200,
                "error": None,
            }
        )
        msgs.append(
            {"role": "assistant", "content": text or "", "tool_calls": tool_calls}
            if tool_calls
            else {"role": "assistant", "content": text or ""}
        )
        return ids

    def result(self, thread: str, call_id: str, content: str) -> None:
        self.convs[thread].append({"role": "tool", "tool_call_id": call_id, "content": content})


def builtin_handoff_trace(
    with_agents: bool = True, reader_reads: str = "analysis.py", ids: str = "unique"
) -> list[dict]:
    t = TraceBuilder(with_agents, ids)
    t.start("orchestrator", "You are the orchestrator", "Analyse the data.", TOOLS["orchestrator"])
    a1 = "Write analysis.py that prints the mean of data.csv."
    (d1,) = t.turn("orchestrator", "orchestrator", calls=[("delegate", {"agent_id": "worker-1", "assignment": a1})])
    t.start("worker-1", "You are worker-1", a1, TOOLS["worker"])
    (w,) = t.turn("worker-1", "worker", calls=[("write_file", {"path": "analysis.py", "content": "print(1)"})])
    t.result("worker-1", w, "wrote 8 bytes to analysis.py")
    (f,) = t.turn("worker-1", "worker", calls=[("finish", {"summary": "analysis.py written"})])
    t.result("orchestrator", d1, json.dumps({"agent_id": "worker-1", "status": "success", "report": "done"}))
    a2 = "Review analysis.py and write review.md."
    (d2,) = t.turn("orchestrator", "orchestrator", calls=[("delegate", {"agent_id": "worker-2", "assignment": a2})])
    t.start("worker-2", "You are worker-2", a2, TOOLS["worker"])
    (r,) = t.turn("worker-2", "worker", calls=[("read_file", {"path": reader_reads})])
    t.result("worker-2", r, "print(1)")
    t.turn("worker-2", "worker", text="Looks fine.")
    t.result("orchestrator", d2, json.dumps({"agent_id": "worker-2", "status": "success", "report": "Looks fine."}))
    t.turn("orchestrator", "orchestrator", text="All done.")
    return t.records


def test_builtin_trace_has_delegation_and_handoff():
    audit = audit_records(builtin_handoff_trace())
    assert (audit.calls, audit.threads, audit.workers) == (7, 3, 2)
    assert audit.delegation and (audit.delegations_ok, audit.delegations_failed) == (2, 0)
    assert audit.code_handoff
    assert audit.handoffs == [{"file": "analysis.py", "writer": "worker-1", "reader": "worker-2", "read_seq": 4}]
    assert (audit.revisions, audit.redelegations, audit.rewrites) == (0, 0, 0)


@pytest.mark.parametrize("ids", ["missing", "reused"])
def test_results_are_found_when_servers_omit_or_reuse_call_ids(ids):
    audit = audit_records(builtin_handoff_trace(ids=ids))
    assert (audit.delegations_ok, audit.code_handoff) == (2, True)
    failed_read = builtin_handoff_trace(ids=ids)
    failed_read[5]["request"]["messages"][-1]["content"] = "ERROR: no such file: 'analysis.py'"
    assert not audit_records(failed_read).code_handoff  # a read that failed hands nothing off


def test_threads_without_agent_headers_come_from_message_prefixes():
    records = builtin_handoff_trace(with_agents=False)
    threads = split_threads(records)
    assert [(t.id, t.role, [r["seq"] for r in t.records]) for t in threads] == [
        ("orchestrator", "orchestrator", [0, 3, 6]),
        ("worker-1", "worker", [1, 2]),
        ("worker-2", "worker", [4, 5]),
    ]
    audit = audit_records(records)
    assert audit.delegation and audit.code_handoff and audit.handoffs[0]["writer"] == "worker-1"


def test_reading_another_file_or_own_file_is_no_handoff():
    assert not audit_records(builtin_handoff_trace(reader_reads="data.csv")).code_handoff
    t = TraceBuilder()
    t.start("orchestrator", "orc", "task")
    (d,) = t.turn("orchestrator", "orchestrator", calls=[("delegate", {"assignment": "write and read x.py"})])
    t.start("worker-1", "w1", "write and read x.py")
    (w,) = t.turn("worker-1", "worker", calls=[("write_file", {"path": "x.py", "content": "1"})])
    t.result("worker-1", w, "wrote")
    (r,) = t.turn("worker-1", "worker", calls=[("read_file", {"path": "x.py"})])
    t.result("worker-1", r, "1")
    t.turn("worker-1", "worker", text="done")
    t.result("orchestrator", d, "done")
    t.turn("orchestrator", "orchestrator", text="ok")
    audit = audit_records(t.records)
    assert audit.delegation and not audit.code_handoff


def test_failed_delegation_is_no_d_and_redelegation_and_rewrites_are_revisions():
    t = TraceBuilder()
    t.start("orchestrator", "orc", "task")
    a = "Fit the model in fit.py and save results/metrics.json with the rmse."
    (d1,) = t.turn("orchestrator", "orchestrator", calls=[("delegate", {"agent_id": "fitter", "assignment": a})])
    t.start("fitter", "w", a)
    (w1,) = t.turn("fitter", "worker", calls=[("write_file", {"path": "fit.py", "content": "x"})])
    t.result("fitter", w1, "wrote")
    (w2,) = t.turn("fitter", "worker", calls=[("write_file", {"path": "./fit.py", "content": "y"})])
    t.result("fitter", w2, "wrote")
    t.turn("fitter", "worker", calls=[("finish", {"summary": "crashed", "status": "failure"})])
    t.result("orchestrator", d1, "ERROR: worker did not succeed\n{}")
    narrowed = "Only fix fit.py so it saves results/metrics.json with the rmse."
    (d2,) = t.turn("orchestrator", "orchestrator", calls=[("delegate", {"agent_id": "fixer", "assignment": narrowed})])
    t.start("fixer", "w", narrowed)
    t.turn("fixer", "worker", text="fixed")
    t.result("orchestrator", d2, json.dumps({"status": "success", "report": "fixed"}))
    t.turn("orchestrator", "orchestrator", text="done")
    audit = audit_records(t.records)
    assert (audit.delegations_ok, audit.delegations_failed, audit.delegation) == (1, 1, True)
    assert (audit.redelegations, audit.rewrites, audit.revisions) == (1, 1, 2)


def test_unanswered_or_errored_delegations_give_no_d():
    t = TraceBuilder()
    t.start("orchestrator", "orc", "task")
    (d,) = t.turn("orchestrator", "orchestrator", calls=[("delegate", {"assignment": "x"})])
    t.result("orchestrator", d, "ERROR: delegation depth limit 0 reached: orchestrator may not delegate")
    t.turn("orchestrator", "orchestrator", calls=[("delegate", {"assignment": "y"})])  # episode ended before result
    audit = audit_records(t.records)
    assert (audit.delegation, audit.delegations_ok, audit.delegations_failed) == (False, 0, 1)


def qwen_style_trace() -> list[dict]:
    """qwen-code vocabulary: `agent` tool with `prompt`, absolute `file_path`s, no agent headers, a side call."""
    t = TraceBuilder(with_agents=False)
    t.start("main", "You are Qwen Code", "Context: working in /ws\nTask: build it", TOOLS["main"])
    p1 = "Write /ws/src/model.py with a fit function."
    (a1,) = t.turn(
        "main", "", calls=[("agent", {"description": "write model", "prompt": p1, "subagent_type": "general-purpose"})]
    )
    t.start("sub1", "You are a general-purpose agent", p1, TOOLS["sub"])
    (w,) = t.turn("sub1", "", calls=[("write_file", {"file_path": "/ws/src/model.py", "content": "def fit(): ..."})])
    t.result("sub1", w, "Successfully created and wrote to new file: /ws/src/model.py.")
    t.turn("sub1", "", text="Wrote /ws/src/model.py")
    t.result("main", a1, "Wrote /ws/src/model.py")
    t.start("side", "Summarise the tool use", "summarise")
    t.turn("side", "", text="summary")
    p2 = "Test src/model.py."
    (a2,) = t.turn(
        "main", "", calls=[("agent", {"description": "test", "prompt": p2, "subagent_type": "general-purpose"})]
    )
    t.start("sub2", "You are a general-purpose agent", p2, TOOLS["sub"])
    (r,) = t.turn("sub2", "", calls=[("read_file", {"file_path": "/ws/src/model.py"})])
    t.result("sub2", r, "def fit(): ...")
    t.turn("sub2", "", text="ok")
    t.result("main", a2, "ok")
    t.turn("main", "", text="done")
    return t.records


def test_qwen_code_vocabulary_and_auxiliary_threads():
    records = qwen_style_trace()
    roles = [(t.id, t.role) for t in split_threads(records)]
    assert roles == [
        ("orchestrator", "orchestrator"),
        ("worker-1", "worker"),
        ("aux-1", "auxiliary"),
        ("worker-2", "worker"),
    ]
    audit = audit_records(records)
    assert (audit.workers, audit.delegations_ok, audit.delegation, audit.code_handoff) == (2, 2, True, True)
    assert audit.handoffs[0]["file"] == "/ws/src/model.py"


def test_one_delegation_table_covers_every_harness():
    assert set(DELEGATION_TOOLS) == set(HARNESSES)
    assert (delegation_tools("builtin"), delegation_tools("qwen-code")) == ({"delegate"}, {"agent", "task"})
    assert delegation_tools(None) == DELEGATE_TOOLS == {"delegate", "agent", "task"}
    assert can_delegate(TOOLS["main"], "qwen-code") and not can_delegate(TOOLS["main"], "builtin")
    assert not can_delegate(TOOLS["sub"]) and not can_delegate(None)
    with pytest.raises(ValueError, match=r"harness: expected one of \['builtin', 'qwen-code'\], got 'claude'"):
        delegation_tools("claude")


def test_headerless_threads_are_classified_by_the_harness_delegation_tool():
    # A side call that comes first is no orchestrator: only the thread offered `agent` is.
    records = qwen_style_trace()
    side = {
        **records[0],
        "seq": -1,
        "request": {
            "model": "m",
            "tools": None,
            "messages": [{"role": "system", "content": "Generate a title"}, {"role": "user", "content": "build it"}],
        },
    }
    roles = [(t.id, t.role) for t in split_threads([side, *records], "qwen-code")]
    assert roles == [
        ("aux-1", "auxiliary"),
        ("orchestrator", "orchestrator"),
        ("worker-1", "worker"),
        ("aux-2", "auxiliary"),
        ("worker-2", "worker"),
    ]
    # Under the built-in harness's table `agent` delegates nothing: no orchestrator, no worker, no D.
    assert {t.role for t in split_threads(records, "builtin")} == {"auxiliary"}
    audit = audit_records(records, harness="builtin")
    assert (audit.delegation, audit.delegations_ok, audit.workers) == (False, 0, 0)
    assert audit_records(records, harness="qwen-code").delegations_ok == 2


def test_audit_episode_takes_the_harness_from_status_json(tmp_path):
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in qwen_style_trace()))
    (tmp_path / "status.json").write_text(json.dumps({"harness": "builtin"}))
    assert audit_episode(tmp_path).delegations_ok == 0
    (tmp_path / "status.json").write_text(json.dumps({"harness": "qwen-code"}))
    assert audit_episode(tmp_path).delegations_ok == 2


def test_cli_table_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps cells at the terminal width
    good, plain = tmp_path / "ep-0", tmp_path / "ep-1"
    for d, records in ((good, builtin_handoff_trace()), (plain, builtin_handoff_trace(reader_reads="data.csv"))):
        d.mkdir()
        (d / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli_main(["audit", str(good), str(plain), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"] == {"episodes": 2, "delegation": 2, "code_handoff": 1, "revised": 0, "unreadable": 0}
    assert [e["code_handoff"] for e in out["episodes"]] == [True, False]
    assert cli_main(["audit", str(good), str(plain)]) == 0
    table = capsys.readouterr().out
    assert "analysis.py" in table and "1/2" in table and "2/2" in table
    assert cli_main(["audit", str(tmp_path / "missing")]) == 2


def test_torn_last_line_is_skipped_but_a_corrupt_middle_line_is_the_episodes_error(tmp_path):
    lines = [json.dumps(r) for r in builtin_handoff_trace()]
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + '\n{"seq": 7, "requ')
    assert audit_episode(tmp_path).calls == 7
    (tmp_path / "trace.jsonl").write_text("\n".join([lines[0], "{oops", *lines[1:]]))
    broken = audit_episode(tmp_path)  # the episode's error, counted; never the command's crash
    assert broken.calls == 0 and "trace.jsonl: line 2: not a JSON trace record" in broken.error
