"""A miniature of the paper's delegation result: SFT on stripped teacher traces internalises delegation.

Teacher traces: the orchestrator's first prompt holds task + workflow + directive, and it delegates
to a coder. Rendering strips the workflow and directive, leaving the bare task. After training,
the tiny model given only the bare task delegates with a well-formed tool call; the untrained
base never does, and a control trained on the same traces without the delegate calls barely does.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mass_jobs.config.run_spec import LoraSpec, OptimizerSpec, SftSpec
from mass_jobs.steps.render_sft import render_windows
from mass_jobs.steps.sft_threads import EpisodeTrace
from mass_jobs.training.loop import Trainer

TASKS = {
    "fib": "Write fib.py that prints ten Fibonacci numbers.",
    "primes": "Write primes.py that lists primes below fifty.",
    "sort": "Write sort.py that sorts numbers from data.txt.",
    "words": "Write count.py that counts words in notes.txt.",
}
WORKFLOW = (
    "Team plan: step one, a planner splits duties; step two, an engineer implements "
    "everything inside separate modules; step three, an auditor double checks outputs."
)
DIRECTIVE = (
    "Execution rules: invoke each teammate via its tool, never pretend; proceed only once upstream artefacts exist."
)
SYSTEM = "You lead a team."
N_SAMPLES = 12
NGRAM = 6
STEPS, LR, ACCUM = 150, 1e-2, 4  # 600 windows: ~200 orchestrator windows at the paper's 1/3 share
# The random tiny model's tied embeddings are too small for peaked logits; a LoRA on the LM head
# gives it the output scale a pretrained model already has.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def tool(name: str, props: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": {"type": "object", "properties": props}},
    }


ORCH_TOOLS = [tool("delegate", {"agent": {"type": "string"}, "task": {"type": "string"}}), tool("finish", {})]
WORKER_TOOLS = [tool("write_file", {"path": {"type": "string"}}), tool("finish", {})]


def rec(seq, messages, tools, reply, agent):
    return {
        "seq": seq,
        "agent": agent,
        "error": None,
        "request": {"model": "tiny", "messages": messages, "tools": tools, "stream": False, "sampling": {}},
        "response": {"message": reply, "finish_reason": "stop", "usage": {}},
    }


def episode(task: str, i: int, delegate: bool) -> EpisodeTrace:
    bare = TASKS[task]
    teacher = f"{bare}\n\n{WORKFLOW}\n\n{DIRECTIVE}"
    assignment = f"Implement {bare.split()[1]} now."
    orch = {"id": "orchestrator", "role": "orchestrator", "parent": None}
    sys_o, user = {"role": "system", "content": SYSTEM}, {"role": "user", "content": teacher}
    if delegate:
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": "delegate", "arguments": json.dumps({"agent": "coder", "task": assignment})},
                }
            ],
        }
        result = {"role": "tool", "tool_call_id": f"c{i}", "content": "done"}
        records = [
            rec(0, [sys_o, user], ORCH_TOOLS, call, orch),
            rec(2, [sys_o, user, call, result], ORCH_TOOLS, {"role": "assistant", "content": "Finished."}, orch),
        ]
    else:  # the control: the same episode with the delegate call removed
        records = [rec(0, [sys_o, user], ORCH_TOOLS, {"role": "assistant", "content": "Finished."}, orch)]
    worker = {"id": "coder", "role": "worker", "parent": "orchestrator"}
    w_user = {"role": "user", "content": assignment}
    w_call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "w",
                "type": "function",
                "function": {"name": "write_file", "arguments": json.dumps({"path": bare.split()[1]})},
            }
        ],
    }
    records += [rec(1, [{"role": "system", "content": "You code."}, w_user], WORKER_TOOLS, w_call, worker)]
    return EpisodeTrace(task, i, records, bare_prompt=bare, teacher_prompt=teacher)


def ngrams(ids: list[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(ids[k : k + n]) for k in range(len(ids) - n + 1)}


def delegations(model, tokenizer, n: int) -> int:
    """Well-formed delegate calls in n sampled replies to the bare prompts (tasks in turn)."""
    names = list(TASKS)
    hits = 0
    for k in range(n):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASKS[names[k % len(names)]]}]
        ids = tokenizer.apply_chat_template(
            msgs, tools=ORCH_TOOLS, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        torch.manual_seed(100 + k)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=40,
            do_sample=True,
            temperature=0.6,
            top_k=20,
            top_p=0.95,
            pad_token_id=tokenizer.pad_token_id,
        )
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)
        m = re.search(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", text, re.S)
        try:
            call = json.loads(m.group(1)) if m else None
        except json.JSONDecodeError:
            call = None
        if call and call.get("name") == "delegate" and isinstance((call.get("arguments") or {}).get("task"), str):
            hits += 1
    return hits


def train(model_dir, windows, out_dir):
    sft = SftSpec(
        window=512,
        context=0,
        steps=STEPS,
        val_every=STEPS,
        save_every=STEPS,
        grad_accum=ACCUM,
        gradient_checkpointing=False,
        seed=0,
        lora=LoraSpec(r=16, alpha=32, dropout=0.0, target_modules=TARGETS),
        optimizer=OptimizerSpec(lr=LR, warmup_steps=5, min_lr_ratio=0.1),
    )
    records = [w.record() for w in windows]
    trainer = Trainer(model_dir, records, records[:4], sft, out_dir, progress=False)
    trainer.setup()
    trainer.train()
    return trainer.peft_model.eval()


@pytest.mark.slow
def test_delegation_is_internalised_from_stripped_teacher_traces(tiny_model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    sft = SftSpec(window=512, context=0)
    teacher = [episode(t, i, delegate=True) for t in TASKS for i in range(2)]
    windows, stats = render_windows(teacher, tok, sft)
    assert stats["windows_by_role"]["orchestrator"] == len(teacher) and stats["teacher_prompt_not_found"] == []

    # (c) on tokens: no orchestrator window holds any 6-token run of the workflow or directive ...
    banned = ngrams(tok(WORKFLOW)["input_ids"], NGRAM) | ngrams(tok(DIRECTIVE)["input_ids"], NGRAM)
    for w in windows:
        if w.role == "orchestrator":
            assert not (ngrams(w.input_ids, NGRAM) & banned), tok.decode(w.input_ids)
    # ... which the same check does find when the teacher prompt is left in (the check can see it)
    unstripped, _ = render_windows(
        [EpisodeTrace(e.task, e.episode, e.records, e.bare_prompt) for e in teacher], tok, sft
    )
    assert all(ngrams(w.input_ids, NGRAM) & banned for w in unstripped if w.role == "orchestrator")

    # (a) the base model never delegates on the bare prompt
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    base_hits = delegations(base, tok, N_SAMPLES)
    assert base_hits == 0

    # (b) trained on the stripped traces, it delegates in a clear majority of bare-prompt samples
    trained = train(tiny_model_dir, windows, tmp_path / "teacher")
    hits = delegations(trained, tok, N_SAMPLES)
    assert hits >= 0.75 * N_SAMPLES, hits

    # (d) the control (same traces, delegate calls removed) delegates in (almost) none
    control_windows, _ = render_windows([episode(t, i, delegate=False) for t in TASKS for i in range(2)], tok, sft)
    control = train(tiny_model_dir, control_windows, tmp_path / "control")
    control_hits = delegations(control, tok, N_SAMPLES)
    print(f"delegating samples of {N_SAMPLES}: base {base_hits}, trained {hits}, control {control_hits}")
    assert control_hits <= 1
