"""Render recorded teacher episodes into masked SFT windows (MASS outer loop, step 3).

Each agent's conversation is rebuilt from the proxy's trace lines, classified as orchestrator,
worker or auxiliary, and rendered with the model's own chat template (tool definitions
included). Only assistant tokens carry loss: found by the template's {% generation %} markers
when it has them, else by rendering each reply incrementally and aligning it to the full
rendering (stock hub templates such as Qwen3's have no markers). In orchestrator threads the
teacher prompt (task + workflow + directive) is replaced by the bare task, so the student learns
to act as the teacher did without being told how. Workers keep the concrete assignments they
were sent.

Windows hold at most `sft.window` tokens: the masked header (system + tools + first user
message), up to `sft.context` tokens of masked earlier context, then new assistant blocks; every
assistant token is trained in exactly one window. A block that cannot fit is reported (and
fails the step under `sft.strict`).

Run: `mass render sft --spec SPEC --gen G` (writes `<run>/gen-<g>/sft/{train,val}.jsonl, stats.json`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mass_jobs.errors import StepFailed
from mass_jobs.models import SftSpec

IGNORE = -100  # label of a position that carries no loss (the value torch's cross entropy skips)
ROLES = ("orchestrator", "worker", "auxiliary")
DELEGATION_TOOL = "delegate"  # the built-in harness's sub-agent tool


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


@dataclass
class Thread:
    """One agent conversation rebuilt from consecutive calls that extend each other."""

    agent: dict | None
    tools: list | None
    calls: list[dict] = field(default_factory=list)
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


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _arguments(raw: Any) -> Any:
    """Chat templates serialise arguments themselves, so hand them a parsed object when we can."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _normal_message(m: dict) -> dict:
    out: dict[str, Any] = {"role": m.get("role"), "content": _content_text(m.get("content"))}
    if m.get("reasoning_content"):
        out["reasoning_content"] = _content_text(m["reasoning_content"])
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
        ]
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def _same_turn(a: dict, b: dict) -> bool:
    """Equality of two messages up to reasoning (harnesses often drop reasoning from history)."""
    strip = ("reasoning_content",)
    return {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}


def _extends(prev: list[dict], new: list[dict]) -> bool:
    return len(new) >= len(prev) and all(_same_turn(p, n) for p, n in zip(prev, new))


def _tool_names(tools: list | None) -> set[str]:
    names = set()
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and fn.get("name"):
            names.add(fn["name"])
    return names


def rebuild_threads(records: list[dict], delegation_tool: str = DELEGATION_TOOL,
                    keep_length_cut: bool = False) -> list[Thread]:
    """Group calls into conversations; a call that does not extend its predecessor starts a new one.

    With the trace's `agent` field, only the same agent's latest thread can be extended; without
    it, any earlier thread whose messages the call extends (latest first).
    """
    threads: list[Thread] = []
    for rec in sorted(records, key=lambda r: r.get("seq", 0)):
        req = rec.get("request") or {}
        msgs = [_normal_message(m) for m in req.get("messages") or []]
        if not msgs:
            continue
        agent = rec.get("agent") or None
        agent_id = agent.get("id") if agent else None
        tools = req.get("tools") or None
        target = None
        for t in reversed(threads):
            t_id = t.agent.get("id") if t.agent else None
            if t_id != agent_id or t.tools != tools:
                continue
            if _extends(t.calls[-1]["_messages"], msgs):
                target = t
            if agent_id is not None or target is not None:
                break  # a known agent only continues its latest conversation
        if target is None:
            target = Thread(agent=agent, tools=tools)
            threads.append(target)
        target.calls.append({**rec, "_messages": msgs})
    for t in threads:
        t.messages = _final_messages(t, keep_length_cut)
        t.role = classify(t, delegation_tool)
    return threads


def _final_messages(t: Thread, keep_length_cut: bool = False) -> list[dict]:
    last = t.calls[-1]
    msgs = [dict(m) for m in last["_messages"]]
    # History copies of earlier replies may lack reasoning; the recorded responses have it.
    for call in t.calls[:-1]:
        resp = (call.get("response") or {}).get("message")
        idx = len(call["_messages"])
        if resp and idx < len(msgs) and msgs[idx]["role"] == "assistant":
            full = _normal_message({**resp, "role": "assistant"})
            if _same_turn(full, msgs[idx]):
                msgs[idx] = full
    resp = last.get("response") or {}
    if resp.get("message") and not last.get("error"):
        if resp.get("finish_reason") == "length" and not keep_length_cut:
            t.dropped_length_cut = True  # a reply cut mid-way teaches the model to stop mid-thought
        else:
            msgs.append(_normal_message({**resp["message"], "role": "assistant"}))
    return msgs


def classify(t: Thread, delegation_tool: str = DELEGATION_TOOL) -> str:
    agent = t.agent or {}
    role = str(agent.get("role") or "").lower()
    if role == "orchestrator" or agent.get("id") == "orchestrator":
        return "orchestrator"
    if role in ("worker", "auxiliary"):
        return role
    if not agent and delegation_tool in _tool_names(t.tools):
        return "orchestrator"
    return "worker" if t.tools else "auxiliary"


def strip_teacher_prompt(messages: list[dict], teacher_prompt: str, bare_prompt: str) -> tuple[list[dict], int]:
    """Replace the teacher prompt by the bare task in every user message that carries it."""
    out, replaced = [], 0
    for m in messages:
        if m["role"] == "user" and teacher_prompt and teacher_prompt in m["content"]:
            m = {**m, "content": m["content"].replace(teacher_prompt, bare_prompt)}
            replaced += 1
        out.append(m)
    return out, replaced


# ---------------------------------------------------------------- tokens and windows

_GENERATION_MARK = re.compile(r"{%-?\s*generation\s*-?%}")
MASK_BY_MARKERS = "generation_markers"  # the template's {% generation %} spans (transformers computes the mask)
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
    specials = set(tokenizer.all_special_tokens) | {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)
    }
    cut = max((after.rfind(s) + len(s) for s in specials if s and s in after), default=len(after))
    return ReplyShape(opener=opener, close=after[:cut], tail=after[cut:])


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


def reply_spans(tokenizer, messages: list[dict], tools: list | None, shape: ReplyShape) -> tuple[str, list[tuple[int, int]]]:
    """(full rendering, character spans of each assistant reply in it) without generation markers.

    Reply i = what rendering messages[:i+1] adds to messages[:i] + generation prompt, minus the
    template's untrained tail; it is then aligned to the full rendering, which is what is trained.
    """
    full = _render_text(tokenizer, messages, tools)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
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


def _spans_to_tokens(tokenizer, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Tokenise as apply_chat_template does and mark every token overlapping a span (as the marker path does)."""
    enc = tokenizer(text, add_special_tokens=False)
    if not getattr(enc, "encodings", None):
        raise RenderError("masking without {% generation %} markers needs a fast tokenizer (token offsets)")
    ids = list(enc["input_ids"])
    mask = [0] * len(ids)
    k = 0
    for t, (a, b) in enumerate(enc.encodings[0].offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if b > spans[k][0]:
            mask[t] = 1
    return ids, mask


def turn_opener(tokenizer) -> list[int]:
    """Tokens the template puts before an assistant reply (`add_generation_prompt`), e.g. <|im_start|>assistant\n."""
    probe = [{"role": "user", "content": "x"}]
    bare = list(tokenizer.apply_chat_template(probe, tokenize=True, return_dict=True)["input_ids"])
    full = list(tokenizer.apply_chat_template(probe, tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"])
    return full[len(bare):] if full[: len(bare)] == bare else []


def assistant_mask(
    tokenizer, messages: list[dict], tools: list | None, method: str | None = None, shape: ReplyShape | None = None
) -> tuple[list[int], list[int]]:
    """(ids, assistant mask) of the full rendering, by generation markers or incremental rendering."""
    method = method or mask_method(tokenizer)
    if method == MASK_BY_MARKERS:
        enc = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        return list(enc["input_ids"]), [int(x) for x in enc["assistant_masks"]]
    full, spans = reply_spans(tokenizer, messages, tools, shape or reply_shape(tokenizer, tools))
    return _spans_to_tokens(tokenizer, full, spans)


def tokenize_conversation(
    tokenizer, messages: list[dict], tools: list | None, method: str | None = None, shape: ReplyShape | None = None
) -> tuple[list[int], list[int], int]:
    """(ids, assistant mask, header length): header = system + tools + first user message."""
    ids, mask = assistant_mask(tokenizer, messages, tools, method, shape)
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    first_sup = next((i for i, x in enumerate(mask) if x), len(ids))
    header = first_sup
    if first_user is not None:
        head = tokenizer.apply_chat_template(messages[: first_user + 1], tools=tools, tokenize=True, return_dict=True)
        head_ids = list(head["input_ids"])
        if ids[: len(head_ids)] == head_ids:
            header = min(len(head_ids), first_sup)
    return ids, mask, header


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


def cut_windows(
    ids: list[int], mask: list[int], header: int, window: int, context: int, opener: list[int] | None = None
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[int, int]]]:
    """Greedy windows; returns ([(input_ids, labels)], dropped blocks as [s, e) spans).

    Each window = ids[:header] + ids[c:end] where [s_first, end) are new blocks and [c, s_first)
    the block's turn opener (always kept: a reply is learnt after its `<|im_start|>assistant`)
    plus at most `context` tokens of masked earlier context.
    """
    opener = list(opener or [])
    blocks = supervised_blocks(mask, header)

    def lead_start(s: int) -> int:
        k = len(opener)
        return s - k if k and s - k >= header and ids[s - k : s] == opener else s

    out, dropped, i = [], [], 0
    while i < len(blocks):
        s, e = blocks[i]
        ls = lead_start(s)
        room = window - header - (e - ls)
        if room < 0:
            dropped.append((s, e))
            i += 1
            continue
        c = ls - min(context, ls - header, room)
        j = i
        while j + 1 < len(blocks) and header + blocks[j + 1][1] - c <= window:
            j += 1
        end = blocks[j][1]
        win_ids = ids[:header] + ids[c:end]
        labels = [IGNORE] * header + [
            ids[p] if (p >= s and mask[p]) else IGNORE for p in range(c, end)
        ]
        out.append((win_ids, labels))
        i = j + 1
    return out, dropped


def render_windows(
    episodes: list[EpisodeTrace], tokenizer, sft: SftSpec, delegation_tool: str = DELEGATION_TOOL
) -> tuple[list[Window], dict]:
    """Core of the render step: episodes -> windows plus stats (raises RenderError under strict)."""
    method = mask_method(tokenizer)
    opener = turn_opener(tokenizer)
    windows: list[Window] = []
    dropped: list[dict] = []
    missing_teacher: list[dict] = []
    threads_by_role: Counter = Counter()
    length_cuts = 0
    for ep in episodes:
        for t_idx, thread in enumerate(rebuild_threads(ep.records, delegation_tool, sft.keep_length_cut)):
            messages = thread.messages
            length_cuts += int(thread.dropped_length_cut)
            if thread.role == "orchestrator" and ep.teacher_prompt:
                messages, replaced = strip_teacher_prompt(messages, ep.teacher_prompt, ep.bare_prompt)
                if not replaced:
                    missing_teacher.append({"task": ep.task, "episode": ep.episode, "thread": t_idx})
            threads_by_role[thread.role] += 1
            try:
                ids, mask, header = tokenize_conversation(tokenizer, messages, thread.tools, method)
            except RenderError as err:
                raise RenderError(f"task {ep.task!r} episode {ep.episode} thread {t_idx} ({thread.role}): {err}") from err
            pieces, lost = cut_windows(ids, mask, header, sft.window, sft.context, opener)
            for s, e in lost:
                dropped.append(
                    {"task": ep.task, "episode": ep.episode, "thread": t_idx, "role": thread.role,
                     "block_tokens": e - s, "header_tokens": header, "window": sft.window}
                )
            for w_idx, (win_ids, labels) in enumerate(pieces):
                windows.append(Window(ep.task, ep.episode, thread.role, t_idx, w_idx, win_ids, labels))
    if dropped and sft.strict:
        first = dropped[0]
        raise RenderError(
            f"{len(dropped)} assistant block(s) cannot fit sft.window={sft.window}: e.g. task {first['task']!r} "
            f"episode {first['episode']} thread {first['thread']}: {first['block_tokens']} tokens after a "
            f"{first['header_tokens']}-token header (raise sft.window or set sft.strict=false to drop them)"
        )
    return windows, window_stats(windows, dropped, missing_teacher, threads_by_role, length_cuts, method)


def window_stats(
    windows: list[Window], dropped: list[dict], missing_teacher: list[dict], threads_by_role: Counter, length_cuts: int,
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
        "teacher_prompt_not_found": missing_teacher,
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


def teacher_prompt_from_trace(records: list[dict]) -> str | None:
    """The orchestrator's first user message: the harness sends the collection prompt verbatim."""
    ordered = sorted(records, key=lambda r: r.get("seq", 0))
    orch = [r for r in ordered if (r.get("agent") or {}).get("role") == "orchestrator"] or ordered[:1]
    for r in orch:
        for m in (r.get("request") or {}).get("messages") or []:
            if m.get("role") == "user":
                return _content_text(m.get("content"))
    return None


def load_episode(ctx, gen: int, task, i: int) -> EpisodeTrace:
    base = ctx.collect_episode(gen, task.id, i)
    lines = ctx.store.get_bytes(f"{base}/trace.jsonl").decode("utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    # collect stores the exact prompt it sent in episode.json; else the trace itself holds it
    doc_key = f"{base}/episode.json"
    teacher = ctx.store.get_json(doc_key).get("prompt") if ctx.store.exists(doc_key) else None
    return EpisodeTrace(task.id, i, records, bare_prompt=task.prompt.strip(),
                        teacher_prompt=teacher or teacher_prompt_from_trace(records))


def run_render(ctx, gen: int, tokenizer) -> dict:
    """Render every train task's ranked episodes into sft/{train,val}.jsonl + stats.json.

    Tasks without a rank manifest, or whose ranking was skipped (e.g. search never beat the bare
    reference), give no data.
    Returns the step manifest's `extra` (stored supervised tokens, window counts).
    """
    import tempfile
    from pathlib import Path

    from mass_jobs.store import Step

    ranked = [t for t in ctx.spec.resolved_tasks() if t.split == "train" and ctx.store.exists(ctx.rank(gen, t.id))]
    ranks = {t.id: ctx.store.get_json(ctx.rank(gen, t.id)) for t in ranked}
    tasks = [t for t in ranked if not ranks[t.id].get("skipped")]
    split_ids = {t.id: {s: _episode_ids(ranks[t.id], s, ctx.rank(gen, t.id)) for s in ("train", "val")} for t in tasks}
    step = Step(ctx.store, ctx.sft(gen), inputs={
        "episodes": split_ids, "sft": ctx.spec.sft.model_dump(mode="json", include={"window", "context", "strict", "keep_length_cut"}),
        "tokenizer": getattr(tokenizer, "name_or_path", ""), "prompts": {t.id: t.prompt for t in tasks},
    })
    if step.done:
        return ctx.store.get_json(step.manifest_key)["extra"]
    step.start()
    out, stats = {}, {}
    for split in ("train", "val"):
        episodes = [load_episode(ctx, gen, t, i) for t in tasks for i in split_ids[t.id][split]]
        out[split], stats[split] = render_windows(episodes, tokenizer, ctx.spec.sft)
    if not out["train"]:
        raise RenderError(f"generation {gen}: no training windows (tasks with rank manifests: {sorted(ranks)})")
    keys = []
    with tempfile.TemporaryDirectory() as tmp:
        for split in ("train", "val"):
            path = Path(tmp) / f"{split}.jsonl"
            write_jsonl(path, out[split])
            keys.append(f"{ctx.sft(gen)}/{split}.jsonl")
            ctx.store.put_file(keys[-1], path)
    extra = {
        "stored_supervised_tokens": stats["train"]["stored_supervised_tokens"],
        "val_supervised_tokens": stats["val"]["stored_supervised_tokens"],
        "windows": stats["train"]["windows"],
        "windows_by_role": stats["train"]["windows_by_role"],
        "val_windows": stats["val"]["windows"],
        "dropped_blocks": len(stats["train"]["dropped_blocks"]) + len(stats["val"]["dropped_blocks"]),
        "mask_method": stats["train"]["mask_method"],
    }
    keys.append(f"{ctx.sft(gen)}/stats.json")
    ctx.store.put_json(keys[-1], {**stats, "summary": extra})
    step.finish(keys, extra=extra)
    return extra
