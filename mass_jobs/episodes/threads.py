"""One trace, one grouping into agent conversations: the audit measures delegation on it, the
render step trains on it and the qwen-code harness counts its turn limits on it.

A call continues a conversation when its request's messages extend that conversation's last
request (equal up to reasoning, which harnesses often drop from history) and it has the same
agent and tools. A call with a known agent (the harness's role headers) only continues that
agent's latest conversation; without headers (qwen-code) it continues the latest conversation it
extends. Anything else starts a new conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


def text_of(content: Any) -> str:
    """Message content as text: strings as-is, OpenAI content parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, sort_keys=True)


def _arguments(raw: Any) -> Any:
    """Chat templates serialise arguments themselves, so hand them a parsed object when we can."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def normal_message(m: dict) -> dict:
    """A request or response message in the one shape both readers compare and render."""
    out: dict[str, Any] = {"role": m.get("role"), "content": text_of(m.get("content"))}
    if m.get("reasoning_content"):
        out["reasoning_content"] = text_of(m["reasoning_content"])
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": tc.get("id"),
                "type": "function",
                "function": {
                    "name": (tc.get("function") or {}).get("name"),
                    "arguments": _arguments((tc.get("function") or {}).get("arguments")),
                },
            }
            for tc in m["tool_calls"]
            if isinstance(tc, dict)
        ]
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def same_turn(a: dict, b: dict) -> bool:
    """Equality of two messages up to reasoning."""
    strip = ("reasoning_content",)
    return {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}


def extends(prev: list[dict], new: list[dict]) -> bool:
    return len(new) >= len(prev) and all(same_turn(p, n) for p, n in zip(prev, new))


@dataclass
class Conversation:
    """The calls of one agent conversation, in call order; `messages[i]` is call i's request."""

    agent: dict | None
    tools: list | None
    calls: list[dict] = field(default_factory=list)
    messages: list[list[dict]] = field(default_factory=list)

    @property
    def agent_id(self) -> str | None:
        return self.agent.get("id") if self.agent else None


def group_calls(records: list[dict]) -> list[Conversation]:
    """The trace's calls (by seq) grouped into conversations; a call without messages is none's."""
    out: list[Conversation] = []
    for rec in sorted(records, key=lambda r: r.get("seq", 0)):
        req = rec.get("request") or {}
        msgs = [normal_message(m) for m in req.get("messages") or [] if isinstance(m, dict)]
        if not msgs:
            continue
        agent = rec.get("agent") or None
        agent_id = agent.get("id") if agent else None
        tools = req.get("tools") or None
        target = None
        for c in reversed(out):
            if c.agent_id != agent_id or c.tools != tools:
                continue
            if extends(c.messages[-1], msgs):
                target = c
            if agent_id is not None or target is not None:
                break  # a known agent only continues its latest conversation
        if target is None:
            target = Conversation(agent=agent, tools=tools)
            out.append(target)
        target.calls.append(rec)
        target.messages.append(msgs)
    return out
