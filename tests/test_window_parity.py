"""Windows at parity with upstream's renderer: whole-turn cutting and the 90% header guard.

`make_windows` transcribes upstream's function of that name (training/prepare_sft_data.py) over the
blocks of each segment, split at `<|im_start|>` as upstream splits them (one block per turn;
consecutive tool results share one): the header is the blocks through the first user message, and
a thread whose header takes over 90% of the window is refused. Nothing here imports the product's
cutting; the product's windows come from `render_windows` on a recorded thread, the path `mass
render sft` takes. The grid forces cuts (every case has a segment longer than its window), holds
threads of one to three user queries, and contexts that overflow.
"""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from mass_jobs.config.run_spec import SftSpec
from mass_jobs.steps.render_sft import render_windows
from mass_jobs.steps.sft_threads import EpisodeTrace
from mass_jobs.steps.sft_tokens import IGNORE
from tests.fixtures.chat_templates import QWEN3_THINKING
from tests.fixtures.chat_templates import _first_messages_of_blocks as _blocks_of

THINKING = "<|im_start|>assistant\n<think>\n"
DENSE = "<|im_start|>assistant\n"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": n,
            "description": f"{n} a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for n in ("read_file", "write_file")
]
WORDS = "alpha beta gamma delta file output value check pass fail run test data".split()


def upstream_segments(tok, messages, tools, thinking: bool):
    """Per user query: (ids, mask, block spans, header end, query block or None)."""
    gen = tok(THINKING if thinking else DENSE, add_special_tokens=False)["input_ids"]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    think_end = tok.convert_tokens_to_ids("</think>")
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    out = []
    for n, q in enumerate(users):
        end = users[n + 1] if n + 1 < len(users) else len(messages)
        text = tok.apply_chat_template(messages[:end], tools=tools, tokenize=False)
        pieces = ["<|im_start|>" + p for p in text.split("<|im_start|>")[1:]]
        firsts = _blocks_of(messages[:end])
        ids, mask, spans = [], [], []
        for piece, a in zip(pieces, firsts):
            p = tok(piece, add_special_tokens=False)["input_ids"]
            m = [0] * len(p)
            if messages[a]["role"] == "assistant" and a > q:
                first = len(gen) if p[: len(gen)] == gen else p.index(think_end, len(gen) - 1)
                last = len(p) - 1 - p[::-1].index(im_end)
                m[first : last + 1] = [1] * (last + 1 - first)
            spans.append((len(ids), len(ids) + len(p)))
            ids += p
            mask += m
        first_user = firsts.index(users[0])
        qblock = firsts.index(q) if n > 0 else None
        if any(mask):
            out.append((ids, mask, spans, spans[first_user][1], qblock))
    return out


def make_windows(
    body: list[tuple[list[int], list[int]]], header: list[int], query: int | None, window: int, overlap: int
) -> list[tuple[list[int], list[int]]]:
    """A transcription of upstream's `make_windows` (training/prepare_sft_data.py), over one
    segment's blocks after the header, each (ids, mask): walk the loss-bearing blocks; before each,
    earlier blocks back while they fit `overlap`; the segment's query block, if not among them, put
    first on top of that; when the reply then overflows the window, no context but the query (if it
    fits beside the reply); a reply longer than the room is skipped; the window runs on over whole
    blocks while they fit and ends after the last loss-bearing one."""
    room = window - len(header)
    loss = [any(m) for _, m in body]
    size = [len(ids) for ids, _ in body]
    out, i = [], 0
    while i < len(body):
        if not loss[i]:
            i += 1
            continue
        ctx, used, j = [], 0, i - 1
        while j >= 0 and used + size[j] <= overlap:
            ctx.insert(0, j)
            used += size[j]
            j -= 1
        if query is not None and query < i and query not in ctx:
            ctx = [query] + [c for c in ctx if c > query]
            used = sum(size[c] for c in ctx)
        if size[i] > room - used:
            if size[i] > room:
                i += 1
                continue
            ctx = [query] if query is not None and query < i and size[query] + size[i] <= room else []
            used = sum(size[c] for c in ctx)
        k, total, last = i, 0, i
        while k < len(body) and total + size[k] <= room - used:
            total += size[k]
            last = k if loss[k] else last
            k += 1
        ids, labels = list(header), [IGNORE] * len(header)
        for c in ctx:
            ids += body[c][0]
            labels += [IGNORE] * size[c]
        for b in range(i, last + 1):
            ids += body[b][0]
            labels += [t if m else IGNORE for t, m in zip(*body[b])]
        out.append((ids, labels))
        i = last + 1
    return out


def upstream_windows(tok, messages, tools, window: int, context: int, thinking: bool):
    """[(input_ids, labels)] of the thread by upstream's rule, or None when its header is refused."""
    windows = []
    for ids, mask, spans, header, qblock in upstream_segments(tok, messages, tools, thinking):
        if header > 0.9 * window:
            return None
        first = next(b for b, (a, _) in enumerate(spans) if a >= header)
        body = [(ids[a:b], mask[a:b]) for a, b in spans[first:]]
        windows += make_windows(body, ids[:header], None if qblock is None else qblock - first, window, context)
    return windows


def thread(seed: int, thinking: bool, queries: int) -> list[dict]:
    """A worker thread: tool calls with outputs of random length, sometimes parallel, replies with
    reasoning under the thinking template, and `queries` user queries."""
    rng = random.Random(seed)
    say = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    msgs = [
        {"role": "system", "content": "You are the coder. " + say(rng.randint(5, 60))},
        {"role": "user", "content": "Task: " + say(rng.randint(5, 30))},
    ]
    for q in range(queries):
        if q:
            msgs.append({"role": "user", "content": "Next: " + say(rng.randint(3, 20))})
        for t in range(rng.randint(2, 6)):
            calls = [
                {
                    "id": f"c{q}{t}{k}",
                    "type": "function",
                    "function": {"name": rng.choice(["read_file", "write_file"]), "arguments": {"path": say(1)}},
                }
                for k in range(rng.choice([1, 1, 2]))
            ]
            reply = {"role": "assistant", "content": say(rng.randint(2, 25)), "tool_calls": calls}
            if thinking:
                reply["reasoning_content"] = say(rng.randint(0, 30))
            msgs.append(reply)
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": say(rng.randint(1, 120))} for c in calls]
        final = {"role": "assistant", "content": "Done: " + say(rng.randint(1, 10))}
        if thinking:
            final["reasoning_content"] = say(rng.randint(0, 10))
        msgs.append(final)
    return msgs


def as_trace(messages: list[dict]) -> list[dict]:
    return [
        {
            "seq": 0,
            "agent": None,
            "error": None,
            "request": {"model": "tiny", "messages": messages[:-1], "tools": TOOLS, "stream": False, "sampling": {}},
            "response": {"message": messages[-1], "finish_reason": "stop", "usage": {}},
        }
    ]


@pytest.fixture(scope="module", params=["dense", "thinking"])
def template(request, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if request.param == "thinking":
        tok.chat_template = QWEN3_THINKING
    return request.param == "thinking", tok


GRID = [(w, c) for w in (192, 256, 384, 640) for c in (0, 24, 96, 400)]


def test_windows_equal_upstreams_on_every_forced_cut_case(template):
    thinking, tok = template
    cases = refused = 0
    for seed in range(12):
        msgs = thread(seed, thinking, queries=1 + seed % 3)
        longest = max(len(ids) for ids, *_ in upstream_segments(tok, msgs, TOOLS, thinking))
        for window, context in GRID:
            if longest <= window:
                continue  # fits whole: no cut to compare
            cases += 1
            expected = upstream_windows(tok, msgs, TOOLS, window, context, thinking)
            windows, stats = render_windows(
                [EpisodeTrace("t", seed, as_trace(msgs), bare_prompt=msgs[1]["content"])],
                tok,
                SftSpec(window=window, context=context, strict=False),
            )
            if expected is None:
                refused += 1
                assert windows == [] and stats["threads_refused_header"] == 1, (seed, window, context)
                assert stats["episode_errors"][0]["kind"] == "header_over_window"
                continue
            got = [(w.input_ids, w.labels) for w in windows]
            assert len(got) == len(expected), (seed, window, context)
            assert got == expected, (seed, window, context)
            assert stats["threads_refused_header"] == 0
    print(f"{'thinking' if thinking else 'dense'}: {cases} forced-cut cases identical, {refused} refused threads")
    assert cases - refused >= 40 and refused >= 3  # the grid really cuts, and really refuses


def test_the_fit_option_is_another_rule_the_grid_tells_apart(template):
    """`sft.cut: fit` (the query inside the context budget, overflow keeping what fits) differs from
    upstream's on this grid: the parity above is not a property every whole-turn rule has."""
    thinking, tok = template
    differ = 0
    for seed in (1, 2, 4, 5):  # threads of two and three queries
        msgs = thread(seed, thinking, queries=1 + seed % 3)
        for window, context in GRID:
            expected = upstream_windows(tok, msgs, TOOLS, window, context, thinking)
            windows, _ = render_windows(
                [EpisodeTrace("t", seed, as_trace(msgs), bare_prompt=msgs[1]["content"])],
                tok,
                SftSpec(window=window, context=context, strict=False, cut="fit"),
            )
            differ += expected is not None and [(w.input_ids, w.labels) for w in windows] != expected
    assert differ >= 3, differ


def test_the_token_cut_option_starts_windows_mid_message_where_blocks_do_not(template):
    """`sft.cut: tokens` (the project's earlier rule, kept as an option) takes exactly `context`
    tokens, so a window can open inside a tool output; `blocks` never does."""
    thinking, tok = template
    msgs = thread(3, thinking, queries=1) + thread(4, thinking, queries=1)[2:] * 3
    start = tok.convert_tokens_to_ids("<|im_start|>")
    opens_mid = {}
    for cut in ("blocks", "tokens"):
        windows, _ = render_windows(
            [EpisodeTrace("t", 0, as_trace(msgs), bare_prompt=msgs[1]["content"])],
            tok,
            SftSpec(window=640, context=40, strict=False, cut=cut),
        )
        header = [p for p, t in enumerate(windows[0].input_ids) if t == start][2]  # system, task, then the body
        assert len(windows) >= 3
        opens_mid[cut] = sum(w.input_ids[header] != start for w in windows)
    assert opens_mid["blocks"] == 0 and opens_mid["tokens"] > 0
