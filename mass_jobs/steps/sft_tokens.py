"""A conversation rendered with the model's own chat template into token ids, loss masks and
windows: the token half of `mass render sft` (the trace half, threads and stripping, is
`steps/render_sft.py`).

Loss tokens are found by the template's {% generation %} markers when it has them, else by
rendering each reply incrementally and aligning it to the conversation's rendering; a thread is
rendered once per user query (segment), and windows are cut greedily along supervised blocks
(`cut_windows`, upstream's whole-turn cut by default).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mass_jobs.config.errors import StepFailed
from mass_jobs.training.loss import IGNORE


class RenderError(StepFailed, ValueError):
    """The traces or the tokenizer cannot be rendered as asked (the message says which and why)."""


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


def as_served(messages: list[dict]) -> list[dict]:
    """The messages as a server hands them to the template: a tool call's `arguments` string parsed
    into its object (vLLM and transformers serve both do; the family's templates iterate it as a
    mapping, so an unparsed string would drop every argument from the training text)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls and any(isinstance((c.get("function") or c).get("arguments"), str) for c in calls):
            m = {**m, "tool_calls": [_parsed_call(c) for c in calls]}
        out.append(m)
    return out


def _parsed_call(call: dict) -> dict:
    fn = call.get("function") or call
    args = fn.get("arguments")
    if not isinstance(args, str):
        return call
    try:
        parsed = json.loads(args)
    except ValueError:
        return call  # a malformed call stays text, as the servers leave it
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**fn, "arguments": parsed}} if "function" in call else {**call, "arguments": parsed}


def _render_text(tokenizer, messages: list[dict], tools: list | None, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        as_served(messages), tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )


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
        t.content
        for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(t, "special", False) and t.content
    }


def reply_shape(tokenizer, tools: list | None = None) -> ReplyShape:
    probe = [{"role": "user", "content": "x"}]
    bare = _render_text(tokenizer, probe, tools)
    prompted = _render_text(tokenizer, probe, tools, generation_prompt=True)
    opener = prompted[len(bare) :] if prompted.startswith(bare) else ""
    answered = _render_text(tokenizer, probe + [{"role": "assistant", "content": _PROBE_REPLY}], tools)
    at = answered.rfind(_PROBE_REPLY)
    if not answered.startswith(prompted) or at < len(prompted):
        raise RenderError(
            "chat_template has no {% generation %} markers and does not render a reply right after its "
            "generation prompt, so assistant tokens cannot be found"
        )
    after = answered[at + len(_PROBE_REPLY) :]
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
            reply = upto[len(before) :]
        elif shape.opener and shape.opener in upto:
            # the previous message renders differently once it is no longer last (e.g. Qwen3's empty
            # think block on a final reply followed by another reply): the reply follows its opener
            reply = upto[upto.rfind(shape.opener) + len(shape.opener) :]
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
        conversations=[as_served(messages)],
        tools=tools,
        chat_template=tokenizer.get_chat_template(None, tools),
        return_assistant_tokens_mask=True,
        **tokenizer.special_tokens_map,
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
    full = list(
        tokenizer.apply_chat_template(probe, tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"]
    )
    return full[len(bare) :] if full[: len(bare)] == bare else []


@dataclass
class Rendering:
    """A conversation rendered by the chat template: token ids, offsets and the supervised-token mask."""

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    mask: list[int]


def render_masked(
    tokenizer,
    messages: list[dict],
    tools: list | None,
    method: str | None = None,
    shape: ReplyShape | None = None,
    from_message: int = 0,
    cursor: int = 0,
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
    ids: list[int],
    mask: list[int],
    header: int,
    window: int,
    context: int,
    opener: list[int] | None = None,
    query: tuple[int, int] | None = None,
    cut: str = "blocks",
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[int, int]]]:
    """Greedy windows; returns ([(input_ids, labels)], dropped blocks as [s, e) spans).

    Each window = ids[:header] + [query] + ids[c:end]: new reply blocks from their turn's start, and
    before them masked earlier context. `cut="blocks"` is upstream's `make_windows`: whole earlier
    turns back from the reply while they fit `context`; a later segment's own user `query`, when not
    among them, goes in on top of that budget; and when the reply and that context overflow the
    window, the context is dropped (the query kept if it fits beside the reply). `cut="fit"` cuts the
    same whole turns but counts the query in `context` and, on overflow, keeps the context that still
    fits. `cut="tokens"` takes exactly the last `context` tokens before the reply's turn opener (the
    query counted in them) and ends at its last supervised token. A window never starts or stops
    inside a message or tool output except under `tokens`.
    """
    opener = list(opener or [])
    blocks = supervised_blocks(mask, header)
    starts = turn_starts(ids, header, opener) if cut in ("blocks", "fit") else []
    qa, qb = query or (0, 0)

    def lead_start(s: int) -> int:  # where the reply's turn begins (blocks, fit), or its opener (tokens)
        if cut != "tokens":
            return next((p for p in reversed(starts) if p <= s), s)
        k = len(opener)
        return s - k if k and s - k >= header and ids[s - k : s] == opener else s

    def turn_end(e: int) -> int:  # end of the turn holding token e - 1
        return next((p for p in starts if p >= e), len(ids)) if cut != "tokens" else e

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
        reply = turn_end(e) - ls
        room = window - header - reply
        if room < 0:
            dropped.append((s, e))
            i += 1
            continue
        if cut == "blocks":  # upstream's: the query on top of the context; overflow drops the context
            c = context_start(ls, header, context)
            with_query = query is not None and c > qa and qb <= ls
            if (ls - c) + (qb - qa if with_query else 0) > room:
                c = ls
                with_query = query is not None and qb <= ls and qb - qa <= room
        else:
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
