"""The warm-up corpus of the tiny model: synthetic conversations of the four roles (orchestrator,
worker, evaluator, optimizer) in the harness's own shapes (system prompts, tools, tool calls and
results), so a tiny model fine-tuned on them behaves like an agent where the mechanism needs it."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from mass_jobs.config.task_spec import Workflow
from mass_jobs.episodes import tools as T
from mass_jobs.episodes.builtin import ORCHESTRATOR_SYSTEM, WORKER_SYSTEM
from mass_jobs.judging import optimizer_brief as ob
from mass_jobs.judging.compare import EVALUATOR_SYSTEM, bundle, verdict_request
from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, teacher_prompt, workflow_json, workflow_prompt_parts
from mass_jobs.tiny.tasks import synthetic_task

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


_ORCHESTRATOR_LINES = [
    "Delegate the task, then finish.",
    "Split the task and delegate it.",
    "Delegate each step and check the files.",
]


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


def _alone(rng: random.Random, task: dict, script: str, result: str) -> list[dict]:
    """A bare prompt the orchestrator works on alone: one look at the workspace, then finish."""
    seed_files = sorted(task["files"])
    look = (
        _call("read_file", {"path": seed_files[0]}, 0)
        if seed_files and rng.random() < 0.5
        else _call("list_files", {"path": "."}, 0)
    )
    seen = (
        task["files"][seed_files[0]] if look["function"]["name"] == "read_file" else "\n".join(seed_files) or "(empty)"
    )
    return [
        {"role": "assistant", "content": "", "tool_calls": [look]},
        {"role": "tool", "tool_call_id": "call_0", "content": seen},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                _call(
                    "finish",
                    {"summary": f"Worked on it alone: {script} and {result} still to write.", "status": "failure"},
                    1,
                )
            ],
        },
    ]


def orchestrator_conversation(rng: random.Random, task: dict) -> tuple[list[dict], list[dict]]:
    """A workflow or teacher prompt -> delegate the task -> (maybe check a file) -> finish. A bare
    prompt -> mostly work alone (look at the workspace, finish without delegating), as the paper's
    L0 model does on a bare prompt; only `BARE_DELEGATES` of bare prompts delegate, so MASS has a
    behaviour to internalise: its teacher prompts delegate and its SFT data pairs that with the bare task."""

    tools = [T.DELEGATE, T.READ_FILE, T.LIST_FILES, T.FINISH]
    style = rng.choices(["bare", "workflow", "teacher"], weights=BARE_WORKFLOW_TEACHER)[0]
    wf = DEFAULT_WORKFLOW if rng.random() < 0.5 else _synthetic_workflow(rng)[0]
    prompt = (
        task["prompt"]
        if style == "bare"
        else workflow_prompt_parts(task["prompt"], wf).text
        if style == "workflow"
        else teacher_prompt(task["prompt"], wf)
    )
    script, result = task["deliverables"]
    messages = [{"role": "system", "content": ORCHESTRATOR_SYSTEM}, {"role": "user", "content": prompt}]
    if style == "bare" and rng.random() >= BARE_DELEGATES:
        return messages + _alone(rng, task, script, result), tools
    report = f"Wrote {script} and {result}."
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [_call("delegate", {"assignment": task["prompt"]}, 0)]},
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "content": json.dumps({"agent_id": "worker-1", "status": "success", "report": report}),
        },
    ]
    if rng.random() < 0.3:
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [_call("read_file", {"path": result}, 1)]},
            {"role": "tool", "tool_call_id": "call_1", "content": task["result"]},
        ]
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("finish", {"summary": report, "status": "success"}, 2)],
        }
    )
    return messages, tools


def worker_conversation(rng: random.Random, task: dict) -> tuple[list[dict], list[dict]]:
    """Assignment -> write the script -> write the result file -> finish with a report."""

    script, result = task["deliverables"]
    system = WORKER_SYSTEM.format(agent_id=f"worker-{rng.randint(1, 3)}", role="worker")
    messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": task["prompt"]}]
    for i, (path, content) in enumerate([(script, task["script"]), (result, task["result"])]):
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call("write_file", {"path": path, "content": content}, i)],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"wrote {len(content.encode())} bytes to {path}"},
        ]
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("finish", {"summary": f"Wrote {script} and {result}.", "status": "success"}, 2)],
        }
    )
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
    status = {
        "outcome": outcome,
        "reason": "orchestrator finished" if outcome == "success" else "worker-1 used all 3 turns",
    }
    return bundle(root, None, task["deliverables"], status, task["prompt"]), have + (outcome == "success")


def evaluator_conversation(rng: random.Random, task: dict, scratch: Path) -> tuple[list[dict], None]:
    """The verdict request exactly as `compare.judge` sends it; the fuller workspace wins, else a tie."""

    bundle_a, score_a = _workspace_bundle(rng, task, scratch / "a")
    bundle_b, score_b = _workspace_bundle(rng, task, scratch / "b")
    winner = "A" if score_a > score_b else "B" if score_b > score_a else "tie"
    if rng.random() < 0.4:  # a tiny model cannot see the rule anyway: keep its answers mixed
        winner = rng.choice(["A", "B", "tie"])
    rationale = {
        "A": "A has more of the deliverables.",
        "B": "B has more of the deliverables.",
        "tie": "Both have the same files.",
    }[winner]
    user = verdict_request(task["prompt"], bundle_a, bundle_b)
    reply = json.dumps({"winner": winner, "rationale": rationale})
    return [
        {"role": "system", "content": EVALUATOR_SYSTEM},
        {"role": "user", "content": user},
        {"role": "assistant", "content": reply},
    ], None


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
    inp = ob.BriefInput(
        task=task["prompt"],
        current=current,
        designs=designs,
        rows=rows,
        evidence=evidence,
        status=status,
        best=best,
        best_case="best_only_won",
        champion=won[0] if won else None,
    )
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
