"""The shape a recorded call must have before render or audit reads it.

A trace is written by the recording proxy, but what it records (the request's messages, the
reply) is whatever a harness and a model sent, and a stored trace may have been damaged since.
Render and audit read only traces that pass `trace_problems`; one that does not is the episode's
error, recorded and counted, never a crash of the step.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

MAX_PROBLEMS = 5  # per episode: the first few say enough


def parse_lines(text: str) -> tuple[list[dict], list[str]]:
    """(records, problems) of a trace file's text; a torn last line (a killed episode) is skipped."""
    records: list[dict] = []
    problems: list[str] = []
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError) as exc:
            if i != last:
                problems.append(f"line {i + 1}: not a JSON trace record ({type(exc).__name__})")
    return records, problems


def _content_ok(content: Any) -> bool:
    return (
        content is None
        or isinstance(content, str)
        or (
            isinstance(content, list)
            and all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content)
        )
    )


def _message_problem(m: Any) -> str | None:
    if not isinstance(m, dict):
        return f"a message is a {type(m).__name__}, not an object"
    if not isinstance(m.get("role"), str):
        return "a message has no string role"
    if not _content_ok(m.get("content")) or not _content_ok(m.get("reasoning_content")):
        return f"a {m['role']} message's content is neither text nor text parts"
    calls = m.get("tool_calls")
    if calls is not None and (
        not isinstance(calls, list)
        or not all(isinstance(c, dict) and isinstance(c.get("function") or {}, dict) for c in calls)
    ):
        return f"a {m['role']} message's tool_calls are not a list of objects"
    return None


def record_problem(rec: Any) -> str | None:
    """Why one trace record cannot be read as a call, or None."""
    if not isinstance(rec, dict):
        return f"a record is a {type(rec).__name__}, not an object"
    seq = rec.get("seq", 0)
    if isinstance(seq, bool) or not isinstance(seq, int):
        return f"record seq {str(seq)[:40]!r} is not an integer"
    req = rec.get("request")
    if req is not None:
        if not isinstance(req, dict):
            return f"record {seq}: request is not an object"
        msgs = req.get("messages")
        if msgs is not None and not isinstance(msgs, list):
            return f"record {seq}: request.messages is not a list"
        for m in msgs or []:
            if why := _message_problem(m):
                return f"record {seq}: request: {why}"
        tools = req.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            return f"record {seq}: request.tools is not a list of objects"
    resp = rec.get("response")
    if resp is not None:
        if not isinstance(resp, dict):
            return f"record {seq}: response is not an object"
        msg = resp.get("message")
        if msg is not None and (why := _message_problem(msg)):
            return f"record {seq}: response: {why}"
    for key in ("agent", "error"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            return f"record {seq}: {key} is not an object"
    return None


def trace_problems(records: list[Any], parse_problems: list[str] = ()) -> list[str]:
    """Every reason (the first MAX_PROBLEMS) the trace cannot be rendered or audited; [] when it can."""
    out = list(parse_problems)
    for rec in records:
        if len(out) >= MAX_PROBLEMS:
            break
        if why := record_problem(rec):
            out.append(why)
    return out[:MAX_PROBLEMS]


# ---------------------------------------------------------------- the last calls of a stored trace

LAST_CALLS, CALL_ARGS_CHARS = 5, 200
TRACE_TAIL = 16 << 20  # a paper-scale trace is gigabytes: its end holds the last calls


def tail_lines(store, key: str, limit: int | None = None) -> str:
    """The whole lines of the last `limit` (TRACE_TAIL) bytes of an object, streamed, never held whole."""
    limit = TRACE_TAIL if limit is None else limit
    size, _ = store.stat(key)
    with contextlib.closing(store.open_read(key)) as f:
        skip = max(0, size - limit)
        if skip and hasattr(f, "seek") and getattr(f, "seekable", lambda: False)():
            f.seek(skip)
        else:
            while skip:
                skip -= len(f.read(min(skip, 1 << 20)) or b"") or skip
        data = f.read()
    if size > limit:
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return data.decode("utf-8", errors="replace")


def last_tool_calls(store, key: str) -> list[dict]:
    """The last tool calls of the stored trace at `key`, most recent first (what the episode was doing
    when it ended); the optimizer's failure metadata."""
    if not store.exists(key):
        return []
    records, _ = parse_lines(tail_lines(store, key))
    calls: list[dict] = []
    for rec in reversed(records):
        msg = ((rec.get("response") or {}).get("message") or {}) if isinstance(rec, dict) else {}
        agent = ((rec.get("agent") or {}).get("id")) if isinstance(rec.get("agent"), dict) else None
        for c in reversed(msg.get("tool_calls") or [] if isinstance(msg, dict) else []):
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict):
                args = fn.get("arguments")
                args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                calls.append({"agent": agent, "tool": fn.get("name"), "args": (args or "")[:CALL_ARGS_CHARS]})
        if len(calls) >= LAST_CALLS:
            break
    return calls[:LAST_CALLS]
