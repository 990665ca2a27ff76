"""What the recording proxy writes per model call: the request and response as trace records
(schemas/trace-record.schema.json), a streamed answer reassembled into one message, the agent
labels of the call's headers; and reading a trace back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mass_jobs.serving.llm import normalize_message

AGENT_HEADERS = {"x-mass-agent": "id", "x-mass-role": "role", "x-mass-parent": "parent"}


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def agent_from_headers(headers: dict[str, str]) -> dict | None:
    """`{"id", "role", "parent"}` from our harness's X-Mass-* headers; None for harnesses that send none."""
    found = {field: headers.get(name) or None for name, field in AGENT_HEADERS.items()}
    return found if any(found.values()) else None


def request_record(body: Any) -> dict:
    body = body if isinstance(body, dict) else {}
    messages = body.get("messages")
    return {
        "model": body.get("model") if isinstance(body.get("model"), str) else None,
        "messages": messages if isinstance(messages, list) else None,
        "tools": body.get("tools") if isinstance(body.get("tools"), list) else None,
        "stream": bool(body.get("stream")),
        "sampling": {
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "top_k": body.get("top_k"),
            "max_tokens": body.get("max_tokens", body.get("max_completion_tokens")),
            "seed": body.get("seed"),
        },
    }


def response_record(data: Any) -> dict:
    """The record of a non-streamed completion; raises ValueError when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("no choices in the response")
    choice = data["choices"][0]
    if not isinstance(choice, dict):
        raise ValueError(f"choices[0] is a {type(choice).__name__}, not an object")
    return {
        "message": normalize_message(choice.get("message")),
        "finish_reason": _str_or_none(choice.get("finish_reason")),
        "usage": data.get("usage") if isinstance(data.get("usage"), dict) else None,
    }


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class StreamAssembler:
    """Rebuilds one completion from SSE bytes fed in arbitrary pieces (only choice 0 is kept)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for an event end
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.saw_done = False
        self.bad_events = 0
        self.errors: list[Any] = []

    def feed(self, data: bytes) -> None:
        """Linear in the bytes fed: only what arrived since the last event end is searched, so a
        stream without separators costs its length, not its length squared."""
        self._buf += data
        while True:
            cut = self._end(self._scanned)
            if cut is None:
                self._scanned = max(0, len(self._buf) - 3)  # an end may straddle this piece and the next
                return
            start, stop = cut
            event = bytes(self._buf[:start]).replace(b"\r\n", b"\n")
            del self._buf[:stop]
            self._scanned = 0
            self._event(event)

    def _end(self, since: int) -> tuple[int, int] | None:
        """(start, stop) of the first blank line (LF LF or CR LF CR LF) at or after `since`."""
        found = [
            (i, i + n)
            for sep, n in ((b"\n\n", 2), (b"\r\n\r\n", 4), (b"\r\n\n", 3), (b"\n\r\n", 3))
            if (i := self._buf.find(sep, since)) >= 0
        ]
        return min(found) if found else None

    def _event(self, event: bytes) -> None:
        lines = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if not lines:
            return
        payload = b"\n".join(lines)
        if payload == b"[DONE]":
            self.saw_done = True
            return
        try:
            chunk = json.loads(payload)
        except (ValueError, RecursionError):
            self.bad_events += 1
            return
        if not isinstance(chunk, dict):
            self.bad_events += 1
            return
        if chunk.get("error"):
            self.errors.append(chunk["error"])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        for choice in choices if isinstance(choices, list) else [None]:
            if not isinstance(choice, dict) or not isinstance(choice.get("delta") or {}, dict):
                self.bad_events += 1  # a shape no server should send: counted, never raised
                continue
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
            frags = delta.get("tool_calls") or []
            for frag in frags if isinstance(frags, list) else [frags]:
                if not isinstance(frag, dict) or not isinstance(frag.get("index", 0), int):
                    self.bad_events += 1
                    continue
                call = self.calls.setdefault(
                    frag.get("index", 0), {"id": None, "type": "function", "function": {"name": None, "arguments": ""}}
                )
                if isinstance(frag.get("id"), str):
                    call["id"] = frag["id"]
                fn = frag.get("function") if isinstance(frag.get("function"), dict) else {}
                if isinstance(fn.get("name"), str) and not call["function"]["name"]:
                    call["function"]["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    call["function"]["arguments"] += fn["arguments"]
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]

    def record(self) -> dict:
        message = {
            "content": "".join(self.content),
            "reasoning_content": "".join(self.reasoning),
            "tool_calls": [self.calls[i] for i in sorted(self.calls)],
        }
        return {"message": normalize_message(message), "finish_reason": self.finish_reason, "usage": self.usage}


def read_trace(path: str | Path, growing: bool = False) -> list[dict]:
    """All records of a trace file, in file order. `growing`: the proxy is still writing it, and a
    long line reaches the file in several writes, so a last line without its newline is left for
    the next read instead of being parsed half-written."""
    text = Path(path).read_text() if Path(path).exists() else ""
    if growing:
        text = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in text.split("\n") if line.strip()]
