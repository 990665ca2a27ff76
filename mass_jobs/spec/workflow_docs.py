"""A workflow version as the search stores it (`workflow.json`, the state's records): structured, or
an upstream design block (`search.workflow_format`).

Structured: the workflow JSON (agents, hops), rendered as a section after the task. Upstream:
`{"design": "<the free-text design block>"}`, put in place inside the task text
(`spec/upstream_design.py`). Every step that reads a stored version goes through here, so the
version's own shape decides how it is shown, not the spec it is read under.
"""

from __future__ import annotations

import difflib

from mass_jobs.config.task_spec import Task, Workflow
from mass_jobs.spec.upstream_design import DesignTemplate, parse_design_reply
from mass_jobs.spec.workflow import (
    DEFAULT_WORKFLOW,
    PromptParts,
    diff_workflows,
    parse_proposal,
    render_workflow,
    teacher_prompt_parts,
    workflow_json,
    workflow_prompt_parts,
)

DESIGN = "design"
RETRY = {
    "structured": "Reply with the corrected workflow JSON object only.",
    "upstream": "Reply with the corrected JSON object only, its design block starting with the agent-team line.",
}


def is_design(doc: dict) -> bool:
    return DESIGN in doc


def initial(task: Task, fmt: str) -> dict:
    """Version 0: the task's workflow (the default team when it has none) in the search's format."""
    if fmt == "upstream":
        return {DESIGN: DesignTemplate.of_task(task).design}
    return workflow_json(task.workflow or DEFAULT_WORKFLOW)


def prompt(task: Task, doc: dict) -> str:
    """A search rollout's prompt."""
    if is_design(doc):
        return DesignTemplate.of_task(task).prompt(doc[DESIGN])
    return workflow_prompt_parts(task.prompt, Workflow.model_validate(doc)).text


def teacher_parts(task: Task, doc: dict, directive: str) -> PromptParts:
    """The collection prompt and the pieces the render step strips from it."""
    if not is_design(doc):
        return teacher_prompt_parts(task.prompt, Workflow.model_validate(doc), directive)
    t = DesignTemplate.of_task(task)
    return PromptParts(
        t.before.strip(),
        doc[DESIGN].strip(),
        directive.strip(),
        whole=t.teacher_prompt(doc[DESIGN], directive),
        agent_rules=t.agent_lines,
    )


def text_of(doc: dict) -> str:
    """The version as the prompt shows it (the block, or the rendered section)."""
    return doc[DESIGN] if is_design(doc) else render_workflow(Workflow.model_validate(doc))


def changes(old: dict | None, new: dict) -> list[str]:
    """What changed from one version to the next, in a few words (fed back in the state)."""
    if old is None:
        return ["initial version"]
    if is_design(old) != is_design(new):
        return ["format changed"]
    if not is_design(new):
        return diff_workflows(Workflow.model_validate(old), Workflow.model_validate(new))
    a, b = old[DESIGN].splitlines(), new[DESIGN].splitlines()
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return ["no change"]
    return [
        f"design block: {sum(j2 - j1 for _, _, _, j1, j2 in ops)} line(s) added, "
        f"{sum(i2 - i1 for _, i1, i2, _, _ in ops)} removed, in {len(ops)} place(s)"
    ]


def parse_reply(task: Task, fmt: str, text: str | None) -> tuple[dict, dict]:
    """(the proposed version, the reply's explanation) from an optimizer reply; WorkflowError says why not."""
    if fmt == "upstream":
        design, explanation = parse_design_reply(text, DesignTemplate.of_task(task))
        return {DESIGN: design}, explanation
    return workflow_json(parse_proposal(text)), {}
