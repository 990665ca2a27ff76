"""The warm build's acceptance check: the behaviours the demo rests on, measured on the built
weights before they are saved. A build that misses one fails (`WarmCheckFailed`), so a machine
whose float kernels trained a different model never ships one the demo cannot use.

Measured with the demo's sampling (the paper's 0.6 / 0.95 / 20, 128 output tokens), seeded, on
the demo's three task prompts and held-out synthetic tasks the corpus never saw, through the
product's own parsers (`parse_tool_calls`, `parse_proposal`, `compare.judge`):
  - bare prompt: the orchestrator works alone (a first `delegate` call is rare, as at the paper's L0);
  - prompt with a workflow: a well-formed `delegate` call with a non-empty assignment;
  - optimizer brief: a proposal that validates as a workflow;
  - evaluator request: a verdict that parses.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from mass_jobs.episodes import tools as T
from mass_jobs.episodes.builtin import ORCHESTRATOR_SYSTEM
from mass_jobs.judging import optimizer_brief as ob
from mass_jobs.judging.compare import bundle, judge
from mass_jobs.serving.llm import parse_tool_calls
from mass_jobs.spec.workflow import (
    DEFAULT_WORKFLOW,
    WorkflowError,
    parse_proposal,
    workflow_json,
    workflow_prompt_parts,
)
from mass_jobs.tiny.tasks import synthetic_task

# rate name -> (comparison, bound). The tests and the demo assert below these with stated margins.
THRESHOLDS = {
    "bare_delegates": ("<=", 0.10),
    "workflow_delegates": (">=", 0.90),
    "proposals_valid": (">=", 0.80),
    "verdicts_valid": (">=", 0.90),
}
DEMO_PROMPTS = (
    "Write fib.py that prints the first 10 Fibonacci numbers and save them to results/fib.json.",
    "Write primes.py that lists the primes below the number in data/limit.txt and save the count to "
    'results/metrics.json as {"count": N}.',
    "Write sort.py that sorts the numbers in data/nums.txt and writes them to results/sorted.txt.",
)
HELD_OUT_TASKS = 5  # synthetic tasks from a seed the corpus never uses
SAMPLES_PER_PROMPT = 4
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class WarmCheckFailed(RuntimeError):
    """The warm build misses a behaviour the demo needs; the message lists every rate with its n."""


@dataclass
class Rate:
    hits: int
    n: int

    @property
    def value(self) -> float:
        return self.hits / self.n if self.n else 0.0


class LocalChat:
    """The subset of `ModelClient.chat` the checks use, on in-process weights: the model's chat
    template with tools, seeded sampling, `<tool_call>` blocks parsed as the serving parser does
    (a block that is not JSON stays in the content)."""

    def __init__(self, model, tokenizer, temperature=0.6, top_p=0.95, top_k=20, max_output_tokens=128):
        self.model, self.tokenizer = model, tokenizer
        self.sampling = dict(
            do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_output_tokens
        )

    def chat(self, messages, tools=None, seed=None, headers=None) -> dict:
        import torch

        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )["input_ids"]
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0 if seed is None else seed)
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), **self.sampling, pad_token_id=self.tokenizer.pad_token_id
            )
        text = self.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)
        for marker in ("<|im_end|>", "<|endoftext|>", self.tokenizer.pad_token or ""):
            if marker:
                text = text.split(marker)[0]
        calls, content = [], text
        for i, body in enumerate(_TOOL_CALL.findall(text)):
            try:
                call = json.loads(body)
                name, arguments = call["name"], call.get("arguments", {})
            except (ValueError, TypeError, KeyError):
                continue
            calls.append(
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            )
        if calls:
            content = _TOOL_CALL.sub("", text).strip()
        return {"role": "assistant", "content": content, "tool_calls": calls or None}


def probe_prompts() -> list[str]:

    rng = random.Random(10_000)
    return [*DEMO_PROMPTS, *(synthetic_task(rng)["prompt"] for _ in range(HELD_OUT_TASKS))]


def measure(model, tokenizer, prompts: list[str] | None = None, samples: int | None = None) -> dict[str, Rate]:
    """Every rate of THRESHOLDS on `model` over `prompts` (default `probe_prompts()`) x `samples`
    seeds, deterministic for the weights."""

    chat = LocalChat(model, tokenizer)
    tools = [T.DELEGATE, T.READ_FILE, T.LIST_FILES, T.FINISH]
    rates = {k: Rate(0, 0) for k in THRESHOLDS}
    wf = workflow_json(DEFAULT_WORKFLOW)
    empty = bundle(Path("/nonexistent"))
    for p, task in enumerate(probe_prompts() if prompts is None else prompts):
        for s in range(samples or SAMPLES_PER_PROMPT):
            seed = 1000 * p + s
            for kind, prompt in (("bare", task), ("workflow", workflow_prompt_parts(task, DEFAULT_WORKFLOW).text)):
                reply = chat.chat(
                    [{"role": "system", "content": ORCHESTRATOR_SYSTEM}, {"role": "user", "content": prompt}],
                    tools=tools,
                    seed=seed,
                )
                delegated = any(
                    c.name == "delegate" and c.error is None and str(c.arguments.get("assignment", "")).strip()
                    for c in parse_tool_calls(reply)
                )
                rate = rates[f"{kind}_delegates"]
                rate.hits, rate.n = rate.hits + delegated, rate.n + 1
            brief, _ = ob.build(
                ob.BriefInput(
                    task=task,
                    current=0,
                    designs={0: wf},
                    evidence=empty,
                    rows=[ob.Row(0, "the bare reference", "loss")],
                    status={"outcome": "failed", "reason": "no result"},
                )
            )
            reply = chat.chat(brief, seed=seed)
            try:
                parse_proposal(reply["content"])
                ok = True
            except WorkflowError:
                ok = False
            rates["proposals_valid"].hits += ok
            rates["proposals_valid"].n += 1
            verdict = judge(
                chat,
                task,
                ("a", empty),
                ("b", bundle(Path("/nonexistent"), status={"outcome": "failed"})),
                retries=0,
                seed=seed,
            )
            rates["verdicts_valid"].hits += verdict.valid
            rates["verdicts_valid"].n += 1
    return rates


def failures(rates: dict[str, Rate]) -> list[str]:
    out = []
    for name, (op, bound) in THRESHOLDS.items():
        v = rates[name].value
        if not (v <= bound if op == "<=" else v >= bound):
            out.append(f"{name} {v:.2f} (needs {op} {bound:.2f})")
    return out


def report(rates: dict[str, Rate]) -> str:
    return ", ".join(f"{k} {r.hits}/{r.n}" for k, r in rates.items())


def machine() -> dict[str, str]:
    """The CPU and torch's kernel choice a build ran on (its float results depend on both)."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": str(torch.get_num_threads()),
    }


def check(model, tokenizer, say=None, **measure_kw) -> dict[str, Rate]:
    """Measure, print the rates with their n, raise WarmCheckFailed when one misses its bound."""
    rates = measure(model, tokenizer, **measure_kw)
    line = f"warm check: {report(rates)}"
    if say:
        say(line)
    bad = failures(rates)
    if bad:
        raise WarmCheckFailed(f"{line}; below the demo's needs: {'; '.join(bad)}")
    return rates
