"""Render recorded teacher episodes into masked SFT windows (MASS outer loop, step 3).

Each agent's conversation is rebuilt from the proxy's trace lines and classified as orchestrator,
worker or auxiliary: by the harness's `X-Mass-Role` header, else (qwen-code sends none) by whether
the thread was offered the harness's delegation tool (`mass_jobs.harness.delegation`, the table the
audit uses too). In the orchestrator the teacher prompt (task + workflow + directive) becomes the
bare task, so the student learns to act as the teacher did without being told how; workers keep
the concrete assignments they were sent. A teacher prompt that cannot be found and stripped, a
thread that cannot be rendered or a reply that cannot fit a window is an error of its episode:
recorded in sft/stats.json and the manifest, and under `sft.strict` (the default, as upstream's
`--strict`) the whole episode is dropped; without it only the offending thread or reply goes.
Workflow or directive text is never left inside a window either way.

A thread is rendered once per user query (segment), as upstream's prepare_sft_data does: segment s
is the conversation up to the next user query, rendered with the model's own chat template (tools
included), and only its own replies carry loss. Templates such as Qwen3's drop the reasoning of
replies before the last user query, so each reply is trained in the context it was generated in,
with its own reasoning. Loss tokens are found by the template's {% generation %} markers when it
has them, else by rendering each reply incrementally and aligning it to the segment's rendering;
either way a token is trained when it starts inside a reply (a token merging the turn opener with
the reply's first characters is context, as in upstream's masks).

Windows hold at most `sft.window` tokens: the masked header (system + tools + first user
message), the segment's own query when it is not the header's, up to `sft.context` tokens of masked
earlier context, then new reply blocks; every reply token is trained in exactly one window. As
upstream, context and window ends are whole turns (`sft.cut: blocks`), and a thread whose header
takes over 90% of the window is refused (`header_over_window`, counted in stats).

Run: `mass render sft --spec SPEC --gen G` (writes `<run>/gen-<g>/sft/{train,val}.jsonl, stats.json`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

from mass_jobs.errors import StepFailed
from mass_jobs.harness.delegation import can_delegate
from mass_jobs.models import SftSpec
from mass_jobs.threads import group_calls, normal_message, same_turn, text_of
from mass_jobs.workflow import SEPARATOR

HEADER_SHARE = 0.9  # upstream refuses a thread whose header takes more of the window than this
IGNORE = -100  # label of a position that carries no loss (the value torch's cross entropy skips)
ROLES = ("orchestrator", "worker", "auxiliary")


class RenderError(StepFailed, ValueError):
    """The traces or the tokenizer cannot be rendered as asked (the message says which and why)."""


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


@dataclass
class Window:
    task: str
    episode: int
    role: str
    thread: int
    index: int
    input_ids: list[int]
    labels: list[int]

    @property
    def n_supervised(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE)

    def record(self) -> dict:
        return {
            "task": self.task,
            "episode": self.episode,
            "role": self.role,
            "thread": self.thread,
            "index": self.index,
            "input_ids": self.input_ids,
            "labels": self.labels,
            "n_supervised": self.n_supervised,
        }


# ---------------------------------------------------------------- threads


def rebuild_threads(records: list[dict], harness: str | None = None, keep_length_cut: bool = False) -> list[Thread]:
    """The trace's conversations (`threads.group_calls`, the grouping the audit measures), each with
    its final messages and role."""
    out = [Thread(agent=c.agent, tools=c.tools, calls=c.calls, requests=c.messages) for c in group_calls(records)]
    for t in out:
        t.messages = _final_messages(t, keep_length_cut)
        t.role = classify(t, harness)
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


def classify(t: Thread, harness: str | None = None) -> str:
    """The harness's role header when it sent one; else the thread offered the delegation tool leads."""
    agent = t.agent or {}
    role = str(agent.get("role") or "").lower()
    if role == "orchestrator" or agent.get("id") == "orchestrator":
        return "orchestrator"
    if role in ("worker", "auxiliary"):
        return role
    if not agent and can_delegate(t.tools, harness):
        return "orchestrator"
    return "worker" if t.tools else "auxiliary"


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
    unresolved @-paths); a message holding every piece (workflow, directive) still loses them, each
    with its separator, and keeps the task as the harness sent it. Returns (messages, messages changed).
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
                text = text.replace(SEPARATOR + p, "").replace(p, "")
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


# ---------------------------------------------------------------- tokens and windows

_GENERATION_MARK = re.compile(r"{%-?\s*generation\s*-?%}")
MASK_BY_MARKERS = "generation_markers"  # the template's {% generation %} spans (as transformers renders them)
MASK_BY_INCREMENTS = "incremental_rendering"  # stock hub templates: each reply = what its rendering adds
_PROBE_REPLY = "mass probe reply 7f3a"


def mask_method(tokenizer) -> str:
    """How assistant tokens are found: the template's generation markers when every variant has them."""
    template = getattr(tokenizer, "chat_template", None)
    variants = list(template.values()) if isinstance(template, dict) else [template]
    if not any(variants):
        raise RenderError("tokenizer has no chat_template; SFT rendering needs the model's own template")
    if all(v and _GENERATION_MARK.search(v) for v in variants):
        return MASK_BY_MARKERS
    return MASK_BY_INCREMENTS


def _render_text(tokenizer, messages: list[dict], tools: list | None, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)


@dataclass(frozen=True)
class ReplyShape:
    """Text the template wraps around every reply, learnt from one probe conversation.

    opener: what `add_generation_prompt` appends (never trained, as with the markers);
    close: the end of a reply up to its last special token (e.g. <|im_end|>: the model must learn to stop);
    tail: what follows that (e.g. the newline before the next turn: not generated, not trained).
    """

    opener: str
    close: str
    tail: str


def _special_strings(tokenizer) -> set[str]:
    return {s for s in tokenizer.all_special_tokens if s} | {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False) and t.content
    }


def reply_shape(tokenizer, tools: list | None = None) -> ReplyShape:
    probe = [{"role": "user", "content": "x"}]
    bare = _render_text(tokenizer, probe, tools)
    prompted = _render_text(tokenizer, probe, tools, generation_prompt=True)
    opener = prompted[len(bare):] if prompted.startswith(bare) else ""
    answered = _render_text(tokenizer, probe + [{"role": "assistant", "content": _PROBE_REPLY}], tools)
    at = answered.rfind(_PROBE_REPLY)
    if not answered.startswith(prompted) or at < len(prompted):
        raise RenderError(
            "chat_template has no {% generation %} markers and does not render a reply right after its "
            "generation prompt, so assistant tokens cannot be found"
        )
    after = answered[at + len(_PROBE_REPLY):]
    cut = max((after.rfind(s) + len(s) for s in _special_strings(tokenizer) if s in after), default=len(after))
    return ReplyShape(opener=opener, close=after[:cut], tail=after[cut:])


def user_opener(tokenizer, tools: list | None = None) -> str:
    """What the template puts before a user message's text, from its last special token (e.g. <|im_start|>user\\n)."""
    probe = "mass probe query 5c1e"
    text = _render_text(tokenizer, [{"role": "user", "content": probe}], tools)
    before = text[: max(text.find(probe), 0)]
    at = max((before.rfind(s) for s in _special_strings(tokenizer)), default=-1)
    return before[at:] if at >= 0 else ""


def _locate_reply(full: str, cursor: int, before: str, reply: str, shape: ReplyShape) -> tuple[int, int] | None:
    """[start, end) of one reply in the full rendering, searching from `cursor`; None if it is not there."""
    s = len(before)
    if s >= cursor and full.startswith(before) and full.startswith(reply, s):
        return s, s + len(reply)
    # Earlier turns re-rendered differently (e.g. Qwen3 drops reasoning before the last user message):
    # find the reply after its opener; the full rendering may keep only the end of what it added alone.
    if not shape.opener or not shape.close:
        return None
    g = full.find(shape.opener, cursor)
    if g < 0:
        return None
    s = g + len(shape.opener)
    if full.startswith(reply, s):
        return s, s + len(reply)
    e = full.find(shape.close, s)
    if e < 0:
        return None
    e += len(shape.close)
    return (s, e) if reply.endswith(full[s:e]) else None


def reply_spans(
    tokenizer, messages: list[dict], tools: list | None, shape: ReplyShape, from_message: int = 0, cursor: int = 0
) -> tuple[str, list[tuple[int, int]]]:
    """(full rendering, character spans of the replies from message `from_message` on) without generation markers.

    Reply i = what rendering messages[:i+1] adds to messages[:i] + generation prompt, minus the
    template's untrained tail; it is then aligned to the full rendering (from character `cursor`),
    which is what is trained.
    """
    full = _render_text(tokenizer, messages, tools)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i < from_message:
            continue
        where = f"assistant turn {len(spans)} (message {i})"
        if i == 0:
            raise RenderError(f"{where}: a reply with no message before it cannot be rendered incrementally")
        before = _render_text(tokenizer, messages[:i], tools, generation_prompt=True)
        upto = _render_text(tokenizer, messages[: i + 1], tools)
        if upto.startswith(before):
            reply = upto[len(before):]
        elif shape.opener and shape.opener in upto:
            # the previous message renders differently once it is no longer last (e.g. Qwen3's empty
            # think block on a final reply followed by another reply): the reply follows its opener
            reply = upto[upto.rfind(shape.opener) + len(shape.opener):]
        else:
            raise RenderError(
                f"{where}: the chat template does not render this reply as an extension of the conversation "
                "before it plus the generation prompt, so its tokens cannot be found"
            )
        if shape.tail and reply.endswith(shape.tail):
            reply = reply[: -len(shape.tail)]
        span = _locate_reply(full, cursor, before, reply, shape)
        if span is None:
            raise RenderError(
                f"{where}: the full rendering of the conversation does not contain this reply as rendered on "
                f"its own ({reply[:80]!r}...), so its tokens cannot be aligned"
            )
        spans.append(span)
        cursor = span[1]
    return full, spans


def marker_spans(tokenizer, messages: list[dict], tools: list | None) -> tuple[str, list[tuple[int, int]]]:
    """(full rendering, character spans of the template's {% generation %} blocks): what transformers masks."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, spans = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=tokenizer.get_chat_template(None, tools),
        return_assistant_tokens_mask=True, **tokenizer.special_tokens_map,
    )
    text = rendered[0]
    if text != _render_text(tokenizer, messages, tools):
        raise RenderError("the template renders differently when asked for its generation spans")
    return text, [tuple(sp) for sp in spans[0]]


def _encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokenise as apply_chat_template does, with each token's character offsets."""
    enc = tokenizer(text, add_special_tokens=False)
    if not getattr(enc, "encodings", None):
        raise RenderError("SFT masks need a fast tokenizer (token offsets)")
    return list(enc["input_ids"]), [tuple(o) for o in enc.encodings[0].offsets]


def _spans_to_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for every token that starts inside a span: a token merging the turn opener with the reply's
    first characters (e.g. "\\n\\n" over "<think>\\n" + "\\n</think>") is context, as in upstream's masks."""
    mask = [0] * len(offsets)
    k = 0
    for t, (a, b) in enumerate(offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if b > a and a >= spans[k][0]:
            mask[t] = 1
    return mask


def _first_token_at(offsets: list[tuple[int, int]], char: int) -> int:
    return next((t for t, (a, _) in enumerate(offsets) if a >= char), len(offsets))


def turn_opener(tokenizer) -> list[int]:
    """Tokens the template puts before an assistant reply (`add_generation_prompt`), e.g. <|im_start|>assistant\\n."""
    probe = [{"role": "user", "content": "x"}]
    bare = list(tokenizer.apply_chat_template(probe, tokenize=True, return_dict=True)["input_ids"])
    full = list(tokenizer.apply_chat_template(probe, tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"])
    return full[len(bare):] if full[: len(bare)] == bare else []


@dataclass
class Rendering:
    """A conversation rendered by the chat template: token ids, offsets and the supervised-token mask."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    mask: list[int]


def render_masked(
    tokenizer, messages: list[dict], tools: list | None, method: str | None = None, shape: ReplyShape | None = None,
    from_message: int = 0, cursor: int = 0,
) -> Rendering:
    """The full rendering with the replies from message `from_message` (character `cursor`) on supervised."""
    method = method or mask_method(tokenizer)
    if method == MASK_BY_MARKERS:
        text, spans = marker_spans(tokenizer, messages, tools)
        spans = [sp for sp in spans if sp[0] >= cursor]
    else:
        shape = shape or reply_shape(tokenizer, tools)
        text, spans = reply_spans(tokenizer, messages, tools, shape, from_message, cursor)
    ids, offsets = _encode(tokenizer, text)
    return Rendering(text, ids, offsets, _spans_to_mask(offsets, spans))


def _header(tokenizer, messages: list[dict], tools: list | None, r: Rendering) -> int:
    """Tokens of system + tools + first user message (never past the first supervised token)."""
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    first_sup = next((i for i, x in enumerate(r.mask) if x), len(r.ids))
    if first_user is None:
        return first_sup
    head = _render_text(tokenizer, messages[: first_user + 1], tools)
    return min(_first_token_at(r.offsets, len(head)), first_sup) if r.text.startswith(head) else first_sup


def tokenize_conversation(
    tokenizer, messages: list[dict], tools: list | None, method: str | None = None, shape: ReplyShape | None = None
) -> tuple[list[int], list[int], int]:
    """(ids, assistant mask, header length) of the whole conversation: header = system + tools + first user message."""
    r = render_masked(tokenizer, messages, tools, method, shape)
    return r.ids, r.mask, _header(tokenizer, messages, tools, r)


@dataclass
class Segment:
    """One user query of a thread: the conversation up to the next query, only this query's replies supervised."""

    index: int
    ids: list[int]
    mask: list[int]
    header: int
    query: tuple[int, int] | None  # token span of the segment's own query when it is not the header's


def query_bounds(messages: list[dict]) -> list[tuple[int | None, int]]:
    """(query message index or None for the first segment, end message index) of each user-query segment."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    ends = users[1:] + [len(messages)]
    return [(None if k == 0 else q, ends[k]) for k, q in enumerate(users)] or [(None, len(messages))]


def render_segments(
    tokenizer, messages: list[dict], tools: list | None, method: str | None = None, shape: ReplyShape | None = None
) -> list[Segment]:
    """Render a thread once per user query (upstream's rule), each segment's replies in their own context.

    Segment s = messages up to the next user query; its replies are those after its query. A template
    that drops the reasoning of replies before the last query (Qwen3) thus shows every reply with its
    own reasoning and the earlier ones as the model saw them. Segments without replies are left out.
    """
    method = method or mask_method(tokenizer)
    if method == MASK_BY_INCREMENTS:
        shape = shape or reply_shape(tokenizer, tools)
    bounds = query_bounds(messages)
    opener = user_opener(tokenizer, tools) if len(bounds) > 1 else ""
    out = []
    for s, (q, end) in enumerate(bounds):
        sub, first = messages[:end], 0 if q is None else q + 1
        if not any(m["role"] == "assistant" for m in sub[first:]):
            continue
        asked = _render_text(tokenizer, messages[: q + 1], tools) if q is not None else ""
        cursor = len(asked)
        try:
            r = render_masked(tokenizer, sub, tools, method, shape, first, cursor)
            if not r.text.startswith(asked):
                raise RenderError(
                    "the template renders the conversation up to this query differently once replies follow it, "
                    "so its replies cannot be shown in the context they were generated in"
                )
        except RenderError as err:
            raise RenderError(f"segment {s} (message {first}): {err}") from err
        header = _header(tokenizer, sub, tools, r)
        query = None
        if q is not None:
            qa_char = r.text.rfind(opener, 0, cursor) if opener else -1
            qa, qb = _first_token_at(r.offsets, qa_char if qa_char >= 0 else cursor), _first_token_at(r.offsets, cursor)
            query = (qa, qb) if header <= qa < qb else None
        out.append(Segment(s, r.ids, r.mask, header, query))
    return out


def supervised_blocks(mask: list[int], start: int) -> list[tuple[int, int]]:
    """Maximal runs of assistant tokens at or after `start`, as [s, e) spans."""
    blocks, s = [], None
    for i in range(start, len(mask) + 1):
        on = i < len(mask) and mask[i]
        if on and s is None:
            s = i
        elif not on and s is not None:
            blocks.append((s, i))
            s = None
    return blocks


def turn_starts(ids: list[int], header: int, opener: list[int]) -> list[int]:
    """Where each turn after the header begins: the template's turn-start token (`<|im_start|>`),
    the first token of its turn opener; none when the template has no opener."""
    return [p for p in range(header, len(ids)) if ids[p] == opener[0]] if opener else []


def cut_windows(
    ids: list[int], mask: list[int], header: int, window: int, context: int, opener: list[int] | None = None,
    query: tuple[int, int] | None = None, cut: str = "blocks",
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[int, int]]]:
    """Greedy windows; returns ([(input_ids, labels)], dropped blocks as [s, e) spans).

    Each window = ids[:header] + [query] + ids[c:end]: new reply blocks from their turn's start, and
    before them at most `context` tokens of masked earlier context. `cut="blocks"` (upstream's)
    takes that context and ends the window in whole turns (a window never starts or stops inside a
    message or tool output); `cut="tokens"` takes exactly the last `context` tokens before the
    reply's turn opener and ends at its last supervised token. `query` (a later segment's own user
    query) is put in whenever it fits, counted against `context`, so every reply is learnt with the
    request it answers.
    """
    opener = list(opener or [])
    blocks = supervised_blocks(mask, header)
    starts = turn_starts(ids, header, opener) if cut == "blocks" else []
    qa, qb = query or (0, 0)

    def lead_start(s: int) -> int:  # where the reply's turn begins (blocks), or its opener (tokens)
        if cut == "blocks":
            return next((p for p in reversed(starts) if p <= s), s)
        k = len(opener)
        return s - k if k and s - k >= header and ids[s - k : s] == opener else s

    def turn_end(e: int) -> int:  # end of the turn holding token e - 1
        return next((p for p in starts if p >= e), len(ids)) if cut == "blocks" else e

    def context_start(ls: int, lower: int, budget: int) -> int:
        if budget <= 0:
            return ls
        if cut == "tokens":
            return ls - max(0, min(budget, ls - lower))
        c = ls
        for p in reversed([p for p in starts if lower <= p < ls]):
            if ls - p > budget:
                break
            c = p
        return c

    out, dropped, i = [], [], 0
    while i < len(blocks):
        s, e = blocks[i]
        ls = lead_start(s)
        room = window - header - (turn_end(e) - ls)
        if room < 0:
            dropped.append((s, e))
            i += 1
            continue
        c = context_start(ls, header, min(context, room))
        with_query = query is not None and c > qa and qb - qa <= room and qb <= ls
        if with_query:
            c = context_start(ls, qb, min(context, room) - (qb - qa))
        lead = ids[:header] + (ids[qa:qb] if with_query else [])
        j = i
        while j + 1 < len(blocks) and len(lead) + turn_end(blocks[j + 1][1]) - c <= window:
            j += 1
        end = turn_end(blocks[j][1])
        labels = [IGNORE] * len(lead) + [ids[p] if (p >= s and mask[p]) else IGNORE for p in range(c, end)]
        out.append((lead + ids[c:end], labels))
        i = j + 1
    return out, dropped


# ---------------------------------------------------------------- episodes


@dataclass
class EpisodeRender:
    """One episode's windows and what went wrong in it (errors: dicts with kind and reason)."""

    windows: list[Window] = field(default_factory=list)
    dropped_blocks: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    threads_by_role: Counter = field(default_factory=Counter)
    segments: int = 0
    length_cuts: int = 0


def render_episode(ep: EpisodeTrace, tokenizer, sft: SftSpec, method: str, opener: list[int]) -> EpisodeRender:
    """Threads -> stripped, classified, segment-rendered windows; a thread with an error gives none.

    When no orchestrator thread carried a strippable teacher prompt, no orchestrator thread gives
    windows either: whatever its prompt became, it was not the bare task.
    """
    from mass_jobs.trace_shape import trace_problems

    out = EpisodeRender()
    where = {"task": ep.task, "episode": ep.episode}
    if problems := trace_problems(ep.records, list(ep.problems)):
        out.errors.append({**where, "thread": None, "kind": "trace_malformed",
                           "reason": f"the recorded calls cannot be read: {'; '.join(problems)}"[:2000]})
        return out
    threads = rebuild_threads(ep.records, ep.harness, sft.keep_length_cut)
    conversations, stripped = [], False
    for thread in threads:
        messages = thread.messages
        if ep.needs_stripping and is_lead(thread):
            messages, replaced = strip_teacher_prompt(messages, ep.teacher_prompt, ep.bare_prompt, ep.strip_pieces)
            stripped |= bool(replaced)
        conversations.append(messages)
    if ep.needs_stripping and not stripped:
        roles = ", ".join(f"{i}: {t.role}" for i, t in enumerate(threads)) or "none"
        out.errors.append({**where, "thread": None, "kind": "teacher_prompt_not_found", "reason": (
            f"no orchestrator thread carries the teacher prompt (or its workflow and directive) to strip; "
            f"threads {{{roles}}} under harness {ep.harness or 'unknown'}")})
    for t_idx, (thread, messages) in enumerate(zip(threads, conversations)):
        out.length_cuts += int(thread.dropped_length_cut)
        if ep.needs_stripping and is_lead(thread) and not stripped:
            continue
        left = teacher_text_left(messages, ep) if ep.needs_stripping else None
        if left is not None:
            out.errors.append({**where, "thread": t_idx, "kind": "teacher_prompt_left", "reason": (
                f"thread {t_idx} ({thread.role}) message {left} still holds the teacher prompt's workflow or directive")})
            continue
        try:
            segments = render_segments(tokenizer, messages, thread.tools, method)
        except RenderError as err:
            out.errors.append({**where, "thread": t_idx, "kind": "thread_not_renderable",
                               "reason": f"thread {t_idx} ({thread.role}): {err}"})
            continue
        if segments and segments[0].header > HEADER_SHARE * sft.window:
            out.errors.append({**where, "thread": t_idx, "kind": "header_over_window", "reason": (
                f"thread {t_idx} ({thread.role}): its header (system, tools, first user message) is "
                f"{segments[0].header} tokens, over {HEADER_SHARE:.0%} of sft.window={sft.window}")})
            continue
        out.threads_by_role[thread.role] += 1
        index = 0
        for seg in segments:
            out.segments += 1
            pieces, lost = cut_windows(seg.ids, seg.mask, seg.header, sft.window, sft.context, opener, seg.query,
                                       sft.cut)
            for s, e in lost:
                out.dropped_blocks.append({**where, "thread": t_idx, "role": thread.role, "segment": seg.index,
                                           "block_tokens": e - s, "header_tokens": seg.header, "window": sft.window})
            for win_ids, labels in pieces:
                out.windows.append(Window(ep.task, ep.episode, thread.role, t_idx, index, win_ids, labels))
                index += 1
    if out.dropped_blocks:
        first = out.dropped_blocks[0]
        out.errors.append({**where, "thread": first["thread"], "kind": "reply_too_long", "reason": (
            f"{len(out.dropped_blocks)} reply block(s) cannot fit sft.window={sft.window}, e.g. thread "
            f"{first['thread']}: {first['block_tokens']} tokens after a {first['header_tokens']}-token header")})
    return out


def render_windows(episodes: list[EpisodeTrace], tokenizer, sft: SftSpec) -> tuple[list[Window], dict]:
    """Core of the render step: episodes -> windows plus stats.

    An episode with errors is dropped whole under `sft.strict`; otherwise it keeps the threads and
    replies that rendered. Raises RenderError only for what no episode can get past (the tokenizer).
    """
    method = mask_method(tokenizer)
    opener = turn_opener(tokenizer)
    windows: list[Window] = []
    dropped_blocks, errors, episodes_dropped = [], [], []
    threads_by_role: Counter = Counter()
    segments = length_cuts = 0
    for ep in episodes:
        r = render_episode(ep, tokenizer, sft, method, opener)
        dropped_blocks += r.dropped_blocks
        errors += r.errors
        length_cuts += r.length_cuts
        if r.errors and sft.strict:
            episodes_dropped.append({"task": ep.task, "episode": ep.episode, "reasons": [e["reason"] for e in r.errors]})
            continue
        windows += r.windows
        threads_by_role += r.threads_by_role
        segments += r.segments
    stats = window_stats(windows, dropped_blocks, errors, threads_by_role, length_cuts, method)
    stats.update(episodes=len(episodes), episodes_dropped=episodes_dropped, segments=segments, strict=sft.strict)
    return windows, stats


def window_stats(
    windows: list[Window], dropped: list[dict], errors: list[dict], threads_by_role: Counter, length_cuts: int,
    method: str | None = None,
) -> dict:
    tokens_by_role: Counter = Counter()
    windows_by_role: Counter = Counter()
    for w in windows:
        tokens_by_role[w.role] += w.n_supervised
        windows_by_role[w.role] += 1
    return {
        "windows": len(windows),
        "windows_by_role": {r: windows_by_role.get(r, 0) for r in ROLES},
        "stored_supervised_tokens": sum(tokens_by_role.values()),
        "supervised_tokens_by_role": {r: tokens_by_role.get(r, 0) for r in ROLES},
        "window_tokens": sum(len(w.input_ids) for w in windows),
        "threads_by_role": {r: threads_by_role.get(r, 0) for r in ROLES},
        "dropped_blocks": dropped,
        "dropped_supervised_tokens": sum(d["block_tokens"] for d in dropped),
        "episode_errors": errors,
        "teacher_prompt_not_found": [e for e in errors if e["kind"] == "teacher_prompt_not_found"],
        "threads_refused_header": sum(e["kind"] == "header_over_window" for e in errors),
        "length_cut_responses_dropped": length_cuts,
        "mask_method": method,
    }


def write_jsonl(path, windows: list[Window]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for w in windows:
            f.write(json.dumps(w.record(), separators=(",", ":")) + "\n")


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------- the step over the store


def _episode_ids(manifest: dict, split: str, key: str) -> list[int]:
    """Episode indices of a rank manifest: `train` is a list of "ep-<i>", `val` one "ep-<i>" or null."""
    raw = manifest.get(split)
    items = [] if raw is None else raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        head, _, idx = str(item).rpartition("-")
        if head != "ep" or not idx.isdigit():
            raise RenderError(f"{key}: expected '{split}' to hold episode ids like 'ep-3', found {raw!r}")
        out.append(int(idx))
    return out


def teacher_prompt_from_trace(records: list[dict], harness: str | None = None) -> str | None:
    """The orchestrator's latest user message in its first call: harnesses send the collection prompt
    verbatim there (qwen-code after its environment-context turn)."""
    ordered = sorted(records, key=lambda r: r.get("seq", 0))
    lead = [r for r in ordered if (r.get("agent") or {}).get("role") == "orchestrator"
            or (not r.get("agent") and can_delegate((r.get("request") or {}).get("tools"), harness))]
    for r in lead[:1]:
        users = [m for m in (r.get("request") or {}).get("messages") or [] if m.get("role") == "user"]
        if users:
            return text_of(users[-1].get("content"))
    return None


def load_episode(ctx, gen: int, task, i: int) -> EpisodeTrace:
    from mass_jobs.trace_shape import parse_lines

    raw = ctx.store.get_bytes(ctx.episode_file(gen, task.id, i, "trace.jsonl"))
    records, problems = parse_lines(raw.decode("utf-8", "replace"))
    if "\ufffd" in raw.decode("utf-8", "replace") and "\ufffd" not in raw.decode("utf-8", "ignore"):
        problems.append("the trace is not valid UTF-8")
    # collect stores the exact prompt it sent, its pieces and the harness in episode.json; else the trace holds the prompt
    doc_key = ctx.episode_file(gen, task.id, i, "episode.json")
    doc = ctx.store.get_json(doc_key) if ctx.store.exists(doc_key) else {}
    harness = doc.get("harness") or ctx.spec.execution.harness
    parts = doc.get("prompt_parts") or {}
    from mass_jobs.trace_shape import trace_problems

    readable = not trace_problems(records, problems)
    return EpisodeTrace(task.id, i, records, bare_prompt=task.prompt.strip(),
                        teacher_prompt=doc.get("prompt") or (teacher_prompt_from_trace(records, harness) if readable else None),
                        harness=harness, strip_pieces=tuple(parts.get(k) or "" for k in ("workflow", "directive")),
                        problems=tuple(problems))


def sft_step(ctx, gen: int):
    """The render Step, its tasks and their train/val episode ids (the composition's: winners or all
    ranked episodes). The tokenizer enters the inputs as the location the spec names (not the local
    dir it was loaded from), so every executor computes the same hash."""
    from mass_jobs.composition import WINDOW_ROLES, composition_of, training_episodes
    from mass_jobs.store import Step

    comp = composition_of(ctx.spec.sft)
    ranked = [t for t in ctx.spec.train_tasks() if ctx.store.exists(ctx.rank(gen, t.id))]
    ranks = {t.id: ctx.store.get_json(ctx.rank(gen, t.id)) for t in ranked}
    tasks = [t for t in ranked if not ranks[t.id].get("skipped")]
    split_ids = {t.id: {s: _episode_ids(ranks[t.id], s, ctx.rank(gen, t.id)) for s in ("train", "val")} for t in tasks}
    for t in tasks:
        split_ids[t.id]["train"] = _episode_ids({"train": training_episodes(ranks[t.id], comp)}, "train", ctx.rank(gen, t.id))
    tokenizer = ctx.spec.model.tokenizer or (ctx.spec.model.base if gen == 0 else ctx.model(gen))
    # the roles kept enter the hash only when they differ from all, so the paper's runs keep theirs
    roles = {} if comp.roles == WINDOW_ROLES else {"roles": list(comp.roles)}
    step = Step(ctx.store, ctx.sft(gen), inputs={
        "episodes": split_ids, "sft": ctx.spec.sft.model_dump(mode="json", include={"window", "context", "cut", "strict", "keep_length_cut"}),
        "tokenizer": tokenizer, "prompts": {t.id: t.prompt for t in tasks}, **roles,
    })
    return step, tasks, split_ids


def run_render(ctx, gen: int, tokenizer) -> dict:
    """Render every train task's ranked episodes into sft/{train,val}.jsonl + stats.json.

    Tasks without a rank manifest, or whose ranking was skipped (e.g. search never beat the bare
    reference), give no data.
    Returns the step manifest's `extra` (stored supervised tokens, window counts).
    """
    import tempfile
    from pathlib import Path

    from mass_jobs.composition import composition_of, counts_by_role, keep_window

    step, tasks, split_ids = sft_step(ctx, gen)
    if step.done:
        return ctx.store.get_json(step.manifest_key)["extra"]
    step.start()
    out, stats = {}, {}
    comp = composition_of(ctx.spec.sft)
    for split in ("train", "val"):
        episodes = [load_episode(ctx, gen, t, i) for t in tasks for i in split_ids[t.id][split]]
        windows, stats[split] = render_windows(episodes, tokenizer, ctx.spec.sft)
        # the composition's roles: windows of other roles are counted, not stored
        out[split] = [w for w in windows if keep_window(w, comp)]
        stats[split]["windows_left_out_by_role"] = {r: n - counts_by_role(out[split])[r]
                                                     for r, n in counts_by_role(windows).items()}
        stats[split].update(window_stats(out[split], stats[split]["dropped_blocks"], stats[split]["episode_errors"],
                                         Counter(stats[split]["threads_by_role"]),
                                         stats[split]["length_cut_responses_dropped"], stats[split]["mask_method"]))
    if not out["train"]:
        dropped = stats["train"]["episodes_dropped"]
        why = f"; {len(dropped)} episode(s) dropped under sft.strict, e.g. {dropped[0]['reasons'][0]}" if dropped else ""
        ranked = sorted(t.id for t in ctx.spec.resolved_tasks() if ctx.store.exists(ctx.rank(gen, t.id)))
        raise RenderError(f"generation {gen}: no training windows (tasks with rank manifests: {ranked}){why}")
    keys = []
    with tempfile.TemporaryDirectory() as tmp:
        for split in ("train", "val"):
            path = Path(tmp) / f"{split}.jsonl"
            write_jsonl(path, out[split])
            keys.append(ctx.sft_file(gen, split))
            ctx.store.put_file(keys[-1], path)
    extra = {
        "stored_supervised_tokens": stats["train"]["stored_supervised_tokens"],
        "val_supervised_tokens": stats["val"]["stored_supervised_tokens"],
        "windows": stats["train"]["windows"],
        "windows_by_role": stats["train"]["windows_by_role"],
        "val_windows": stats["val"]["windows"],
        "dropped_blocks": len(stats["train"]["dropped_blocks"]) + len(stats["val"]["dropped_blocks"]),
        "mask_method": stats["train"]["mask_method"],
        "episode_errors": len(stats["train"]["episode_errors"]) + len(stats["val"]["episode_errors"]),
        "episodes_dropped": len(stats["train"]["episodes_dropped"]) + len(stats["val"]["episodes_dropped"]),
        "composition": comp.to_dict(),
    }
    keys.append(ctx.sft_file(gen, "stats"))
    ctx.store.put_json(keys[-1], {**stats, "summary": extra})
    step.finish(keys, extra=extra)
    return extra
