"""Render step: threads from trace lines, roles, teacher-prompt stripping, masks and windows."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from transformers import AutoTokenizer

from mass_jobs.models import SftSpec
from mass_jobs.steps.render_sft import (
    IGNORE,
    EpisodeTrace,
    RenderError,
    cut_windows,
    rebuild_threads,
    render_windows,
    tokenize_conversation,
    turn_opener,
)

SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "sft-window.schema.json").read_text())

BARE = "Build a tiny report on prime numbers."
WORKFLOW = "Workflow: orchestrator plans, coder writes primes.py, writer writes report.md."
DIRECTIVE = "Directive: call roles through the delegate tool; never role-play."
TEACHER = f"{BARE}\n\n{WORKFLOW}\n\n{DIRECTIVE}"
ASSIGNMENT = "Write primes.py that prints the first 10 primes."


def tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {"type": "object"}}}


ORCH_TOOLS = [tool("delegate"), tool("read_file")]
WORKER_TOOLS = [tool("write_file"), tool("read_file")]


def tc(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def call(seq, messages, tools, reply, finish="stop", agent=None) -> dict:
    return {
        "seq": seq,
        "agent": agent,
        "request": {"model": "tiny", "messages": messages, "tools": tools, "stream": False, "sampling": {}},
        "response": {"message": reply, "finish_reason": finish, "usage": {}},
        "error": None,
    }


def teacher_episode(with_agent: bool = False) -> list[dict]:
    """Orchestrator delegates once to a worker, then finishes; one tool-less auxiliary call."""
    sys_o = {"role": "system", "content": "You are the orchestrator."}
    u = {"role": "user", "content": TEACHER}
    a1 = {"role": "assistant", "content": "", "reasoning_content": "I should delegate.",
          "tool_calls": [tc("c1", "delegate", {"agent": "coder", "task": ASSIGNMENT})]}
    t1 = {"role": "tool", "tool_call_id": "c1", "content": "primes.py written"}
    a2 = {"role": "assistant", "content": "Done: report and code are in place."}
    sys_w = {"role": "system", "content": "You are the coder."}
    wu = {"role": "user", "content": ASSIGNMENT}
    w1 = {"role": "assistant", "content": "", "tool_calls": [tc("w1", "write_file", {"path": "primes.py"})]}
    wt = {"role": "tool", "tool_call_id": "w1", "content": "ok"}
    w2 = {"role": "assistant", "content": "primes.py written"}
    ag = (lambda i, r, p=None: {"id": i, "role": r, "parent": p}) if with_agent else (lambda *a, **k: None)
    history_a1 = {k: v for k, v in a1.items() if k != "reasoning_content"}  # harness drops reasoning
    return [
        call(0, [sys_o, u], ORCH_TOOLS, a1, agent=ag("orchestrator", "orchestrator")),
        call(1, [sys_w, wu], WORKER_TOOLS, w1, agent=ag("coder", "worker", "orchestrator")),
        call(2, [sys_w, wu, w1, wt], WORKER_TOOLS, w2, agent=ag("coder", "worker", "orchestrator")),
        call(3, [sys_o, u, history_a1, t1], ORCH_TOOLS, a2, agent=ag("orchestrator", "orchestrator")),
        call(4, [{"role": "user", "content": "Summarise: primes"}], None, {"role": "assistant", "content": "Primes."},
             agent=ag("summariser", "auxiliary")),
    ]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


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
    other = call(5, [{"role": "system", "content": "You are the orchestrator."}, {"role": "user", "content": "x"}],
                 ORCH_TOOLS, {"role": "assistant", "content": "half a thou"}, finish="length")
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
        msgs.append({"role": "assistant", "content": f"step {k}: " + "the quick brown fox " * 4,
                     "tool_calls": [tc(f"t{k}", "read_file", {"path": f"f{k}.txt"})]})
        msgs.append({"role": "tool", "tool_call_id": f"t{k}", "content": "lazy dog " * 6})
    msgs.append({"role": "assistant", "content": "finished"})
    return msgs


@pytest.mark.parametrize("window,context", [(512, 64), (512, 0), (400, 128)], ids=lambda v: str(v))
def test_windows_train_every_assistant_token_once(tokenizer, window, context):
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


def test_oversized_block_is_reported_and_fails_under_strict(tokenizer):
    huge = {"role": "assistant", "content": "the quick brown fox jumps " * 80}
    recs = [call(0, [{"role": "user", "content": "go"}], None, huge)]
    ep = EpisodeTrace("t", 0, recs, bare_prompt="go")
    windows, stats = render_windows([ep], tokenizer, SftSpec(window=128, context=0))
    assert windows == [] and len(stats["dropped_blocks"]) == 1
    assert stats["dropped_supervised_tokens"] > 128
    with pytest.raises(RenderError, match="cannot fit sft.window=128"):
        render_windows([ep], tokenizer, SftSpec(window=128, context=0, strict=True))


def test_template_without_generation_markers_is_an_error(tokenizer):
    plain = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    ep = EpisodeTrace("t", 0, teacher_episode(), bare_prompt=BARE)
    with pytest.raises(RenderError, match="generation"):
        render_windows([ep], plain, SftSpec(window=256, context=0))


def test_render_step_over_the_store(tokenizer, tmp_path):
    import yaml

    from mass_jobs.context import RunContext
    from mass_jobs.spec import load_spec
    from mass_jobs.steps.render_sft import read_jsonl, run_render
    from mass_jobs.store import open_store, read_manifest

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "r", "model": {"base": str(tmp_path)},
        "tasks": [{"id": "primes", "split": "train", "prompt": BARE},
                  {"id": "skipped", "split": "train", "prompt": "never beat the reference"}],
        "collection": {"episodes": 3, "train_ranks": 2, "validation_rank": 3},
        "ranking": {"comparisons_per_episode": 1},
        "sft": {"window": 512, "context": 64},
        "store": {"uri": f"file://{tmp_path / 'store'}"},
    }))
    ctx = RunContext(load_spec(spec_path), open_store(f"file://{tmp_path / 'store'}"))
    ctx.store.put_json(ctx.rank(0, "primes"), {"task": "primes", "train": ["ep-0", "ep-2"], "val": "ep-1"})
    ctx.store.put_json(ctx.rank(0, "skipped"), {"task": "skipped", "skipped": True, "train": [], "val": None})
    for i in range(3):
        base = ctx.collect_episode(0, "primes", i)
        ctx.store.put_bytes(f"{base}/trace.jsonl", "".join(json.dumps(r) + "\n" for r in teacher_episode()).encode())
        ctx.store.put_json(f"{base}/episode.json", {"prompt": TEACHER})
    extra = run_render(ctx, 0, tokenizer)
    train = read_jsonl(tmp_path / "store" / "r/gen-0/sft/train.jsonl")
    val = read_jsonl(tmp_path / "store" / "r/gen-0/sft/val.jsonl")
    assert len(train) == 6 and len(val) == 3 and {w["episode"] for w in train} == {0, 2}
    assert extra["stored_supervised_tokens"] == sum(w["n_supervised"] for w in train)
    assert extra["windows_by_role"] == {"orchestrator": 2, "worker": 2, "auxiliary": 2}
    manifest = read_manifest(ctx.store, "r/gen-0/sft")
    assert manifest["extra"]["stored_supervised_tokens"] == extra["stored_supervised_tokens"]
    assert set(manifest["outputs"]) == {f"r/gen-0/sft/{n}" for n in ("train.jsonl", "val.jsonl", "stats.json")}
    orch = next(w for w in train if w["role"] == "orchestrator")
    assert WORKFLOW not in tokenizer.decode(orch["input_ids"])
    assert run_render(ctx, 0, tokenizer) == extra  # done: skipped on rerun
