"""Render step: threads from trace lines, roles, teacher-prompt stripping, masks and windows."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from transformers import AutoTokenizer

from mass_jobs.config.run_spec import SftSpec
from mass_jobs.steps.render_sft import render_windows
from mass_jobs.steps.sft_threads import EpisodeTrace, rebuild_threads, teacher_prompt_from_trace
from mass_jobs.steps.sft_tokens import (
    IGNORE,
    MASK_BY_INCREMENTS,
    MASK_BY_MARKERS,
    RenderError,
    cut_windows,
    mask_method,
    render_segments,
    tokenize_conversation,
    turn_opener,
)
from mass_jobs.tiny.build import CHAT_TEMPLATE
from tests.fixtures.chat_templates import QWEN3_THINKING, QWEN3_THINKING_MARKED, upstream_segment_masks
from tests.fixtures.sft_episodes import (
    ASSIGNMENT,
    BARE,
    DIRECTIVE,
    ENV,
    GOT_IT,
    ORCH_TOOLS,
    QWEN_SYSTEM,
    TEACHER,
    WORKER_TOOLS,
    WORKFLOW,
    call,
    qwen_code_episode,
    tc,
    teacher_episode,
)

SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "sft-window.schema.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def without_markers(template: str) -> str:
    """The same template as a stock hub one ships it: no {% generation %} markers."""
    out = template.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    assert "endgeneration" not in out and "{%- generation" not in out
    return out


def with_template(tiny_model_dir, template: str):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def unmarked(tiny_model_dir):
    return with_template(tiny_model_dir, without_markers(CHAT_TEMPLATE))


@pytest.mark.parametrize("with_agent", [False, True], ids=["roles-from-tools", "roles-from-agent-field"])
def test_threads_and_roles(with_agent):
    threads = rebuild_threads(teacher_episode(with_agent))
    assert [t.role for t in threads] == ["orchestrator", "worker", "auxiliary"]
    orch = threads[0]
    assert len(orch.calls) == 2 and len(orch.messages) == 5
    # the recorded response restores the reasoning the harness dropped from history
    assert orch.messages[2]["reasoning_content"] == "I should delegate."
    assert orch.messages[-1]["content"] == "Done: report and code are in place."


def test_call_not_extending_starts_new_thread_and_length_cut_is_dropped():
    recs = teacher_episode()
    other = call(
        5,
        [{"role": "system", "content": "You are the orchestrator."}, {"role": "user", "content": "x"}],
        ORCH_TOOLS,
        {"role": "assistant", "content": "half a thou"},
        finish="length",
    )
    threads = rebuild_threads(recs + [other])
    assert len(threads) == 4
    assert threads[-1].dropped_length_cut and threads[-1].messages[-1]["role"] == "user"
    # sft.keep_length_cut (smoke runs: an untrained model's every reply is cut) keeps the cut reply
    kept = rebuild_threads(recs + [other], keep_length_cut=True)[-1]
    assert not kept.dropped_length_cut and kept.messages[-1] == {"role": "assistant", "content": "half a thou"}


def test_mask_covers_exactly_assistant_tokens(tokenizer):
    t = rebuild_threads(teacher_episode())[1]  # the worker
    ids, mask, header = tokenize_conversation(tokenizer, t.messages, t.tools)
    supervised = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert "primes.py written" in supervised and "write_file" in supervised
    assert ASSIGNMENT not in supervised and "ok" not in supervised.replace("primes.py written", "")
    head_text = tokenizer.decode(ids[:header])
    assert head_text.rstrip().endswith(ASSIGNMENT + "<|im_end|>") and "write_file" in head_text
    assert not any(mask[:header])


def test_render_strips_teacher_prompt_only_for_orchestrator(tokenizer):
    ep = EpisodeTrace("primes", 0, teacher_episode(), bare_prompt=BARE, teacher_prompt=TEACHER)
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=512, context=64))
    assert stats["windows_by_role"] == {"orchestrator": 1, "worker": 1, "auxiliary": 1}
    assert stats["teacher_prompt_not_found"] == []
    texts = {w.role: tokenizer.decode(w.input_ids) for w in windows}
    assert BARE in texts["orchestrator"] and WORKFLOW not in texts["orchestrator"]
    assert DIRECTIVE not in texts["orchestrator"]
    assert ASSIGNMENT in texts["worker"]  # concrete assignments stay
    assert stats["stored_supervised_tokens"] == sum(w.n_supervised for w in windows)
    for w in windows:
        rec = w.record()
        jsonschema.validate(rec, SCHEMA)
        assert len(rec["labels"]) == len(rec["input_ids"])


def long_conversation(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are the coder."}, {"role": "user", "content": ASSIGNMENT}]
    for k in range(turns):
        msgs.append(
            {
                "role": "assistant",
                "content": f"step {k}: " + "the quick brown fox " * 4,
                "tool_calls": [tc(f"t{k}", "read_file", {"path": f"f{k}.txt"})],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"t{k}", "content": "lazy dog " * 6})
    msgs.append({"role": "assistant", "content": "finished"})
    return msgs


@pytest.mark.parametrize("marked", [True, False], ids=["markers", "incremental"])
@pytest.mark.parametrize("window,context", [(512, 64), (512, 0), (400, 128)], ids=lambda v: str(v))
def test_windows_train_every_assistant_token_once(tokenizer, unmarked, marked, window, context):
    tokenizer = tokenizer if marked else unmarked
    msgs = long_conversation(40)
    ids, mask, header = tokenize_conversation(tokenizer, msgs, WORKER_TOOLS)
    assert len(ids) > 3 * window  # the conversation really has to be cut
    opener = turn_opener(tokenizer)
    assert tokenizer.decode(opener) == "<|im_start|>assistant\n"
    pieces, dropped = cut_windows(ids, mask, header, window, context, opener)
    assert dropped == [] and len(pieces) >= 3
    trained = [0] * len(ids)
    for win_ids, labels in pieces:
        assert len(win_ids) <= window and win_ids[:header] == ids[:header]
        assert all(x == IGNORE for x in labels[:header])
        # locate the body in the conversation: it is a contiguous slice after the header
        body = win_ids[header:]
        start = next(c for c in range(header, len(ids)) if ids[c : c + len(body)] == body)
        first_sup = next(k for k, x in enumerate(labels[header:]) if x != IGNORE)
        # the reply's turn opener always precedes it, plus at most `context` tokens of earlier context
        assert body[first_sup - len(opener) : first_sup] == opener
        assert first_sup <= context + len(opener)
        for k, lab in enumerate(labels[header:]):
            if lab != IGNORE:
                assert lab == ids[start + k] and mask[start + k]
                trained[start + k] += 1
    assert [trained[i] for i in range(len(ids)) if mask[i]] == [1] * sum(mask)


def test_oversized_block_drops_its_episode_under_strict_and_only_itself_without(tokenizer):
    huge = {"role": "assistant", "content": "the quick brown fox jumps " * 80}
    recs = [
        call(0, [{"role": "user", "content": "go"}], None, huge),
        call(1, [{"role": "user", "content": "and?"}], None, {"role": "assistant", "content": "short"}),
    ]
    ep = EpisodeTrace("t", 0, recs, bare_prompt="go")
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=128, context=0, strict=False))
    assert len(windows) == 1 and len(stats["dropped_blocks"]) == 1 and stats["episodes_dropped"] == []
    assert stats["dropped_supervised_tokens"] > 128
    assert [e["kind"] for e in stats["episode_errors"]] == ["reply_too_long"]
    assert SftSpec().strict  # upstream's --strict is the default: the whole episode goes, with the reason
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=128, context=0))
    assert windows == [] and stats["windows"] == 0 and len(stats["dropped_blocks"]) == 1
    [dropped] = stats["episodes_dropped"]
    assert dropped["episode"] == 0 and "1 reply block(s) cannot fit sft.window=128" in dropped["reasons"][0]


def test_tokenizer_without_chat_template_is_an_error(tiny_model_dir):
    plain = with_template(tiny_model_dir, None)
    ep = EpisodeTrace("t", 0, teacher_episode(), bare_prompt=BARE)
    with pytest.raises(RenderError, match="no chat_template"):
        render_windows([ep], plain, SftSpec(window=256, context=0))


def multi_user_conversation() -> list[dict]:
    """Reasoning in several turns around two user messages (templates drop the first turns' reasoning),
    a reply starting with a newline, parallel tool calls with consecutive tool results."""
    return [
        {"role": "system", "content": "You are the coder."},
        {"role": "user", "content": ASSIGNMENT},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Plan: list the folder first.",
            "tool_calls": [tc("a", "read_file", {"path": "a.txt"}), tc("b", "read_file", {"path": "b.txt"})],
        },
        {"role": "tool", "tool_call_id": "a", "content": "alpha"},
        {"role": "tool", "tool_call_id": "b", "content": "beta"},
        {"role": "assistant", "content": "\nBoth files read.", "reasoning_content": "Both are short."},
        {"role": "user", "content": "Now write primes.py too."},
        {"role": "assistant", "content": "", "tool_calls": [tc("c", "write_file", {"path": "primes.py"})]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Verify the write.",
            "tool_calls": [tc("d", "read_file", {"path": "primes.py"})],
        },
        {"role": "tool", "tool_call_id": "d", "content": "print(2, 3, 5)"},
        {"role": "assistant", "content": "primes.py written and checked."},
    ]


def conversations() -> list[tuple[list[dict], list | None]]:
    convs = [(t.messages, t.tools) for t in rebuild_threads(teacher_episode())]  # orchestrator, worker, auxiliary
    return convs + [
        (long_conversation(12), WORKER_TOOLS),
        (multi_user_conversation(), WORKER_TOOLS),
        (multi_user_conversation(), None),
    ]


def test_incremental_masks_equal_marker_masks_token_for_token(tokenizer, unmarked):
    assert (mask_method(tokenizer), mask_method(unmarked)) == (MASK_BY_MARKERS, MASK_BY_INCREMENTS)
    for messages, tools in conversations():
        ids, mask, header = tokenize_conversation(tokenizer, messages, tools)
        ids_u, mask_u, header_u = tokenize_conversation(unmarked, messages, tools)
        assert ids_u == ids and mask_u == mask and header_u == header
        turns = sum(m["role"] == "assistant" for m in messages)
        # one supervised run per reply, each ending on the end-of-turn token
        runs = _runs(mask)
        assert (
            turns >= 1 and len(runs) == turns and all(tokenizer.decode(ids[e - 1 : e]) == "<|im_end|>" for _, e in runs)
        )
    # the tiny template (like Qwen3) drops reasoning before the last user message: the alignment path
    ids, mask, _ = tokenize_conversation(unmarked, *conversations()[-2])
    supervised = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "Plan: list" not in tokenizer.decode(ids) and "Verify the write." in supervised
    assert "Both files read." in supervised and "alpha" not in supervised and "write primes.py too" not in supervised


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    out, s = [], None
    for i, x in enumerate(mask + [0]):
        if x and s is None:
            s = i
        elif not x and s is not None:
            out.append((s, i))
            s = None
    return out


def test_render_windows_identical_with_and_without_markers(tokenizer, unmarked):
    long_recs = [call(0, long_conversation(30)[:-1], WORKER_TOOLS, long_conversation(30)[-1])]
    eps = [
        EpisodeTrace("primes", 0, teacher_episode(), bare_prompt=BARE, teacher_prompt=TEACHER),
        EpisodeTrace("long", 1, long_recs, bare_prompt=ASSIGNMENT),
        EpisodeTrace(
            "multi",
            2,
            [call(0, multi_user_conversation()[:-1], WORKER_TOOLS, multi_user_conversation()[-1])],
            bare_prompt=ASSIGNMENT,
        ),
    ]
    sft = SftSpec(window=384, context=48)
    marked_w, marked_s = render_windows(eps, tokenizer, sft)
    plain_w, plain_s = render_windows(eps, unmarked, sft)
    assert (marked_s.pop("mask_method"), plain_s.pop("mask_method")) == (MASK_BY_MARKERS, MASK_BY_INCREMENTS)
    assert plain_s == marked_s and marked_s["dropped_blocks"] == [] and len(marked_w) >= 6
    assert [w.record() for w in plain_w] == [w.record() for w in marked_w]


# A Qwen3-style template: reasoning only for replies after the last real user message (tool results
# do not count), an empty think block on the final reply, content left-stripped after </think>.
# The markers make transformers' own assistant mask the reference for the marker-free copy.
QWEN3_LIKE = r"""
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' and not m.content.startswith('<tool_response>') -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n<tools>' -}}{%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}{{- '\n</tools><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set content = m.content or '' -%}
    {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- generation -%}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
      {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
    {%- else -%}
      {{- content -}}
    {%- endif -%}
    {%- for tc in (m.tool_calls or []) -%}
      {%- set args = tc.function.arguments -%}
      {%- if (loop.first and content) or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": "' + tc.function.name + '", "arguments": ' -}}
      {{- (args if args is string else args | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>' -}}
    {%- endgeneration -%}
    {{- '\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_qwen3_like_template_masks_exactly_the_final_renderings_replies(tiny_model_dir, with_tools):
    ref = with_template(tiny_model_dir, QWEN3_LIKE)
    stock = with_template(tiny_model_dir, without_markers(QWEN3_LIKE))
    assert mask_method(stock) == MASK_BY_INCREMENTS
    tools = WORKER_TOOLS if with_tools else None
    messages = multi_user_conversation()
    ids, mask, _ = tokenize_conversation(stock, messages, tools)
    ref_ids, ref_mask, _ = tokenize_conversation(ref, messages, tools)
    assert ids == ref_ids and mask == ref_mask
    text = stock.decode(ids)
    # what this template does to the history: the first turns lose their reasoning, and the reply
    # after the last user message without reasoning has no think block (it has one only when last)
    assert "Plan: list" not in text and "Both are short." not in text and text.count("<think>") == 2
    runs = _runs(mask)
    replies = [stock.decode(ids[s:e]) for s, e in runs]
    assert len(replies) == 5 and all(r.endswith("<|im_end|>") for r in replies)
    assert all(
        stock.decode(ids[:s]).endswith(("<|im_start|>assistant\n", "<|im_start|>assistant\n\n")) for s, _ in runs
    )
    # a reply starting with a newline: the "\n\n" token merging it with the opener is context (it starts
    # in the prompt), as in upstream's masks; the markers path applies the same rule
    assert replies[0].startswith("<tool_call>") and replies[1] == "Both files read.<|im_end|>"
    assert stock.decode(ids[runs[1][0] - 1 : runs[1][0]]) == "\n\n"
    assert replies[2].startswith("<tool_call>") and "write_file" in replies[2]
    assert replies[3].startswith("<think>\nVerify the write.\n</think>\n\nChecking.\n<tool_call>")
    assert replies[4] == "<think>\n\n</think>\n\nprimes.py written and checked.<|im_end|>"
    # everything outside the replies is masked: prompts, tool results, openers, newlines between turns
    assert "".join(replies) == stock.decode([t for t, m in zip(ids, mask) if m])
    assert sum(mask) == sum(e - s for s, e in runs)
    # two replies in a row: the first one's rendering changes once it is no longer last (its empty
    # think block goes), so the second reply is taken after its opener
    twice = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Looking."},
        {"role": "assistant", "content": "Done.", "reasoning_content": "All good."},
    ]
    ids, mask, _ = tokenize_conversation(stock, twice, tools)
    assert (ids, mask) == tokenize_conversation(ref, twice, tools)[:2]
    assert [stock.decode(ids[s:e]) for s, e in _runs(mask)] == [
        "Looking.<|im_end|>",
        "<think>\nAll good.\n</think>\n\nDone.<|im_end|>",
    ]


def test_template_that_rewrites_earlier_replies_is_an_episode_error_naming_thread_and_turn(tiny_model_dir):
    shouting = without_markers(CHAT_TEMPLATE).replace(
        "{{- content -}}", "{%- if loop.last -%}{{- content -}}{%- else -%}{{- content | upper -}}{%- endif -%}"
    )
    assert shouting != without_markers(CHAT_TEMPLATE)
    tok = with_template(tiny_model_dir, shouting)
    u = {"role": "user", "content": "go"}
    a1, a2 = {"role": "assistant", "content": "first reply"}, {"role": "assistant", "content": "second reply"}
    recs = [call(0, [u], None, a1), call(1, [u, a1], None, a2)]  # two replies to one query
    ep = EpisodeTrace("t", 4, recs, bare_prompt="go")
    windows, stats = render_windows([ep], tok, SftSpec(window=256, context=0))
    assert windows == [] and [d["episode"] for d in stats["episodes_dropped"]] == [4]
    [err] = stats["episode_errors"]
    assert err["kind"] == "thread_not_renderable" and err["thread"] == 0
    assert err["reason"].startswith("thread 0 (auxiliary): segment 0 (message 0): assistant turn 0 (message 1): ")


def test_render_step_over_the_store(tokenizer, tmp_path):
    import yaml

    from mass_jobs.run.context import RunContext
    from mass_jobs.spec.load import load_spec
    from mass_jobs.steps.render_sft import read_jsonl, run_render
    from mass_jobs.store import open_store, read_manifest

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {
                "name": "r",
                "model": {"base": str(tmp_path)},
                "tasks": [
                    {"id": "primes", "split": "train", "prompt": BARE},
                    {"id": "skipped", "split": "train", "prompt": "never beat the reference"},
                ],
                "collection": {"episodes": 4, "train_ranks": 3, "validation_rank": 4},
                "ranking": {"comparisons_per_episode": 1},
                "sft": {"window": 512, "context": 64},
                "store": {"uri": f"file://{tmp_path / 'store'}"},
            }
        )
    )
    ctx = RunContext(load_spec(spec_path), open_store(f"file://{tmp_path / 'store'}"))
    ctx.store.put_json(ctx.rank(0, "skipped"), {"task": "skipped", "skipped": True, "train": [], "val": None})
    doc = {"prompt": TEACHER, "prompt_parts": {"task": BARE, "workflow": WORKFLOW, "directive": DIRECTIVE}}
    for i, records in enumerate([teacher_episode(), teacher_episode(), qwen_code_episode(), qwen_code_episode("?")]):
        base = ctx.collect_episode(0, "primes", i)
        ctx.store.put_bytes(f"{base}/trace.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())
        ctx.store.put_json(f"{base}/episode.json", {**doc, "harness": "builtin" if i < 2 else "qwen-code"})
    ctx.store.put_json(ctx.rank(0, "primes"), {"task": "primes", "train": ["ep-0", "ep-2", "ep-3"], "val": "ep-1"})
    extra = run_render(ctx, 0, tokenizer)
    train = read_jsonl(tmp_path / "store" / "r/gen-0/sft/train.jsonl")
    val = read_jsonl(tmp_path / "store" / "r/gen-0/sft/val.jsonl")
    # ep-2 is a qwen-code episode (its harness from episode.json); ep-3's prompt was never sent: dropped
    assert len(train) == 7 and len(val) == 3 and {w["episode"] for w in train} == {0, 2}
    assert extra["stored_supervised_tokens"] == sum(w["n_supervised"] for w in train)
    assert extra["mask_method"] == MASK_BY_MARKERS
    assert extra["windows_by_role"] == {"orchestrator": 3, "worker": 3, "auxiliary": 1}
    assert (extra["episode_errors"], extra["episodes_dropped"]) == (1, 1)
    stats = ctx.store.get_json("r/gen-0/sft/stats.json")
    assert [(d["episode"], d["reasons"][0][:40]) for d in stats["train"]["episodes_dropped"]] == [
        (3, "no orchestrator thread carries the teach")
    ]
    assert stats["train"]["strict"] is True and stats["val"]["episode_errors"] == []
    # the report counts them per generation
    from mass_jobs.steps.report import build_report
    from mass_jobs.steps.report_render import render_markdown

    doc = build_report(ctx)
    assert doc["sft"] == [
        {
            "generation": 0,
            "episodes": 4,
            "episode_errors": 1,
            "episodes_dropped": 1,
            "orchestrator_windows": 3,
            "windows_by_role": {"orchestrator": 3, "worker": 3, "auxiliary": 1},
            "supervised_by_role": {"orchestrator": 160, "worker": 88, "auxiliary": 6},
        }
    ]
    assert "| L0 | 4 | 1 | 1 | 3 |" in render_markdown(doc)
    manifest = read_manifest(ctx.store, "r/gen-0/sft")
    assert manifest["extra"]["stored_supervised_tokens"] == extra["stored_supervised_tokens"]
    assert set(manifest["outputs"]) == {f"r/gen-0/sft/{n}" for n in ("train.jsonl", "val.jsonl", "stats.json")}
    orch = next(w for w in train if w["role"] == "orchestrator")
    assert WORKFLOW not in tokenizer.decode(orch["input_ids"])
    assert run_render(ctx, 0, tokenizer) == extra  # done: skipped on rerun
    # every sft field render reads is in its input hash: another cut or window is another render
    from mass_jobs.steps.render_sft import sft_step

    assert sft_step(ctx, 0)[0].done
    for change in ({"cut": "tokens"}, {"window": 1024}, {"context": 32}, {"strict": False}, {"keep_length_cut": True}):
        other = RunContext(ctx.spec.model_copy(update={"sft": ctx.spec.sft.model_copy(update=change)}), ctx.store)
        assert not sft_step(other, 0)[0].done, change


# ---------------------------------------------------------------- multi-query threads (qwen-code's shape)


def multi_query_thread() -> list[dict]:
    """system, user (environment context), assistant (the harness's canned reply), user (task), ..., a
    follow-up query; reasoning in every segment, parallel tool results, an empty reasoning at the end."""
    return [
        {"role": "system", "content": QWEN_SYSTEM},
        {"role": "user", "content": ENV},
        {"role": "assistant", "content": GOT_IT},
        {"role": "user", "content": BARE},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Plan A: delegate the code.",
            "tool_calls": [tc("a", "read_file", {"path": "a.txt"})],
        },
        {"role": "tool", "tool_call_id": "a", "content": "alpha"},
        {"role": "assistant", "content": "Part one done.", "reasoning_content": "Check B: alpha read."},
        {"role": "user", "content": "Now add tests."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Tests C: two files.",
            "tool_calls": [tc("b", "write_file", {"path": "t1.py"}), tc("c", "write_file", {"path": "t2.py"})],
        },
        {"role": "tool", "tool_call_id": "b", "content": "ok"},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"role": "assistant", "content": "\nAll done."},
    ]


@pytest.mark.parametrize("marked", [False, True], ids=["stock", "markers"])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_thinking_template_multi_query_masks_equal_upstreams_per_segment_rule(tiny_model_dir, marked, with_tools):
    tok = with_template(tiny_model_dir, QWEN3_THINKING_MARKED if marked else QWEN3_THINKING)
    assert mask_method(tok) == (MASK_BY_MARKERS if marked else MASK_BY_INCREMENTS)
    tools = WORKER_TOOLS if with_tools else None
    messages = multi_query_thread()
    segments = render_segments(tok, messages, tools)
    reference = upstream_segment_masks(tok, messages, tools)
    assert [s.index for s in segments] == [0, 1, 2]
    assert [(s.ids, s.mask) for s in segments] == reference
    supervised = [tok.decode([t for t, m in zip(s.ids, s.mask) if m]) for s in segments]
    # each segment trains its own replies with their own reasoning, and nothing else
    assert supervised[0] == f"</think>\n\n{GOT_IT}<|im_end|>"  # empty reasoning: the merged "\n\n" is context
    assert supervised[1].startswith("Plan A: delegate the code.\n</think>\n\n<tool_call>")
    assert "Check B: alpha read.\n</think>\n\nPart one done.<|im_end|>" in supervised[1] and GOT_IT not in supervised[1]
    assert supervised[2].startswith("Tests C: two files.") and supervised[2].endswith("</think>\n\nAll done.<|im_end|>")
    assert "Part one done" not in supervised[2]
    # the context is the one each reply was generated in: earlier segments' reasoning is gone
    last = tok.decode(segments[2].ids)
    assert "Plan A" not in last and "Check B" not in last and "Part one done." in last
    # the segment's own query is located for the windows; segment 0's is in the header
    assert segments[0].query is None
    for s, text in ((1, BARE), (2, "Now add tests.")):
        qa, qb = segments[s].query
        assert tok.decode(segments[s].ids[qa:qb]) == f"<|im_start|>user\n{text}<|im_end|>\n"
        assert segments[s].header <= qa and not any(segments[s].mask[:qb])
    header = tok.decode(segments[1].ids[: segments[1].header])
    assert header.endswith(f"<|im_start|>user\n{ENV}<|im_end|>\n") and all(
        s.header == segments[0].header for s in segments
    )


def test_thinking_template_whole_thread_rendering_cannot_align_but_segments_can(tiny_model_dir):
    # Rendering the whole thread at once (as before) loses the think openers of earlier segments.
    tok = with_template(tiny_model_dir, QWEN3_THINKING)
    with pytest.raises(RenderError, match="cannot be aligned"):
        tokenize_conversation(tok, multi_query_thread(), WORKER_TOOLS)
    msgs = multi_query_thread()
    recs = [call(0, msgs[:-1], WORKER_TOOLS, msgs[-1])]
    windows, stats = render_windows(
        [EpisodeTrace("t", 0, recs, bare_prompt=BARE)], tok, SftSpec(window=4096, context=0)
    )
    assert stats["episode_errors"] == [] and stats["segments"] == 3 and len(windows) == 3
    reference = upstream_segment_masks(tok, msgs, WORKER_TOOLS)
    for w, (ids, mask), query in zip(windows, reference, [None, BARE, "Now add tests."]):
        assert [lab for lab in w.labels if lab != IGNORE] == [t for t, m in zip(ids, mask) if m]
        text = tok.decode(w.input_ids)
        assert text.startswith(f"<|im_start|>system\n{QWEN_SYSTEM}") and ENV in text
        if query:  # context=0, yet each later segment's window shows the query its replies answer
            assert f"<|im_start|>user\n{query}<|im_end|>" in text and GOT_IT not in text


@pytest.mark.parametrize("cut,context", [("tokens", 48), ("blocks", 96)])
def test_segment_query_is_kept_within_the_context_budget(tokenizer, cut, context):
    msgs = [
        {"role": "system", "content": "You are the coder."},
        {"role": "user", "content": "Context: /ws"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": ASSIGNMENT},
    ]
    msgs += long_conversation(20)[2:]
    [_, seg] = render_segments(tokenizer, msgs, WORKER_TOOLS)
    qa, qb = seg.query
    opener = turn_opener(tokenizer)
    pieces, dropped = cut_windows(seg.ids, seg.mask, seg.header, 400, context, opener, seg.query, cut)
    assert dropped == [] and len(pieces) >= 3
    trained = separate = 0
    for win_ids, labels in pieces:
        assert len(win_ids) <= 400 and win_ids[: seg.header] == seg.ids[: seg.header]
        # every window shows the query before its replies; other earlier context stays within the budget
        first_sup = next(k for k, lab in enumerate(labels) if lab != IGNORE)
        body, query = win_ids[seg.header : first_sup], seg.ids[qa:qb]
        assert any(body[k : k + len(query)] == query for k in range(len(body)))
        assert len(body) <= max(context, len(query)) + len(opener)  # the query counts against the context budget
        if cut == "blocks":  # the query and the context are whole turns: each opens a turn
            assert body[0] == opener[0]
            if body[: len(query)] == query:
                assert body[len(query)] == opener[0]
        separate += body[: len(query)] == query and len(body) > len(query) + len(opener)
        trained += sum(lab != IGNORE for lab in labels)
    assert trained == sum(seg.mask) and separate >= 2  # later windows put the query in apart from the context


# ---------------------------------------------------------------- orchestrator detection and strict stripping


def decoded(tok, windows) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in windows:
        out.setdefault(w.role, []).append(tok.decode(w.input_ids))
    return out


def test_headerless_thread_offered_the_harness_delegation_tool_is_the_orchestrator(tokenizer):
    recs = qwen_code_episode()
    assert [t.role for t in rebuild_threads(recs, "qwen-code")] == ["orchestrator", "worker"]
    ep = EpisodeTrace(
        "primes",
        0,
        recs,
        bare_prompt=BARE,
        teacher_prompt=TEACHER,
        harness="qwen-code",
        strip_pieces=(WORKFLOW, DIRECTIVE),
    )
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=1024, context=64))
    assert stats["episode_errors"] == [] and stats["threads_by_role"] == {
        "orchestrator": 1,
        "worker": 1,
        "auxiliary": 0,
    }
    # two segments per thread (environment context, then the task): the canned reply and the real ones
    assert stats["segments"] == 4 and stats["windows_by_role"] == {"orchestrator": 2, "worker": 2, "auxiliary": 0}
    texts = decoded(tokenizer, windows)
    assert all(WORKFLOW not in t and DIRECTIVE not in t for ts in texts.values() for t in ts)
    assert BARE in texts["orchestrator"][1] and ASSIGNMENT in texts["worker"][1]


def test_teacher_prompt_from_trace_is_the_orchestrators_latest_query_of_its_first_call():
    # only when episode.json lacks the prompt: qwen-code's first user message is its environment context
    assert teacher_prompt_from_trace(qwen_code_episode(), "qwen-code") == TEACHER
    assert teacher_prompt_from_trace(teacher_episode(with_agent=True)) == TEACHER
    assert teacher_prompt_from_trace(qwen_code_episode(), "builtin") is None


def test_unstrippable_teacher_prompt_drops_the_episode_under_strict_and_never_reaches_a_window(tokenizer):
    recs = qwen_code_episode()
    # The table of the wrong harness: `agent` delegates nothing, so the main session looks like a worker.
    wrong = EpisodeTrace(
        "primes",
        0,
        recs,
        bare_prompt=BARE,
        teacher_prompt=TEACHER,
        harness="builtin",
        strip_pieces=(WORKFLOW, DIRECTIVE),
    )
    windows, stats = render_windows([wrong], tokenizer, SftSpec(window=1024, context=64))
    assert windows == [] and [d["episode"] for d in stats["episodes_dropped"]] == [0]
    assert [e["kind"] for e in stats["episode_errors"]] == ["teacher_prompt_not_found", "teacher_prompt_left"]
    assert stats["teacher_prompt_not_found"][0]["reason"].endswith(
        "threads {0: worker, 1: worker} under harness builtin"
    )
    assert "thread 0 (worker) message 3 still holds" in stats["episode_errors"][1]["reason"]
    # without strict only the sub-agent's windows stay: the workflow is in no window either way
    windows, stats = render_windows([wrong], tokenizer, SftSpec(window=1024, context=64, strict=False))
    assert {w.thread for w in windows} == {1} and stats["episodes_dropped"] == [] and len(stats["episode_errors"]) == 2
    assert not any(WORKFLOW in t or DIRECTIVE in t for ts in decoded(tokenizer, windows).values() for t in ts)
    # a harness that rewrote the workflow itself: nothing can be stripped, the orchestrator is left out
    altered = TEACHER.replace("primes.py", "primes .py")
    ep = EpisodeTrace(
        "primes",
        1,
        qwen_code_episode(altered),
        bare_prompt=BARE,
        teacher_prompt=TEACHER,
        harness="qwen-code",
        strip_pieces=(WORKFLOW, DIRECTIVE),
    )
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=1024, context=64, strict=False))
    assert [e["kind"] for e in stats["episode_errors"]] == ["teacher_prompt_not_found"]
    assert {w.role for w in windows} == {"worker"} and stats["threads_by_role"]["orchestrator"] == 0
    assert render_windows([ep], tokenizer, SftSpec(window=1024, context=64))[0] == []


def test_workflow_and_directive_are_removed_when_the_harness_changed_the_task_text(tokenizer):
    # qwen-code trims the prompt and spaces out unresolved @-paths in the task; the pieces are intact.
    sent = TEACHER.replace("prime numbers.", "prime numbers @k.") + "\n"
    ep = EpisodeTrace(
        "primes",
        0,
        qwen_code_episode(sent),
        bare_prompt=BARE,
        teacher_prompt=TEACHER,
        harness="qwen-code",
        strip_pieces=(WORKFLOW, DIRECTIVE),
    )
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=1024, context=64))
    assert stats["episode_errors"] == [] and stats["windows_by_role"]["orchestrator"] == 2
    orch = decoded(tokenizer, windows)["orchestrator"][1]
    assert "Build a tiny report on prime numbers @k.\n<|im_end|>" in orch and "Workflow" not in orch
    # without the pieces (an episode.json from before they were stored) only the exact prompt can be found
    bare_only = EpisodeTrace(
        "primes", 0, qwen_code_episode(sent), bare_prompt=BARE, teacher_prompt=TEACHER, harness="qwen-code"
    )
    assert render_windows([bare_only], tokenizer, SftSpec(window=1024, context=64))[1]["episodes_dropped"]


def test_real_builtin_episode_renders_with_the_orchestrator_stripped(scripted_endpoint, tmp_path, tokenizer):
    from mass_jobs.config.run_spec import EpisodeLimits, Sampling
    from mass_jobs.episodes.harness import EpisodeInput, run_episode
    from mass_jobs.serving.proxy import read_trace
    from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, teacher_prompt_parts
    from mass_jobs.tools.testing.scripted_endpoint import Reply

    parts = teacher_prompt_parts(BARE, DEFAULT_WORKFLOW)
    ep = scripted_endpoint(
        {
            "orchestrator": [
                Reply(
                    reasoning="A coder writes it.",
                    tool_calls=[
                        {
                            "name": "delegate",
                            "arguments": {"agent_id": "coder", "role": "coder", "assignment": ASSIGNMENT},
                        }
                    ],
                ),
                Reply.call("finish", summary="primes.py is in place", status="success"),
            ],
            "coder": [
                Reply.call("write_file", path="primes.py", content="print([2, 3, 5, 7])\n"),
                Reply.call("finish", summary="primes.py written"),
            ],
        }
    )
    limits = EpisodeLimits(wall_s=60, request_timeout_s=10, request_retries=0, loop_repeats=3)
    result = run_episode(
        EpisodeInput(prompt=parts.text, endpoint=ep.endpoint, limits=limits, sampling=Sampling(), seed=1),
        tmp_path / "ws",
        tmp_path / "out",
    )
    assert result.outcome == "success"
    records = read_trace(tmp_path / "out" / "trace.jsonl")
    assert [t.role for t in rebuild_threads(records, "builtin")] == ["orchestrator", "worker"]
    episode = EpisodeTrace(
        "primes",
        0,
        records,
        bare_prompt=parts.task,
        teacher_prompt=parts.text,
        harness="builtin",
        strip_pieces=(parts.workflow, parts.directive),
    )
    windows, stats = render_windows([episode], tokenizer, SftSpec(window=4096, context=256))
    assert stats["episode_errors"] == [] and stats["windows_by_role"] == {
        "orchestrator": 1,
        "worker": 1,
        "auxiliary": 0,
    }
    texts = {w.role: tokenizer.decode(w.input_ids) for w in windows}
    assert not any(parts.workflow in t or parts.directive in t or "## Workflow" in t for t in texts.values())
    assert f"<|im_start|>user\n{BARE}<|im_end|>" in texts["orchestrator"] and ASSIGNMENT in texts["worker"]
    orch = next(w for w in windows if w.role == "orchestrator")
    assert "A coder writes it." in tokenizer.decode([x for x in orch.labels if x != IGNORE])
