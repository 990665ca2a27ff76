"""What of a teacher episode's trace is trained on: its conversations (`threads.group_calls`, the
grouping the audit measures), each with its final messages and role, and the lead's prompt with the
workflow and directive stripped back to the bare task (`steps/render_sft.py` renders them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mass_jobs.episodes.delegation import can_delegate
from mass_jobs.episodes.threads import group_calls, normal_message, same_turn, text_of
from mass_jobs.spec.workflow import SEPARATOR


@dataclass
class EpisodeTrace:
    """One teacher episode: its trace lines plus the prompts needed to strip the workflow."""

    task: str
    episode: int
    records: list[dict]
    bare_prompt: str
    teacher_prompt: str | None = None  # None: nothing to strip (e.g. an already bare episode)
    harness: str | None = None  # whose delegation tool marks the orchestrator; None: any harness's
    # the teacher prompt's workflow and directive pieces (collect's prompt_parts): found and removed
    # even when the harness changed the task text around them, and never left in a window
    strip_pieces: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # lines of the stored trace that were not JSON (trace_shape.parse_lines)

    @property
    def needs_stripping(self) -> bool:
        return bool(self.teacher_prompt) and self.teacher_prompt.strip() != self.bare_prompt.strip()


@dataclass
class Thread:
    """One agent conversation (`threads.group_calls`) with its final messages and role."""

    agent: dict | None
    tools: list | None
    calls: list[dict] = field(default_factory=list)
    requests: list[list[dict]] = field(default_factory=list)  # each call's request messages, normalised
    role: str = ""
    messages: list[dict] = field(default_factory=list)
    dropped_length_cut: bool = False


def rebuild_threads(
    records: list[dict],
    harness: str | None = None,
    keep_length_cut: bool = False,
    roles: str = "tools",
    prompt: str | None = None,
) -> list[Thread]:
    """The trace's conversations (`threads.group_calls`, the grouping the audit measures), each with
    its final messages and role (`classify` under the `sft.thread_roles` rule; `prompt`: the one the
    episode was given, teacher or bare)."""
    out = [Thread(agent=c.agent, tools=c.tools, calls=c.calls, requests=c.messages) for c in group_calls(records)]
    for t in out:
        t.messages = _final_messages(t, keep_length_cut)
        t.role = classify(t, harness, roles, prompt)
    return out


def _final_messages(t: Thread, keep_length_cut: bool = False) -> list[dict]:
    last = t.calls[-1]
    msgs = [dict(m) for m in t.requests[-1]]
    # History copies of earlier replies may lack reasoning; the recorded responses have it.
    for call, request in zip(t.calls[:-1], t.requests[:-1]):
        resp = (call.get("response") or {}).get("message")
        idx = len(request)
        if resp and idx < len(msgs) and msgs[idx]["role"] == "assistant":
            full = normal_message({**resp, "role": "assistant"})
            if same_turn(full, msgs[idx]):
                msgs[idx] = full
    resp = last.get("response") or {}
    if resp.get("message") and not last.get("error"):
        if resp.get("finish_reason") == "length" and not keep_length_cut:
            t.dropped_length_cut = True  # a reply cut mid-way teaches the model to stop mid-thought
        else:
            msgs.append(normal_message({**resp["message"], "role": "assistant"}))
    return msgs


# qwen-code's system prompts: its main session's, and its general-purpose sub-agent's (0.20.0, 0.15.10)
QWEN_MAIN_SYSTEM = "You are Qwen Code"
QWEN_SUB_SYSTEMS = ("You are a general-purpose subagent", "You are a general-purpose agent")


def classify(t: Thread, harness: str | None = None, roles: str = "tools", prompt: str | None = None) -> str:
    """The harness's role header when it sent one; else the `roles` rule (`sft.thread_roles`):
    `prompt_role` for qwen-code's threads (the system prompts it knows are qwen-code's), or the
    thread offered the delegation tool leads."""
    agent = t.agent or {}
    role = str(agent.get("role") or "").lower()
    if role == "orchestrator" or agent.get("id") == "orchestrator":
        return "orchestrator"
    if role in ("worker", "auxiliary"):
        return role
    if not agent and roles == "prompt" and harness == "qwen-code":
        return prompt_role(t.messages, prompt)
    if not agent and can_delegate(t.tools, harness):
        return "orchestrator"
    return "worker" if t.tools else "auxiliary"


def prompt_role(messages: list[dict], prompt: str | None) -> str:
    """The paper's code's rule (prepare_sft_data.thread_role): the orchestrator's thread carries the
    episode's prompt once in its first user message, or opens with qwen-code's main system prompt; a
    sub-agent's system prompt makes a worker; anything else (side calls) is auxiliary."""
    system = text_of(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""
    first = text_of(messages[1].get("content")) if len(messages) > 1 else ""
    if carries_once(first, prompt) or system.startswith(QWEN_MAIN_SYSTEM):
        return "orchestrator"
    if system.startswith(QWEN_SUB_SYSTEMS):
        return "worker"
    return "auxiliary"


def carries_once(text: str, prompt: str | None) -> bool:
    """The prompt occurs exactly once in `text`, as given, stripped, or as qwen-code presents it (its
    @-command processor spaces an unresolved `precision@k` / `recall@k`). The first form found decides,
    as in the code; more than one occurrence is no match (the code refuses the thread)."""
    if not prompt:
        return False
    spaced = (
        prompt.replace("precision@k", "precision @k").replace("recall@k", "recall @k").strip()
        if ("precision@k" in prompt or "recall@k" in prompt)
        else prompt
    )
    for form in dict.fromkeys((prompt, prompt.strip(), spaced, spaced.strip())):
        hits = text.count(form) if form else 0
        if hits:
            return hits == 1
    return False


def is_lead(t: Thread) -> bool:
    """The thread the episode's prompt went to: the orchestrator, or a single-agent teacher's one agent
    (our harness's worker-role thread without a parent), whose first input is stripped all the same."""
    agent = t.agent or {}
    return t.role == "orchestrator" or (t.role == "worker" and bool(agent.get("id")) and not agent.get("parent"))


def strip_teacher_prompt(
    messages: list[dict], teacher_prompt: str, bare_prompt: str, pieces: tuple[str, ...] = ()
) -> tuple[list[dict], int]:
    """Replace the teacher prompt by the bare task in every user message that carries it.

    A harness may hand the model a changed task text (qwen-code trims the prompt and spaces out
    unresolved @-paths); a message holding every piece (workflow, directive, an upstream block's rules
    that name agents) still loses them, each with the blank line or line break before it, and keeps the
    task as the harness sent it. Returns (messages, messages changed).
    """
    out, replaced = [], 0
    pieces = tuple(p for p in pieces if p)
    for m in messages:
        text = m["content"]
        if m["role"] == "user" and teacher_prompt and teacher_prompt in text:
            m = {**m, "content": text.replace(teacher_prompt, bare_prompt)}
            replaced += 1
        elif m["role"] == "user" and pieces and all(p in text for p in pieces):
            for p in pieces:
                text = text.replace(SEPARATOR + p, "").replace("\n" + p, "").replace(p, "")
            m = {**m, "content": text}
            replaced += 1
        out.append(m)
    return out, replaced


def teacher_text_left(messages: list[dict], ep: EpisodeTrace) -> int | None:
    """Index of the first message not written by the model that still holds the teacher prompt or a piece of it."""
    needles = [n for n in (ep.teacher_prompt, *ep.strip_pieces) if n and n.strip() not in ep.bare_prompt]
    for i, m in enumerate(messages):
        if m["role"] != "assistant" and any(n in m["content"] for n in needles):
            return i
    return None


def teacher_prompt_from_trace(records: list[dict], harness: str | None = None) -> str | None:
    """The orchestrator's latest user message in its first call: harnesses send the collection prompt
    verbatim there (qwen-code after its environment-context turn)."""
    ordered = sorted(records, key=lambda r: r.get("seq", 0))
    lead = [
        r
        for r in ordered
        if (r.get("agent") or {}).get("role") == "orchestrator"
        or (not r.get("agent") and can_delegate((r.get("request") or {}).get("tools"), harness))
    ]
    for r in lead[:1]:
        users = [m for m in (r.get("request") or {}).get("messages") or [] if m.get("role") == "user"]
        if users:
            return text_of(users[-1].get("content"))
    return None
