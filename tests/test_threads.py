"""One grouping of a trace into conversations (mass_jobs/episodes/threads.py): the audit's threads, the
render step's threads and the qwen-code harness's turn counts are the same calls.

    .venv/bin/python -m pytest -q tests/test_threads.py
"""

from __future__ import annotations

import pytest

from mass_jobs.episodes.audit import split_threads
from mass_jobs.episodes.threads import group_calls
from mass_jobs.steps.sft_threads import rebuild_threads

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

LEAD_TOOLS = [
    {"type": "function", "function": {"name": "agent", "parameters": {}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {}}},
]
WORKER_TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {}}}]


DELEGATION = {
    "id": "c1",
    "type": "function",
    "function": {"name": "agent", "arguments": '{"prompt": "Write fib.py with a fib(n) function"}'},
}


def call(seq, messages, tools, reply, reasoning=None, finish="tool_calls", tool_calls=None):
    message = {"role": "assistant", "content": reply}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "seq": seq,
        "request": {"messages": messages, "tools": tools},
        "response": {"message": message, "finish_reason": finish},
    }


def headerless_trace() -> list[dict]:
    """A qwen-code-like trace (no role headers): the lead delegates, the worker answers twice, a
    5xx retry resends the worker's request unchanged, the lead's history drops its reasoning."""
    sys_lead = {"role": "system", "content": "You lead."}
    sys_worker = {"role": "system", "content": "You are a sub-agent."}
    task = {"role": "user", "content": "Write fib.py"}
    assignment = {"role": "user", "content": "Write fib.py with a fib(n) function"}
    w1 = [sys_worker, assignment]
    w2 = [*w1, {"role": "assistant", "content": "writing"}, {"role": "user", "content": "continue"}]
    return [
        call(0, [sys_lead, task], LEAD_TOOLS, "delegating", reasoning="plan: delegate", tool_calls=[DELEGATION]),
        call(1, w1, WORKER_TOOLS, "writing"),
        call(2, w2, WORKER_TOOLS, "done"),
        call(3, w2, WORKER_TOOLS, "done"),  # the retry of call 2: the same conversation
        call(
            4,
            [
                sys_lead,
                task,
                {"role": "assistant", "content": "delegating", "tool_calls": [DELEGATION]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
            LEAD_TOOLS,
            "ok",
            finish="stop",
        ),
    ]


def test_audit_and_render_see_the_same_conversations():
    records = headerless_trace()
    groups = [[r["seq"] for r in c.calls] for c in group_calls(records)]
    assert groups == [[0, 4], [1, 2, 3]]
    assert [[r["seq"] for r in t.records] for t in split_threads(records, "qwen-code")] == groups
    assert [[r["seq"] for r in t.calls] for t in rebuild_threads(records, "qwen-code")] == groups
    assert [t.role for t in split_threads(records, "qwen-code")] == ["orchestrator", "worker"]
    lead, worker = rebuild_threads(records, "qwen-code")
    assert [t.role for t in (lead, worker)] == ["orchestrator", "worker"]
    # the history copy lost its reasoning; the recorded response restores it for training
    assert lead.messages[2]["reasoning_content"] == "plan: delegate" and lead.messages[-1]["content"] == "ok"


def test_a_change_of_tools_or_agent_starts_another_conversation():
    records = headerless_trace()
    records[2]["request"]["tools"] = LEAD_TOOLS  # the same messages offered other tools: its own
    # conversation, and the retry (worker tools again) continues the worker's first call
    assert [[r["seq"] for r in c.calls] for c in group_calls(records)] == [[0, 4], [1, 3], [2]]
    headed = headerless_trace()
    for r in headed:
        r["agent"] = {"id": "w1" if r["request"]["tools"] == WORKER_TOOLS else "orchestrator"}
    headed[3]["agent"] = {"id": "w2"}  # another agent sending the same messages is another conversation
    assert [[r["seq"] for r in c.calls] for c in group_calls(headed)] == [[0, 4], [1, 2], [3]]
    assert [[r["seq"] for r in t.records] for t in split_threads(headed)] == [[0, 4], [1, 2], [3]]
