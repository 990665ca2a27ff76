"""Render recorded teacher episodes into masked SFT windows (MASS outer loop, step 3).

Each agent's conversation is rebuilt from the proxy's trace lines and classified as orchestrator,
worker or auxiliary: by the harness's `X-Mass-Role` header, else (qwen-code sends none) by whether
the thread was offered the harness's delegation tool (`mass_jobs.episodes.delegation`, the table the
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

The conversation half (threads, their roles, the workflow stripped) is `steps/sft_threads.py`, the
token half (template rendering, loss masks, window cutting) `steps/sft_tokens.py`.

Run: `mass render sft --spec SPEC --gen G` (writes `<run>/gen-<g>/sft/{train,val}.jsonl, stats.json`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from mass_jobs.config.composition import WINDOW_ROLES, composition_of, counts_by_role, keep_window, training_episodes
from mass_jobs.config.composition import WINDOW_ROLES as ROLES
from mass_jobs.config.run_spec import SftSpec
from mass_jobs.episodes.trace_shape import parse_lines, trace_problems
from mass_jobs.steps.sft_threads import (
    EpisodeTrace,
    is_lead,
    rebuild_threads,
    strip_teacher_prompt,
    teacher_prompt_from_trace,
    teacher_text_left,
)
from mass_jobs.steps.sft_tokens import IGNORE, RenderError, cut_windows, mask_method, render_segments, turn_opener
from mass_jobs.store import Step

HEADER_SHARE = 0.9  # upstream refuses a thread whose header takes more of the window than this


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

    out = EpisodeRender()
    where = {"task": ep.task, "episode": ep.episode}
    if problems := trace_problems(ep.records, list(ep.problems)):
        out.errors.append(
            {
                **where,
                "thread": None,
                "kind": "trace_malformed",
                "reason": f"the recorded calls cannot be read: {'; '.join(problems)}"[:2000],
            }
        )
        return out
    threads = rebuild_threads(
        ep.records, ep.harness, sft.keep_length_cut, sft.thread_roles, ep.teacher_prompt or ep.bare_prompt
    )
    conversations, stripped = [], False
    for thread in threads:
        messages = thread.messages
        if ep.needs_stripping and is_lead(thread):
            messages, replaced = strip_teacher_prompt(messages, ep.teacher_prompt, ep.bare_prompt, ep.strip_pieces)
            stripped |= bool(replaced)
        conversations.append(messages)
    if ep.needs_stripping and not stripped:
        roles = ", ".join(f"{i}: {t.role}" for i, t in enumerate(threads)) or "none"
        out.errors.append(
            {
                **where,
                "thread": None,
                "kind": "teacher_prompt_not_found",
                "reason": (
                    f"no orchestrator thread carries the teacher prompt (or its workflow and directive) to strip; "
                    f"threads {{{roles}}} under harness {ep.harness or 'unknown'}"
                ),
            }
        )
    for t_idx, (thread, messages) in enumerate(zip(threads, conversations)):
        out.length_cuts += int(thread.dropped_length_cut)
        if ep.needs_stripping and is_lead(thread) and not stripped:
            continue
        left = teacher_text_left(messages, ep) if ep.needs_stripping else None
        if left is not None:
            out.errors.append(
                {
                    **where,
                    "thread": t_idx,
                    "kind": "teacher_prompt_left",
                    "reason": (
                        f"thread {t_idx} ({thread.role}) message {left} still holds the teacher prompt's workflow or directive"
                    ),
                }
            )
            continue
        try:
            segments = render_segments(tokenizer, messages, thread.tools, method)
        except RenderError as err:
            out.errors.append(
                {
                    **where,
                    "thread": t_idx,
                    "kind": "thread_not_renderable",
                    "reason": f"thread {t_idx} ({thread.role}): {err}",
                }
            )
            continue
        if segments and segments[0].header > HEADER_SHARE * sft.window:
            out.errors.append(
                {
                    **where,
                    "thread": t_idx,
                    "kind": "header_over_window",
                    "reason": (
                        f"thread {t_idx} ({thread.role}): its header (system, tools, first user message) is "
                        f"{segments[0].header} tokens, over {HEADER_SHARE:.0%} of sft.window={sft.window}"
                    ),
                }
            )
            continue
        out.threads_by_role[thread.role] += 1
        index = 0
        for seg in segments:
            out.segments += 1
            pieces, lost = cut_windows(
                seg.ids, seg.mask, seg.header, sft.window, sft.context, opener, seg.query, sft.cut
            )
            for s, e in lost:
                out.dropped_blocks.append(
                    {
                        **where,
                        "thread": t_idx,
                        "role": thread.role,
                        "segment": seg.index,
                        "block_tokens": e - s,
                        "header_tokens": seg.header,
                        "window": sft.window,
                    }
                )
            for win_ids, labels in pieces:
                out.windows.append(Window(ep.task, ep.episode, thread.role, t_idx, index, win_ids, labels))
                index += 1
    if out.dropped_blocks:
        first = out.dropped_blocks[0]
        out.errors.append(
            {
                **where,
                "thread": first["thread"],
                "kind": "reply_too_long",
                "reason": (
                    f"{len(out.dropped_blocks)} reply block(s) cannot fit sft.window={sft.window}, e.g. thread "
                    f"{first['thread']}: {first['block_tokens']} tokens after a {first['header_tokens']}-token header"
                ),
            }
        )
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
            episodes_dropped.append(
                {"task": ep.task, "episode": ep.episode, "reasons": [e["reason"] for e in r.errors]}
            )
            continue
        windows += r.windows
        threads_by_role += r.threads_by_role
        segments += r.segments
    stats = window_stats(windows, dropped_blocks, errors, threads_by_role, length_cuts, method)
    stats.update(episodes=len(episodes), episodes_dropped=episodes_dropped, segments=segments, strict=sft.strict)
    return windows, stats


# what `window_stats` is given of a rendering, in its order
_RENDERED = ("dropped_blocks", "episode_errors", "threads_by_role", "length_cut_responses_dropped", "mask_method")


def window_stats(
    windows: list[Window],
    dropped: list[dict],
    errors: list[dict],
    threads_by_role: dict,
    length_cuts: int,
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


def composition_split(ranking: dict, comp, key: str = "rank manifest") -> dict[str, list[int]]:
    """The episode indices a task's rank manifest (at `key`) gives to `train` under the composition
    (its winners, or every ranked episode but the validation one) and to `val`."""
    return {
        "train": _episode_ids({"train": training_episodes(ranking, comp)}, "train", key),
        "val": _episode_ids(ranking, "val", key),
    }


def kept_windows(windows: list, comp) -> list:
    """The rendered windows the composition stores: those of its roles (the others are only counted)."""
    return [w for w in windows if keep_window(w, comp)]


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


def load_episode(ctx, gen: int, task, i: int) -> EpisodeTrace:

    raw = ctx.store.get_bytes(ctx.episode_file(gen, task.id, i, "trace.jsonl"))
    records, problems = parse_lines(raw.decode("utf-8", "replace"))
    if "\ufffd" in raw.decode("utf-8", "replace") and "\ufffd" not in raw.decode("utf-8", "ignore"):
        problems.append("the trace is not valid UTF-8")
    # collect stores the exact prompt it sent, its pieces and the harness in episode.json; else the trace holds the prompt
    doc_key = ctx.episode_file(gen, task.id, i, "episode.json")
    doc = ctx.store.get_json(doc_key) if ctx.store.exists(doc_key) else {}
    harness = doc.get("harness") or ctx.spec.execution.harness
    parts = doc.get("prompt_parts") or {}

    readable = not trace_problems(records, problems)
    return EpisodeTrace(
        task.id,
        i,
        records,
        bare_prompt=task.prompt.strip(),
        teacher_prompt=doc.get("prompt") or (teacher_prompt_from_trace(records, harness) if readable else None),
        harness=harness,
        strip_pieces=tuple(parts.get(k) or "" for k in ("workflow", "directive"))
        + tuple(parts.get("agent_rules") or ()),
        problems=tuple(problems),
    )


def sft_step(ctx, gen: int):
    """The render Step, its tasks and their train/val episode ids (the composition's: winners or all
    ranked episodes). The tokenizer enters the inputs as the location the spec names (not the local
    dir it was loaded from), so every executor computes the same hash."""

    comp = composition_of(ctx.spec.sft)
    ranked = [t for t in ctx.spec.train_tasks() if ctx.store.exists(ctx.rank(gen, t.id))]
    ranks = {t.id: ctx.store.get_json(ctx.rank(gen, t.id)) for t in ranked}
    tasks = [t for t in ranked if not ranks[t.id].get("skipped")]
    split_ids = {t.id: composition_split(ranks[t.id], comp, ctx.rank(gen, t.id)) for t in tasks}
    tokenizer = ctx.spec.model.tokenizer or (ctx.spec.model.base if gen == 0 else ctx.model(gen))
    # the roles kept enter the hash only when they differ from all, so the paper's runs keep theirs
    roles = {} if comp.roles == WINDOW_ROLES else {"roles": list(comp.roles)}
    step = Step(
        ctx.store,
        ctx.sft(gen),
        inputs={
            "episodes": split_ids,
            "sft": ctx.spec.sft.model_dump(
                mode="json", include={"window", "context", "cut", "strict", "keep_length_cut", "thread_roles"}
            ),
            "tokenizer": tokenizer,
            "prompts": {t.id: t.prompt for t in tasks},
            **roles,
        },
    )
    return step, tasks, split_ids


def render_step(ctx, gen: int):
    return sft_step(ctx, gen)[0]


def _summary(stats: dict, comp) -> dict:
    """The step manifest's `extra`: both splits' counts in one place."""
    train, val = stats["train"], stats["val"]
    return {
        "stored_supervised_tokens": train["stored_supervised_tokens"],
        "val_supervised_tokens": val["stored_supervised_tokens"],
        "windows": train["windows"],
        "windows_by_role": train["windows_by_role"],
        "val_windows": val["windows"],
        "dropped_blocks": len(train["dropped_blocks"]) + len(val["dropped_blocks"]),
        "mask_method": train["mask_method"],
        "episode_errors": len(train["episode_errors"]) + len(val["episode_errors"]),
        "episodes_dropped": len(train["episodes_dropped"]) + len(val["episodes_dropped"]),
        "composition": comp.to_dict(),
    }


def run_render(ctx, gen: int, tokenizer) -> dict:
    """Render every train task's ranked episodes into sft/{train,val}.jsonl + stats.json.

    Tasks without a rank manifest, or whose ranking was skipped (e.g. search never beat the bare
    reference), give no data.
    Returns the step manifest's `extra` (stored supervised tokens, window counts).
    """
    import tempfile
    from pathlib import Path

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
        out[split] = kept_windows(windows, comp)
        stats[split]["windows_left_out_by_role"] = {
            r: n - counts_by_role(out[split])[r] for r, n in counts_by_role(windows).items()
        }
        # the kept windows' counts, beside what rendering dropped
        stats[split].update(window_stats(out[split], *(stats[split][k] for k in _RENDERED)))
    if not out["train"]:
        dropped = stats["train"]["episodes_dropped"]
        why = (
            f"; {len(dropped)} episode(s) dropped under sft.strict, e.g. {dropped[0]['reasons'][0]}" if dropped else ""
        )
        ranked = sorted(t.id for t in ctx.spec.resolved_tasks() if ctx.store.exists(ctx.rank(gen, t.id)))
        raise RenderError(f"generation {gen}: no training windows (tasks with rank manifests: {ranked}){why}")
    keys = []
    with tempfile.TemporaryDirectory() as tmp:
        for split in ("train", "val"):
            path = Path(tmp) / f"{split}.jsonl"
            write_jsonl(path, out[split])
            keys.append(ctx.sft_file(gen, split))
            ctx.store.put_file(keys[-1], path)
    extra = _summary(stats, comp)
    keys.append(ctx.sft_file(gen, "stats"))
    ctx.store.put_json(keys[-1], {**stats, "summary": extra})
    step.finish(keys, extra=extra)
    return extra
