"""Warm-up of the tiny model: a short full fine-tune on synthetic harness conversations.

A random-weight model answers noise, so every verdict is invalid, no proposal parses and no
episode delegates: a demo run shows only dashes. Warming the model teaches it the SHAPES the
harness expects, from a corpus generated here (no downloads) with the harness's own system
prompts, tool definitions and request layouts, rendered with the model's chat template:
  - orchestrator: `delegate` the task as a self-contained assignment, then `finish`;
  - worker: `write_file` the script and its result file, then `finish`;
  - evaluator: a verdict JSON over two real workspace bundles (`compare.bundle`), A/B/tie mixed;
  - optimizer: a small valid workflow JSON for the search brief.
The model stays tiny and its content noisy; the point is well-formed replies often enough for
the report to have valid verdicts, delegation and proposals. Same seed, same weights.

Run: `mass model tiny --out DIR --warm`.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import OptimizerSpec
from mass_jobs.config.task_spec import Workflow
from mass_jobs.episodes import tools as T
from mass_jobs.episodes.builtin import ORCHESTRATOR_SYSTEM, WORKER_SYSTEM
from mass_jobs.judging import optimizer_brief as ob
from mass_jobs.judging.compare import EVALUATOR_SYSTEM, bundle, verdict_request
from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, teacher_prompt, workflow_json, workflow_prompt_parts
from mass_jobs.steps.sft_tokens import IGNORE, tokenize_conversation
from mass_jobs.tiny.build import ARCH, build_tiny_model
from mass_jobs.tiny.tasks import synthetic_task
from mass_jobs.tiny.warm_check import check as check_behaviours
from mass_jobs.training.schedule import lr_at

# 1,800 steps over 128 conversations per kind: the shapes hold with margin whatever the float
# kernels (measured on one machine with torch's AVX512 and AVX2 kernels, 1 and 2 threads, seeds 0
# and 1; README). 900 steps over 64 (the v2 recipe) and 1,800 over 64 each missed a rate of the check.
WARM_STEPS = 1800
WARM_LR = 3e-3
CONVERSATIONS_PER_KIND = 128
# Orchestrator prompts: bare / with a workflow / teacher prompt (weights), and the share of bare
# prompts that still delegate (the paper's L0 delegates on 1 of 110 bare prompts).
BARE_WORKFLOW_TEACHER = (2, 1, 1)
BARE_DELEGATES = 0.1

# Few, distinct agents: the tiny model must reproduce one exactly for a proposal to validate.
_AGENT_POOL = [
    ("coder", "coder", "Write the code and the result files."),
    ("reviewer", "reviewer", "Check the files and report defects."),
    ("tester", "tester", "Run the script and check the output."),
]
_ORCHESTRATOR_LINES = ["Delegate the task, then finish.", "Split the task and delegate it.",
                       "Delegate each step and check the files."]


def _call(name: str, arguments: dict, i: int) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _synthetic_workflow(rng: random.Random, hops: bool = True):
    """A short valid workflow (appended to some prompts; without hops, what the optimizer proposes)."""

    picks = [rng.choice(_AGENT_POOL)]  # one worker agent: longer lists come out with repeated ids
    agents = [{"id": "orchestrator", "role": "orchestrator", "instruction": rng.choice(_ORCHESTRATOR_LINES)}]
    agents += [{"id": i, "role": r, "instruction": text} for i, r, text in picks]
    doc: dict[str, Any] = {"agents": agents}
    if hops and rng.random() < 0.5:
        doc["hops"] = [{"caller": "orchestrator", "callee": picks[0][0]}]
    return Workflow.model_validate(doc), doc


def orchestrator_conversation(rng: random.Random, task: dict) -> tuple[list[dict], list[dict]]:
    """A workflow or teacher prompt -> delegate the task -> (maybe check a file) -> finish. A bare
    prompt -> mostly work alone (look at the workspace, finish without delegating), as the paper's
    L0 model does on a bare prompt; only `BARE_DELEGATES` of bare prompts delegate, so MASS has a
    behaviour to internalise: its teacher prompts delegate and its SFT data pairs that with the bare task."""

    tools = [T.DELEGATE, T.READ_FILE, T.LIST_FILES, T.FINISH]
    style = rng.choices(["bare", "workflow", "teacher"], weights=BARE_WORKFLOW_TEACHER)[0]
    wf = DEFAULT_WORKFLOW if rng.random() < 0.5 else _synthetic_workflow(rng)[0]
    prompt = (task["prompt"] if style == "bare" else workflow_prompt_parts(task["prompt"], wf).text
              if style == "workflow" else teacher_prompt(task["prompt"], wf))
    script, result = task["deliverables"]
    messages = [{"role": "system", "content": ORCHESTRATOR_SYSTEM}, {"role": "user", "content": prompt}]
    if style == "bare" and rng.random() >= BARE_DELEGATES:
        seed_files = sorted(task["files"])
        look = (_call("read_file", {"path": seed_files[0]}, 0) if seed_files and rng.random() < 0.5
                else _call("list_files", {"path": "."}, 0))
        seen = task["files"][seed_files[0]] if look["function"]["name"] == "read_file" else \
            "\n".join(seed_files) or "(empty)"
        messages += [{"role": "assistant", "content": "", "tool_calls": [look]},
                     {"role": "tool", "tool_call_id": "call_0", "content": seen},
                     {"role": "assistant", "content": "", "tool_calls": [_call(
                         "finish", {"summary": f"Worked on it alone: {script} and {result} still to write.",
                                    "status": "failure"}, 1)]}]
        return messages, tools
    report = f"Wrote {script} and {result}."
    messages += [{"role": "assistant", "content": "", "tool_calls": [_call("delegate", {"assignment": task["prompt"]}, 0)]},
                 {"role": "tool", "tool_call_id": "call_0",
                  "content": json.dumps({"agent_id": "worker-1", "status": "success", "report": report})}]
    if rng.random() < 0.3:
        messages += [{"role": "assistant", "content": "", "tool_calls": [_call("read_file", {"path": result}, 1)]},
                     {"role": "tool", "tool_call_id": "call_1", "content": task["result"]}]
    messages.append({"role": "assistant", "content": "",
                     "tool_calls": [_call("finish", {"summary": report, "status": "success"}, 2)]})
    return messages, tools


def worker_conversation(rng: random.Random, task: dict) -> tuple[list[dict], list[dict]]:
    """Assignment -> write the script -> write the result file -> finish with a report."""

    script, result = task["deliverables"]
    system = WORKER_SYSTEM.format(agent_id=f"worker-{rng.randint(1, 3)}", role="worker")
    messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task["prompt"]}]
    for i, (path, content) in enumerate([(script, task["script"]), (result, task["result"])]):
        messages += [{"role": "assistant", "content": "",
                      "tool_calls": [_call("write_file", {"path": path, "content": content}, i)]},
                     {"role": "tool", "tool_call_id": f"call_{i}",
                      "content": f"wrote {len(content.encode())} bytes to {path}"}]
    messages.append({"role": "assistant", "content": "", "tool_calls": [
        _call("finish", {"summary": f"Wrote {script} and {result}.", "status": "success"}, 2)]})
    return messages, [T.READ_FILE, T.WRITE_FILE, T.LIST_FILES, T.SHELL, T.FINISH]


def _workspace_bundle(rng: random.Random, task: dict, root: Path) -> tuple[str, int]:
    """A real `compare.bundle` of a workspace holding some of the deliverables; (bundle, how many)."""

    root.mkdir(parents=True)
    for rel, text in task["files"].items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    have = rng.choice([0, 1, 2, 2])
    for rel, text in list(zip(task["deliverables"], [task["script"], task["result"]]))[:have]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    outcome = "success" if have == 2 and rng.random() < 0.8 else rng.choice(["failed", "success", "timeout"])
    status = {"outcome": outcome, "reason": "orchestrator finished" if outcome == "success" else "worker-1 used all 3 turns"}
    return bundle(root, None, task["deliverables"], status, task["prompt"]), have + (outcome == "success")


def evaluator_conversation(rng: random.Random, task: dict, scratch: Path) -> tuple[list[dict], None]:
    """The verdict request exactly as `compare.judge` sends it; the fuller workspace wins, else a tie."""

    bundle_a, score_a = _workspace_bundle(rng, task, scratch / "a")
    bundle_b, score_b = _workspace_bundle(rng, task, scratch / "b")
    winner = "A" if score_a > score_b else "B" if score_b > score_a else "tie"
    if rng.random() < 0.4:  # a tiny model cannot see the rule anyway: keep its answers mixed
        winner = rng.choice(["A", "B", "tie"])
    rationale = {"A": "A has more of the deliverables.", "B": "B has more of the deliverables.",
                 "tie": "Both have the same files."}[winner]
    user = verdict_request(task["prompt"], bundle_a, bundle_b)
    reply = json.dumps({"winner": winner, "rationale": rationale})
    return [{"role": "system", "content": EVALUATOR_SYSTEM}, {"role": "user", "content": user},
            {"role": "assistant", "content": reply}], None


def optimizer_conversation(rng: random.Random, task: dict, scratch: Path) -> tuple[list[dict], None]:
    """A search request as `mass search` builds it (`optimizer_brief.build`) -> a short valid workflow JSON."""

    current = rng.choice([0, 0, 1, 2])  # the first proposal (after v0 alone) is the commonest request
    designs = {0: workflow_json(DEFAULT_WORKFLOW) if rng.random() < 0.6 else _synthetic_workflow(rng)[1]}
    designs.update({k: _synthetic_workflow(rng)[1] for k in range(1, current + 1)})
    evidence, _ = _workspace_bundle(rng, task, scratch / "evidence")
    outcomes = [rng.choice(["win", "loss", "loss", "tie", "invalid"]) for _ in range(current + 1)]
    rationales = ["A has more of the deliverables.", "B is missing results/out.json.", "Both have the same files."]
    rows = [ob.Row(k, "the bare reference", o, rng.choice(rationales)) for k, o in enumerate(outcomes)]
    status = {"outcome": rng.choice(["success", "success", "failed", "timeout"]), "reason": "orchestrator finished"}
    won = [k for k, o in enumerate(outcomes) if o == "win"]
    best = won[0] if won and won[0] != current else None
    inp = ob.BriefInput(task=task["prompt"], current=current, designs=designs, rows=rows, evidence=evidence,
                        status=status, best=best, best_case="best_only_won", champion=won[0] if won else None)
    messages, _ = ob.build(inp)
    # no hops in the reply: the tiny model cannot keep a hop's callee equal to the worker's id, and a
    # proposal whose hop names no agent fails validation (measured: 8 of 32 probes)
    reply = json.dumps(_synthetic_workflow(rng, hops=False)[1])
    return [*messages, {"role": "assistant", "content": reply}], None


def warm_corpus(seed: int, per_kind: int = CONVERSATIONS_PER_KIND) -> list[tuple[list[dict], list[dict] | None]]:
    """(messages, tools) conversations of the four roles, interleaved, deterministic for `seed`."""
    rng = random.Random(seed)
    out = []
    with tempfile.TemporaryDirectory(prefix="mass-warm-") as tmp:
        for i in range(per_kind):
            scratch = Path(tmp) / str(i)
            out.append(orchestrator_conversation(rng, synthetic_task(rng)))
            out.append(orchestrator_conversation(rng, synthetic_task(rng)))  # twice: the decision MASS moves
            out.append(worker_conversation(rng, synthetic_task(rng)))
            out.append(evaluator_conversation(rng, synthetic_task(rng), scratch / "eval"))
            out.append(optimizer_conversation(rng, synthetic_task(rng), scratch / "opt"))
    return out


def encode(tokenizer, corpus) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per conversation: the template's assistant tokens carry the loss."""

    examples = []
    for messages, tools in corpus:
        ids, mask, _header = tokenize_conversation(tokenizer, messages, tools)
        examples.append((ids, [t if m else IGNORE for t, m in zip(ids, mask)]))
    return examples


def warm_up(model, tokenizer, seed: int = 0, steps: int = WARM_STEPS, lr: float = WARM_LR,
            on_step: Callable[[int, int, float], None] | None = None, examples=None) -> list[float]:
    """Fine-tune every weight of `model` in place on the warm corpus; returns the per-step losses.
    `on_step(step, steps, loss)` is called after every step (progress display).

    One conversation per step in a seeded order, AdamW on the project's warmup+cosine schedule.
    The loss is computed only at supervised positions (the LM head over the whole prompt would
    cost most of the time), with a private RNG state so callers' RNG is untouched.
    """
    import torch
    import torch.nn.functional as F


    examples = encode(tokenizer, warm_corpus(seed)) if examples is None else examples
    schedule = OptimizerSpec(lr=lr, warmup_steps=max(1, steps // 20), min_lr_ratio=0.1)
    order = random.Random(seed + 1)
    losses: list[float] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=schedule.betas, weight_decay=0.0)
        queue: list[int] = []
        for step in range(1, steps + 1):
            if not queue:
                queue = list(range(len(examples)))
                order.shuffle(queue)
            ids, labels = examples[queue.pop()]
            x = torch.tensor([ids])
            target = torch.tensor(labels[1:])
            keep = target != IGNORE
            hidden = model.model(input_ids=x).last_hidden_state[0, :-1][keep]
            loss = F.cross_entropy(model.lm_head(hidden).float(), target[keep])
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, schedule)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
            opt.step()
            losses.append(loss.item())
            if on_step:
                on_step(step, steps, losses[-1])
        model.eval()
    return losses


# ---------------------------------------------------------------- the cached build

# Bump when the corpus, its mix or the training recipe changes: a cached model of another version
# is rebuilt. v2: bare prompts mostly work alone, workflow/teacher prompts delegate, true results.
# v3: twice the steps and the corpus, and the build checks its own behaviours (tiny_warm_check).
# v4: the evaluator's and the optimizer's requests carry the paper's code's evidence and history.
# v5: the evaluator's request fences each workspace as data (compare.fence_tag).
BUILDER_VERSION = 5
KEY_FILE = "warm-key.json"


def warm_key(seed: int = 0, steps: int = WARM_STEPS) -> dict:
    """Everything the warm model's bytes depend on (the build is deterministic for these)."""
    return {"builder_version": BUILDER_VERSION, "seed": seed, "steps": steps, "lr": WARM_LR,
            "conversations_per_kind": CONVERSATIONS_PER_KIND, "bare_workflow_teacher": list(BARE_WORKFLOW_TEACHER),
            "bare_delegates": BARE_DELEGATES}


def is_tiny_build(path) -> bool:
    """A directory this module (or an older version of it) built: a key, or the tiny architecture.
    Anything else (a real model someone named in the spec) is never rebuilt over."""

    path = Path(path)
    if (path / KEY_FILE).is_file():
        return True
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    return isinstance(config, dict) and all(config.get(k) == ARCH[k] for k in keys)


def inputs_digest(model, examples) -> str:
    """sha256 of everything a warm build trains from: the initial weights (architecture, init, seed)
    and the encoded corpus (prompts, tools, template, tokenizer). The weights that come out also
    depend on the machine's float kernels, so a committed model is checked against this, not its bytes."""
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    for ids, labels in examples:
        h.update(json.dumps([ids, labels], separators=(",", ":")).encode())
    return h.hexdigest()


def current_inputs_digest(seed: int = 0) -> str:
    """`inputs_digest` of what the current code would train from (a scratch tiny model, ~15 s)."""
    found: list[str] = []

    def digest_only(model, tokenizer, out) -> None:
        found.append(inputs_digest(model, encode(tokenizer, warm_corpus(seed))))

    with tempfile.TemporaryDirectory(prefix="mass-warm-inputs-") as tmp:
        build_tiny_model(Path(tmp) / "model", seed=seed, prepare=digest_only)
    return found[0]


def write_key(path, seed: int, steps: int, seconds: float, rates=None, inputs: str | None = None) -> None:
    """Record what a warm build was made from (the key, and the digest of its initial weights and
    corpus), how long it took and, when the build checked its behaviours, the measured rates
    ([hits, n]) and the machine they were measured on."""
    doc: dict[str, Any] = {"key": warm_key(seed, steps), "build_s": round(seconds, 1)}
    if inputs is not None:
        doc["inputs_sha256"] = inputs
    if rates is not None:
        from mass_jobs.tiny.warm_check import machine  # noqa: I001 (one direction: the check never imports this)

        doc["check"] = {name: [r.hits, r.n] for name, r in rates.items()}
        doc["machine"] = machine()
    (Path(path) / KEY_FILE).write_text(json.dumps(doc, indent=1) + "\n")


def build_warm_model(out_dir, seed: int = 0, steps: int | None = None, on_step=None, check: bool | None = None,
                     say=None) -> Path:
    """The tiny model fine-tuned on the warm corpus (`steps` overrides WARM_STEPS; `on_step(step,
    steps, loss)` sees every step). `check` (default: for the full warm-up) measures the behaviours
    the demo needs before anything is written and raises `tiny_warm_check.WarmCheckFailed` when one
    misses; `say(line)` hears its rates."""
    import time


    steps = WARM_STEPS if steps is None else steps

    def prepare(model, tokenizer, out: Path) -> None:
        started = time.monotonic()
        examples = encode(tokenizer, warm_corpus(seed))
        inputs = inputs_digest(model, examples)  # before training moves the weights
        warm_up(model, tokenizer, seed=seed, steps=steps, on_step=on_step, examples=examples)
        rates = check_behaviours(model, tokenizer, say=say) if (check if check is not None else steps == WARM_STEPS) else None
        write_key(out, seed, steps, time.monotonic() - started, rates, inputs)

    return build_tiny_model(out_dir, seed=seed, prepare=prepare)


def cached_build(path, seed: int = 0, steps: int = WARM_STEPS, on_step=None, say=None) -> tuple[Path, float | None]:
    """The warm tiny model at `path`, built only when the directory's key is missing (an older
    builder) or differs from `warm_key(seed, steps)`; (path, seconds the build took now, None when the cache was used).

    The build goes to a sibling temporary directory renamed into place, so an interrupted build
    never leaves a directory that looks cached. `say(text)` hears what is happening.
    """
    import os
    import shutil
    import time

    path = Path(path)
    key = warm_key(seed, steps)
    stamp = path / KEY_FILE
    found = json.loads(stamp.read_text()) if stamp.is_file() else None
    if found and found.get("key") == key and (path / "model.safetensors").is_file():
        if say:
            say(f"warm tiny model: cached at {path} (key matches; built in {found.get('build_s', 0):.0f}s)")
        return path, None
    if say:
        why = "not built yet" if not path.exists() else "its key differs" if found else "no key recorded"
        say(f"building the warm tiny model at {path} ({why}; about 3 minutes on 2 idle CPU cores, then a 30 s check)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    started = time.monotonic()
    try:
        build_warm_model(tmp, seed=seed, steps=steps, on_step=on_step, say=say)  # writes the key
        seconds = time.monotonic() - started
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path, seconds
