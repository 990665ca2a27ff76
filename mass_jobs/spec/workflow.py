"""Workflows as data: validate, render as prompt text, teacher prompt (upstream files: upstream_format).

A workflow (agents with role, instruction and output contract; hops = call order) is JSON validated
against the schema generated from `mass_jobs.config.task_spec.Workflow`, then rendered into text that is
appended to the task prompt. The prompt pieces are exposed separately (`PromptParts`) so the
render step can remove exactly the workflow and directive from the orchestrator's first input.

Used by `mass search` and `mass collect`; no command of its own.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from mass_jobs.config.errors import WorkflowError
from mass_jobs.config.task_spec import Workflow
from mass_jobs.spec.issues import schema_issues
from mass_jobs.spec.rules import workflow_issues
from mass_jobs.spec.upstream_format import agents_from_upstream

SEPARATOR = "\n\n"
WORKFLOW_HEADER = "## Workflow"
DIRECTIVE_HEADER = "## Teacher execution directive"

DEFAULT_WORKFLOW = Workflow.model_validate(
    {
        "agents": [
            {
                "id": "orchestrator",
                "role": "orchestrator",
                "instruction": "Plan the work, split it into self-contained assignments, delegate them to the "
                "workers, check what they return and assemble the final deliverables.",
                "contract": "Every deliverable the task asks for exists in the workspace; a short report says "
                "what was done and what is known to be missing.",
            },
            {
                "id": "implementer",
                "role": "implementer",
                "instruction": "Write and run the code or analysis for the assignment you receive; save results "
                "as files in the workspace.",
                "contract": "Return the paths of the files written, the commands run and any errors.",
            },
            {
                "id": "reviewer",
                "role": "reviewer",
                "instruction": "Check the files named in your assignment: run them, verify numbers are finite "
                "and plausible, and list concrete defects.",
                "contract": "Return pass or fail per file with the reason; never edit the files you review.",
            },
        ],
        "hops": [
            {
                "caller": "orchestrator",
                "callee": "implementer",
                "returns": "files and run log",
                "on_failure": "implementer",
            },
            {
                "caller": "orchestrator",
                "callee": "reviewer",
                "returns": "pass/fail per file",
                "on_failure": "implementer",
            },
        ],
    }
)

# The paper's seven execution requirements (SakanaAI/mass, tasks/teacher_directive.txt), worded for
# any harness: "the delegation tool" is `delegate` in the built-in harness and `agent` in qwen-code.
TEACHER_DIRECTIVE = """\
Execute the workflow above as a team, not as one voice:
1. Run the team for real: call every role other than yours as a separate worker through the
   delegation tool; acting out a role in your own turn does not count. You, the orchestrator, write
   no pipeline or analysis code yourself: you set up, delegate, check and assemble.
2. Foreground only: wait for each worker's report before you go on; never start a worker in the
   background.
3. One step at a time: start a worker only when the files its predecessor must produce exist in the
   workspace; start several at once only for independent work on separate files.
4. Make each assignment self-contained: a worker sees nothing but its assignment and the files. Give
   the role's instruction, the workspace path, the exact files to create or change, the earlier outputs
   to use, the command that checks the work, and the report expected back (files written, commands run
   and their results, key numbers, known problems).
5. Check returned artifacts yourself (run the entry point, open the files, read the numbers) before
   depending on them. When one fails a check, re-delegate to the same role with a narrowed scope that
   names the defect, instead of fixing it yourself or redoing the whole step.
6. Bounded work: give each worker one deliverable it can finish in one run (a few files and one
   check); split a large role into several calls in sequence.
7. Finish cleanly: do not end while a worker is still running.
   Your final answer summarises every worker call: the role, what it was asked, how it ended and
   what you checked."""


# The same requirements for qwen-code (the paper's harness), naming its delegation call as upstream's
# directive does: the `agent` tool, the general-purpose sub-agent, in the foreground.
QWEN_CODE_DIRECTIVE = """\
Execute the workflow above as a team, not as one voice:
1. Run the team for real: call every role other than yours as a separate worker with the `agent`
   tool and `subagent_type: "general-purpose"`; acting out a role in your own turn does not count.
   You, the orchestrator, write no pipeline or analysis code yourself: you set up, delegate, check
   and assemble.
2. Foreground only: give every `agent` call `run_in_background: false` and wait for its report
   before you go on.
3. """ + TEACHER_DIRECTIVE.split("\n3. ", 1)[1]


def teacher_directive(harness: str) -> str:
    """The built-in directive for a harness: qwen-code's names its `agent` call."""
    return QWEN_CODE_DIRECTIVE if harness == "qwen-code" else TEACHER_DIRECTIVE


class PromptParts(NamedTuple):
    """The exact pieces of a prompt; `text` joins them with SEPARATOR (empty pieces left out), unless
    the prompt is laid out otherwise (`whole`: an upstream design block sits inside the task text)."""

    task: str
    workflow: str
    directive: str
    whole: str = ""
    agent_rules: tuple[str, ...] = ()  # more text the bare prompt lacks (upstream rules that speak of agents)

    @property
    def text(self) -> str:
        return self.whole or SEPARATOR.join(p for p in (self.task, self.workflow, self.directive) if p)


# ---------------------------------------------------------------- validation


def validate_workflow(obj: Any, where: str = "workflow") -> Workflow:
    """Validate a workflow document (dict) and return the model; WorkflowError names every bad path.

    Same schema and error wording as the spec loader (`$.<where>.agents[0].id: expected ...`).
    """

    issues = schema_issues("workflow", obj, [where])
    if issues:
        raise WorkflowError([str(i) for i in issues])
    wf = Workflow.model_validate(obj)
    issues = workflow_issues(wf, f"$.{where}")
    if issues:
        raise WorkflowError([str(i) for i in issues])
    return wf


def workflow_json(wf: Workflow) -> dict:
    return wf.model_dump(mode="json")


# ---------------------------------------------------------------- rendering


def render_workflow(wf: Workflow) -> str:
    """The workflow as the text appended to the task prompt (deterministic)."""
    lines = [
        WORKFLOW_HEADER,
        "Agents (the first is the orchestrator; it calls the others through the delegation tool):",
    ]
    for n, a in enumerate(wf.agents, 1):
        lines.append(f"{n}. {a.id} (role: {a.role})")
        lines.append(f"   Instruction: {a.instruction}")
        if a.contract:
            lines.append(f"   Contract: {a.contract}")
    if wf.hops:
        lines.append("Hops (call order):")
        for n, h in enumerate(wf.hops, 1):
            text = f"{n}. {h.caller} -> {h.callee}"
            if h.returns:
                text += f"; returns: {h.returns}"
            if h.on_failure:
                text += f"; on failure: back to {h.on_failure} with a narrowed assignment"
            lines.append(text)
    return "\n".join(lines)


def workflow_prompt_parts(task_prompt: str, wf: Workflow | None) -> PromptParts:
    """Prompt of a search rollout: the task plus the workflow (bare task when wf is None)."""
    return PromptParts(task_prompt.strip(), render_workflow(wf) if wf is not None else "", "")


def teacher_prompt_parts(task_prompt: str, wf: Workflow, directive: str | None = None) -> PromptParts:
    text = (directive if directive is not None else TEACHER_DIRECTIVE).strip()
    return PromptParts(task_prompt.strip(), render_workflow(wf), f"{DIRECTIVE_HEADER}\n{text}")


def teacher_prompt(task_prompt: str, wf: Workflow, directive: str | None = None) -> str:
    """Task + elite workflow + teacher execution directive (the collection prompt)."""
    return teacher_prompt_parts(task_prompt, wf, directive).text


# ---------------------------------------------------------------- upstream importer


# ---------------------------------------------------------------- optimizer proposals


def json_candidates(text: str):
    """JSON values in a reply (fenced blocks first, then bare ones outside those already offered)."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S)
    for m in re.finditer(r"```(?:json)?\s*\n(.*?)```", text, flags=re.S):
        yield m.group(1).strip()
    decoder = json.JSONDecoder()
    end = 0
    for m in re.finditer(r"[\[{]", text):
        if m.start() < end:  # inside a value already offered: its parts are not proposals
            continue
        try:
            obj, length = decoder.raw_decode(text[m.start() :])
        except json.JSONDecodeError:
            continue
        end = m.start() + length
        yield obj


def parse_proposal(text: str | None) -> Workflow:
    """The workflow proposed in an optimizer reply; WorkflowError says why none was usable."""
    if not text or not text.strip():
        raise WorkflowError(["proposal: the reply is empty"])
    last_errors: list[str] | None = None
    for cand in json_candidates(text):
        if isinstance(cand, str):
            try:
                cand = json.loads(cand)
            except json.JSONDecodeError:
                continue
        if isinstance(cand, dict) and isinstance(cand.get("workflow"), dict):
            cand = cand["workflow"]
        try:
            if isinstance(cand, list):
                return agents_from_upstream(cand, "proposal")
            if isinstance(cand, dict) and "agents" in cand:
                return validate_workflow(cand, "proposal")
        except WorkflowError as e:
            last_errors = last_errors or e.errors
    if last_errors:
        raise WorkflowError(last_errors)
    raise WorkflowError(["proposal: no JSON object with an 'agents' list was found in the reply"])


def diff_workflows(old: Workflow | None, new: Workflow) -> list[str]:
    """Human-readable changes between two versions (fed back to the optimizer)."""
    if old is None:
        return ["initial version"]
    changes: list[str] = []
    before = {a.id: a for a in old.agents}
    after = {a.id: a for a in new.agents}
    for ident in after:
        if ident not in before:
            changes.append(f"added agent {ident} ({after[ident].role})")
    for ident in before:
        if ident not in after:
            changes.append(f"removed agent {ident}")
    for ident in after:
        if ident in before:
            for field in ("role", "instruction", "contract"):
                if getattr(before[ident], field) != getattr(after[ident], field):
                    changes.append(f"changed {field} of {ident}")
    if [a.id for a in old.agents if a.id in after] != [a.id for a in new.agents if a.id in before]:
        changes.append("reordered agents")
    if old.hops != new.hops:
        changes.append(f"hops changed ({len(old.hops)} -> {len(new.hops)})")
    return changes or ["no change"]
