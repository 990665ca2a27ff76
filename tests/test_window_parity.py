"""Windows at parity with upstream's renderer: whole-turn cutting and the 90% header guard.

`upstream_windows` restates upstream's rule from its behaviour, over the text of each segment split
at `<|im_start|>` (one block per turn; consecutive tool results share one): the header is the
blocks through the first user message, and a thread whose header takes over 90% of the window is
refused; a window holds the header, the segment's own query block when it is not in the context
and fits, then whole earlier blocks back from the reply's block while they fit `context` (the query
counting against it), then blocks up to the end of each further reply block that still fits.
Nothing here imports the product's cutting; the product's windows come from `render_windows` on a
recorded thread, the path `mass render sft` takes. The grid forces cuts: every case below has a
segment longer than its window.
"""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from mass_jobs.models import SftSpec
from mass_jobs.steps.sft_threads import EpisodeTrace
from mass_jobs.steps.render_sft import render_windows
from mass_jobs.steps.sft_tokens import IGNORE
from tests.fixtures.chat_templates import QWEN3_THINKING
from tests.fixtures.chat_templates import _first_messages_of_blocks as _blocks_of

THINKING = "<|im_start|>assistant\n<think>\n"
DENSE = "<|im_start|>assistant\n"
TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
         for n in ("read_file", "write_file")]
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


def upstream_windows(tok, messages, tools, window: int, context: int, thinking: bool):
    """[(input_ids, labels)] of the thread, or None when its header is refused."""
    windows = []
    for ids, mask, spans, header, qblock in upstream_segments(tok, messages, tools, thinking):
        if header > 0.9 * window:
            return None
        first_block = next(b for b, (a, _) in enumerate(spans) if a >= header)
        replies = [b for b in range(first_block, len(spans)) if any(mask[spans[b][0]:spans[b][1]])]
        size = lambda a, b: spans[b][1] - spans[a][0]  # noqa: E731  blocks a..b inclusive
        i = 0
        while i < len(replies):
            r = replies[i]
            room = window - header - size(r, r)
            if room < 0:
                i += 1
                continue

            def earliest(lowest: int, budget: int) -> int:
                c = r
                while c - 1 >= lowest and size(c - 1, r - 1) <= budget:
                    c -= 1
                return c

            c = earliest(first_block, min(context, room))
            lead = list(ids[:header])
            qlen = size(qblock, qblock) if qblock is not None else 0
            if qblock is not None and c > qblock and qlen <= room:
                lead += ids[spans[qblock][0]:spans[qblock][1]]
                c = earliest(qblock + 1, min(context, room) - qlen)
            j = i
            while j + 1 < len(replies) and len(lead) + size(c, replies[j + 1]) <= window:
                j += 1
            lo, hi = spans[c][0], spans[replies[j]][1]
            s = next(p for p in range(spans[r][0], hi) if mask[p])
            labels = [IGNORE] * len(lead) + [ids[p] if p >= s and mask[p] else IGNORE for p in range(lo, hi)]
            windows.append((lead + ids[lo:hi], labels))
            i = j + 1
    return windows


def thread(seed: int, thinking: bool, queries: int) -> list[dict]:
    """A worker thread: tool calls with outputs of random length, sometimes parallel, replies with
    reasoning under the thinking template, and `queries` user queries."""
    rng = random.Random(seed)
    say = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    msgs = [{"role": "system", "content": "You are the coder. " + say(rng.randint(5, 60))},
            {"role": "user", "content": "Task: " + say(rng.randint(5, 30))}]
    for q in range(queries):
        if q:
            msgs.append({"role": "user", "content": "Next: " + say(rng.randint(3, 20))})
        for t in range(rng.randint(2, 6)):
            calls = [{"id": f"c{q}{t}{k}", "type": "function",
                      "function": {"name": rng.choice(["read_file", "write_file"]), "arguments": {"path": say(1)}}}
                     for k in range(rng.choice([1, 1, 2]))]
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
    return [{"seq": 0, "agent": None, "error": None,
             "request": {"model": "tiny", "messages": messages[:-1], "tools": TOOLS, "stream": False, "sampling": {}},
             "response": {"message": messages[-1], "finish_reason": "stop", "usage": {}}}]


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
            windows, stats = render_windows([EpisodeTrace("t", seed, as_trace(msgs), bare_prompt=msgs[1]["content"])],
                                            tok, SftSpec(window=window, context=context, strict=False))
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


def test_the_token_cut_option_starts_windows_mid_message_where_blocks_do_not(template):
    """`sft.cut: tokens` (the project's earlier rule, kept as an option) takes exactly `context`
    tokens, so a window can open inside a tool output; `blocks` never does."""
    thinking, tok = template
    msgs = thread(3, thinking, queries=1) + thread(4, thinking, queries=1)[2:] * 3
    start = tok.convert_tokens_to_ids("<|im_start|>")
    opens_mid = {}
    for cut in ("blocks", "tokens"):
        windows, _ = render_windows([EpisodeTrace("t", 0, as_trace(msgs), bare_prompt=msgs[1]["content"])], tok,
                                    SftSpec(window=640, context=40, strict=False, cut=cut))
        header = [p for p, t in enumerate(windows[0].input_ids) if t == start][2]  # system, task, then the body
        assert len(windows) >= 3
        opens_mid[cut] = sum(w.input_ids[header] != start for w in windows)
    assert opens_mid["blocks"] == 0 and opens_mid["tokens"] > 0
