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
from mass_jobs.steps.sft_tokens import IGNORE, tokenize_conversation
from mass_jobs.tiny.build import ARCH, build_tiny_model
from mass_jobs.tiny.warm_check import check as check_behaviours
from mass_jobs.tiny.warm_corpus import BARE_DELEGATES, BARE_WORKFLOW_TEACHER, CONVERSATIONS_PER_KIND, warm_corpus
from mass_jobs.training.schedule import lr_at

# 1,800 steps over 128 conversations per kind: the shapes hold with margin whatever the float
# kernels (measured on one machine with torch's AVX512 and AVX2 kernels, 1 and 2 threads, seeds 0
# and 1; README). 900 steps over 64 (the v2 recipe) and 1,800 over 64 each missed a rate of the check.
WARM_STEPS = 1800
WARM_LR = 3e-3


def encode(tokenizer, corpus) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) per conversation: the template's assistant tokens carry the loss."""

    examples = []
    for messages, tools in corpus:
        ids, mask, _header = tokenize_conversation(tokenizer, messages, tools)
        examples.append((ids, [t if m else IGNORE for t, m in zip(ids, mask)]))
    return examples


def warm_up(
    model,
    tokenizer,
    seed: int = 0,
    steps: int = WARM_STEPS,
    lr: float = WARM_LR,
    on_step: Callable[[int, int, float], None] | None = None,
    examples=None,
) -> list[float]:
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
    return {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "steps": steps,
        "lr": WARM_LR,
        "conversations_per_kind": CONVERSATIONS_PER_KIND,
        "bare_workflow_teacher": list(BARE_WORKFLOW_TEACHER),
        "bare_delegates": BARE_DELEGATES,
    }


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


def build_warm_model(
    out_dir, seed: int = 0, steps: int | None = None, on_step=None, check: bool | None = None, say=None
) -> Path:
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
        rates = (
            check_behaviours(model, tokenizer, say=say)
            if (check if check is not None else steps == WARM_STEPS)
            else None
        )
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
