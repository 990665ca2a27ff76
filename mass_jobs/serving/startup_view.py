"""qwen-code's startup view (working directory, date, OS, folder tree) in the form the paper's release sent.

The pinned qwen-code (0.15.10) sends the view as a user turn of its own followed by a canned model
reply, "Got it. Thanks for the context!", that no model wrote. The release the paper ran (0.20.0)
already sent it inside the task's user message, as a `<system-reminder>` text part before the task
(qwen-code's change "Move startup context into system reminders", merged in June 2026 before the
0.19 releases; 0.21.2, measured through this harness, sends one user message whose text parts are
the reminders and then the task). With `execution.startup_context: reminder` the recording proxy
rewrites every request of a thread from the first form to the second before the model sees it, so
the model, the trace and the training windows hold the paper's form and no canned turn.
"""

from __future__ import annotations

import html
import re
from typing import Any

ACK = "Got it. Thanks for the context!"
# how 0.15.10's view opens: with the canned reply after it, what tells the view from a task a model
# happened to answer with the same words
VIEW_START = "This is the Qwen Code. We are setting up the context for our chat."
OPEN, CLOSE = "<system-reminder>", "</system-reminder>"
# a reminder tag inside the view (a file named so, in the folder tree a later worker is shown) would
# end the reminder early; escaped as qwen-code's reminders escape them
_TAG = re.compile(r"<\s*(/?)\s*system-reminder\b[^<>]*>", re.IGNORECASE)


def _parts(content: Any) -> list[dict]:
    if isinstance(content, list):
        return [p if isinstance(p, dict) else {"type": "text", "text": str(p)} for p in content]
    return [{"type": "text", "text": "" if content is None else str(content)}]


def _text(content: Any) -> str:
    return "".join(p.get("text", "") for p in _parts(content))


def reminder(view: str) -> str:
    """The view as one `<system-reminder>` block, any reminder tag inside it made inert."""
    body = _TAG.sub(lambda m: "<\\/system-reminder>" if m.group(1) else html.escape(m.group(0)), view)
    return f"{OPEN}\n{body}\n{CLOSE}"


def as_reminder(messages: Any) -> list[dict] | None:
    """`messages` with their leading [view, canned reply, task] as one user message (the view as a
    reminder part before the task's parts); None when they do not open that way."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    i = next((n for n, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    if len(messages) < i + 3:
        return None
    view, ack, task = messages[i : i + 3]
    if (view.get("role"), ack.get("role"), task.get("role")) != ("user", "assistant", "user"):
        return None
    if _text(ack.get("content")).strip() != ACK or ack.get("tool_calls"):
        return None
    if not _text(view.get("content")).startswith(VIEW_START):
        return None
    part = {"type": "text", "text": reminder(_text(view.get("content")))}
    return [*messages[:i], {**task, "content": [part, *_parts(task.get("content"))]}, *messages[i + 3 :]]
