"""Behaviour audit of one episode from its trace.jsonl alone (method notes, "Behaviour audit").

Per episode:
- delegation D: a sub-agent tool call (`delegate` in the built-in harness, `agent`/`task` in
  qwen-code) whose result came back without error;
- code handoff H: a worker wrote a `.py` file with a file tool (`write_file`/`edit`), its
  conversation ended (it made no later model call), and afterwards a different worker read the same
  file with a file tool (`read_file`/`read_many_files`); reading it through the shell does not count;
- worker revisions, two kinds, both counted:
  * re-delegation: after a sub-agent call failed, the same caller delegated again naming the same
    agent id or role, or with an assignment that repeats at least half of the failed assignment's
    distinct words (the same or a narrowed assignment);
  * rewrite: one worker wrote the same file more than once (each extra write counts one).

Threads (one agent conversation each) are `mass_jobs.episodes.threads.group_calls`'s, the grouping the
render step trains on: by the `agent` field the harness headers put in each record, and for
harnesses that send no headers (qwen-code) by which conversation a request extends. Without
headers a thread whose first
user message carries a delegated assignment is a worker, a thread offered the harness's delegation
tool (`mass_jobs.episodes.delegation`, the table the render step uses too) is the orchestrator, and
any other thread (side calls of a harness) is auxiliary. The harness comes from the episode's
status.json; without it any harness's delegation tool counts.

Run: `mass audit EPISODE_DIR... [--json]`
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mass_jobs.episodes.delegation import ANY_DELEGATION_TOOL, can_delegate, delegation_tools
from mass_jobs.episodes.threads import group_calls, text_of
from mass_jobs.episodes.trace_shape import parse_lines, trace_problems

DELEGATE_TOOLS = ANY_DELEGATION_TOOL  # every harness's delegation tool (a trace without its harness)
WRITE_TOOLS = frozenset({"write_file", "edit", "replace"})
READ_TOOLS = frozenset({"read_file", "read_many_files"})
PATH_KEYS = ("path", "file_path", "absolute_path")
ERROR_START = re.compile(r"^\s*(error\b|\[error\]|failed\b|tool execution failed)", re.IGNORECASE)
WORD = re.compile(r"[a-z0-9_.]+")


@dataclass
class ToolUse:
    seq: int
    thread: str
    name: str
    arguments: dict[str, Any]
    call_id: str | None
    result: str | None = None  # None: no later request of the thread carries the result

    @property
    def returned_ok(self) -> bool:
        return self.result is not None and not is_error_result(self.result)


@dataclass
class Thread:
    id: str
    role: str  # orchestrator | worker | auxiliary
    agent_id: str | None
    records: list[dict] = field(default_factory=list)

    @property
    def first_seq(self) -> int:
        return self.records[0]["seq"]

    @property
    def last_seq(self) -> int:
        return self.records[-1]["seq"]


@dataclass
class EpisodeAudit:
    episode: str
    calls: int
    threads: int
    workers: int
    delegation: bool
    delegations_ok: int
    delegations_failed: int
    code_handoff: bool
    handoffs: list[dict[str, Any]]
    revisions: int
    redelegations: int
    rewrites: int
    error: str | None = None  # the trace could not be read (mass_jobs.episodes.trace_shape): nothing above was measured

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- reading


def load_trace(path: Path) -> list[dict]:
    """Records of a trace.jsonl in call order; a torn last line (a killed episode) is skipped.
    ValueError names the first thing that makes it unreadable (mass_jobs.episodes.trace_shape)."""

    records, problems = parse_lines(Path(path).read_bytes().decode("utf-8", "replace"))
    if problems := trace_problems(records, problems):
        raise ValueError(f"{path}: {problems[0]}")
    return sorted(records, key=lambda r: r.get("seq", 0))


def is_error_result(text: str) -> bool:
    if ERROR_START.match(text):
        return True
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(value, dict) and (bool(value.get("error")) or value.get("status") in ("failure", "error"))


# ---------------------------------------------------------------- threads


def split_threads(records: list[dict], harness: str | None = None) -> list[Thread]:
    """The trace's conversations (`threads.group_calls`, the grouping the render step trains on),
    named and given their roles."""
    threads = [
        Thread(id="", role=(c.agent or {}).get("role") or "", agent_id=c.agent_id, records=c.calls)
        for c in group_calls(records)
    ]
    _name_threads(threads, harness)
    return threads


def _first_user_text(t: Thread) -> str:
    msgs = (t.records[0].get("request") or {}).get("messages") or []
    return "\n".join(text_of(m.get("content")) for m in msgs if isinstance(m, dict) and m.get("role") == "user")


def _name_threads(threads: list[Thread], harness: str | None = None) -> None:
    delegating = delegation_tools(harness)
    assignments = []
    for t in threads:
        for use in _calls_of(t):
            if use.name in delegating:
                text = str(use.arguments.get("assignment") or use.arguments.get("prompt") or "").strip()
                if text:
                    assignments.append((use.seq, text))
    used: dict[str, int] = {}
    for t in threads:
        if not t.role:
            if any(seq < t.first_seq and text in _first_user_text(t) for seq, text in assignments):
                t.role = "worker"
            elif can_delegate((t.records[0].get("request") or {}).get("tools"), harness):
                t.role = "orchestrator"
            else:
                t.role = "auxiliary"
        base = t.agent_id or (t.role if t.role == "orchestrator" else None)
        if base is None:
            base = "worker" if t.role == "worker" else "aux"
            used[base] = used.get(base, 0) + 1
            t.id = f"{base}-{used[base]}"
            continue
        used[base] = used.get(base, 0) + 1
        t.id = base if used[base] == 1 else f"{base}#{used[base]}"


def _call_signature(calls: list[dict]) -> list[tuple[Any, Any]]:
    return [((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")) for c in calls or []]


def _uses_of(t: Thread, rec: dict) -> list[ToolUse]:
    msg = (rec.get("response") or {}).get("message") or {}
    uses = []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        raw = fn.get("arguments")
        try:
            args = raw if isinstance(raw, dict) else json.loads(raw or "{}")
        except (json.JSONDecodeError, TypeError):
            args = {}
        uses.append(
            ToolUse(
                seq=rec.get("seq", 0),
                thread=t.id,
                name=str(fn.get("name") or ""),
                arguments=args if isinstance(args, dict) else {},
                call_id=call.get("id"),
            )
        )
    return uses


def _calls_of(t: Thread) -> list[ToolUse]:
    return [u for rec in t.records for u in _uses_of(t, rec)]


def _history(t: Thread) -> list[tuple[list, list[dict]]]:
    """(call signature, following tool messages) of each assistant message the thread resent."""
    out: list[tuple[list, list[dict]]] = []
    for m in (t.records[-1].get("request") or {}).get("messages") or []:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant":
            out.append((_call_signature(m.get("tool_calls")), []))
        elif m.get("role") == "tool" and out:
            out[-1][1].append(m)
    return out


def tool_uses(t: Thread) -> list[ToolUse]:
    """The thread's tool calls with their results, found in the thread's later requests.

    A reply is matched to the assistant message that resends the same calls (in order), and its
    results by position; ids alone are not enough (servers may omit them or reuse them per turn).
    """
    history = _history(t)
    by_id = {
        m.get("tool_call_id"): text_of(m.get("content")) for _, tools in history for m in tools if m.get("tool_call_id")
    }
    uses: list[ToolUse] = []
    cursor = 0
    for rec in t.records:
        rec_uses = _uses_of(t, rec)
        if not rec_uses:
            continue
        sig = _call_signature(((rec.get("response") or {}).get("message") or {}).get("tool_calls"))
        match = next((i for i in range(cursor, len(history)) if history[i][0] == sig), None)
        if match is not None:
            cursor = match + 1
            results = history[match][1]
            for i, u in enumerate(rec_uses):
                u.result = text_of(results[i].get("content")) if i < len(results) else None
        else:
            for u in rec_uses:
                u.result = by_id.get(u.call_id) if u.call_id else None
        uses += rec_uses
    return uses


# ---------------------------------------------------------------- the audit


def _paths(use: ToolUse) -> list[str]:
    out = [use.arguments[k] for k in PATH_KEYS if isinstance(use.arguments.get(k), str)]
    many = use.arguments.get("paths")
    if isinstance(many, list):
        out += [p for p in many if isinstance(p, str)]
    return [posixpath.normpath(p.replace("\\", "/")) for p in out]


def same_file(a: str, b: str) -> bool:
    """Workspace-relative and absolute spellings of one file match (qwen-code sends absolute paths)."""
    return a == b or a.endswith("/" + b.lstrip("./")) or b.endswith("/" + a.lstrip("./"))


def _words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def unreadable(episode: str, why: str) -> EpisodeAudit:
    """The audit of an episode whose trace cannot be read: nothing measured, the reason kept."""
    return EpisodeAudit(
        episode=episode,
        calls=0,
        threads=0,
        workers=0,
        delegation=False,
        delegations_ok=0,
        delegations_failed=0,
        code_handoff=False,
        handoffs=[],
        revisions=0,
        redelegations=0,
        rewrites=0,
        error=why[:2000],
    )


def audit_records(records: list[dict], episode: str = "", harness: str | None = None) -> EpisodeAudit:

    if problems := trace_problems(records):
        return unreadable(episode, "; ".join(problems))
    threads = split_threads(records, harness)
    delegating = delegation_tools(harness)
    uses_by_thread = {t.id: tool_uses(t) for t in threads}
    role = {t.id: t.role for t in threads}
    last_seq = {t.id: t.last_seq for t in threads}

    delegations = [u for uses in uses_by_thread.values() for u in uses if u.name in delegating]
    ok = sum(u.returned_ok for u in delegations)
    failed = sum(u.result is not None and not u.returned_ok for u in delegations)

    def worker_file_uses(tools) -> list:
        """(use, path) of every successful call of `tools` by a worker thread."""
        return [
            (u, p)
            for tid, uses in uses_by_thread.items()
            if role[tid] == "worker"
            for u in uses
            if u.name in tools and u.returned_ok
            for p in _paths(u)
        ]

    writes, reads = worker_file_uses(WRITE_TOOLS), worker_file_uses(READ_TOOLS)
    handoffs = []
    seen = set()
    for w, wp in writes:
        if not wp.endswith(".py"):
            continue
        for r, rp in reads:
            if r.thread == w.thread or not same_file(wp, rp) or r.seq <= last_seq[w.thread]:
                continue
            key = (wp, w.thread, r.thread)
            if key not in seen:
                seen.add(key)
                handoffs.append({"file": wp, "writer": w.thread, "reader": r.thread, "read_seq": r.seq})

    redelegations = 0
    for uses in uses_by_thread.values():
        calls = [u for u in uses if u.name in delegating]
        for i, later in enumerate(calls):
            if any(_redelegates(failed_call, later) for failed_call in calls[:i] if _failed(failed_call)):
                redelegations += 1

    rewrites = 0
    for tid, uses in uses_by_thread.items():
        if role[tid] != "worker":
            continue
        counts: dict[str, int] = {}
        for u in uses:
            if u.name in WRITE_TOOLS and u.returned_ok:
                for p in _paths(u):
                    counts[p] = counts.get(p, 0) + 1
        rewrites += sum(n - 1 for n in counts.values() if n > 1)

    return EpisodeAudit(
        episode=episode,
        calls=len(records),
        threads=len(threads),
        workers=sum(t.role == "worker" for t in threads),
        delegation=ok > 0,
        delegations_ok=ok,
        delegations_failed=failed,
        code_handoff=bool(handoffs),
        handoffs=handoffs,
        revisions=redelegations + rewrites,
        redelegations=redelegations,
        rewrites=rewrites,
    )


def _failed(use: ToolUse) -> bool:
    return use.result is not None and not use.returned_ok


def _assignment(use: ToolUse) -> str:
    return str(use.arguments.get("assignment") or use.arguments.get("prompt") or "")


def _redelegates(failed: ToolUse, later: ToolUse) -> bool:
    for key in ("agent_id", "role", "subagent_type"):
        a, b = failed.arguments.get(key), later.arguments.get(key)
        # qwen-code's subagent_type is the same generic type for every call: it names no agent.
        if key != "subagent_type" and a and a == b:
            return True
    before = _words(_assignment(failed))
    return bool(before) and len(before & _words(_assignment(later))) * 2 >= len(before)


def audit_episode(episode_dir: Path, harness: str | None = None) -> EpisodeAudit:
    """Audit `episode_dir/trace.jsonl` (a trace file path works too); the harness defaults to status.json's."""
    path = Path(episode_dir)
    trace = path if path.is_file() else path / "trace.jsonl"
    if not trace.exists():
        raise FileNotFoundError(f"{episode_dir}: no trace.jsonl")
    status = trace.parent / "status.json"
    if harness is None and status.exists():
        try:
            harness = json.loads(status.read_text()).get("harness")
        except (json.JSONDecodeError, AttributeError):
            harness = None  # a torn status.json says nothing about the harness
    try:
        records = load_trace(trace)
    except ValueError as exc:
        return unreadable(str(episode_dir), str(exc))
    return audit_records(records, episode=str(episode_dir), harness=harness)
