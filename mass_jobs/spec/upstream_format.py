"""Upstream MASS task text: the task, the marker line, the JSON agent list -> (bare prompt, Workflow).

Read by the spec loader (`format: upstream` task files) and `mass import upstream`; it needs only
the models, so the spec loader and the workflow module do not import each other through it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mass_jobs.config.errors import WorkflowError
from mass_jobs.config.shared import ID_PATTERN
from mass_jobs.config.task_spec import UPSTREAM_RULES, Agent, Workflow

UPSTREAM_MARKER = "Create an agent team with following agent candidates to solve this problem:"
# the general rules after the agent list open with this phrase (its last occurrence ends the design block)
DESIGN_END = UPSTREAM_RULES


def _agent_id(raw: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:36].strip("-") or "agent"
    ident, n = base, 2
    while ident in taken:
        ident, n = f"{base}-{n}", n + 1
    assert re.match(ID_PATTERN, ident)
    return ident


def agents_from_upstream(items: Any, where: str = "agents") -> Workflow:
    """A list of upstream {agent_id, role, instruction} objects (orchestrator first) as a Workflow."""
    if not isinstance(items, list) or not items:
        raise WorkflowError([f"{where}: expected a non-empty JSON list of {{agent_id, role, instruction}}"])
    errors: list[str] = []
    agents: list[Agent] = []
    taken: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            errors.append(f"{where}[{i}]: expected an object, got {type(item).__name__}")
            continue
        unknown = sorted(set(item) - {"agent_id", "role", "instruction"})
        if unknown:
            errors.append(f"{where}[{i}]: unknown keys {unknown}")
        for key in ("agent_id", "role", "instruction"):
            if not isinstance(item.get(key), str) or not item.get(key, "").strip():
                errors.append(f"{where}[{i}].{key}: expected a non-empty string")
        if errors:
            continue
        ident = _agent_id(item["agent_id"], taken)
        taken.add(ident)
        agents.append(Agent(id=ident, role=item["role"].strip(), instruction=item["instruction"].strip()))
    if errors:
        raise WorkflowError(errors)
    return Workflow(agents=agents)


def import_upstream(text: str) -> tuple[str, Workflow]:
    """Split an upstream MASS task file into (bare task prompt, initial workflow).

    Upstream files are `<task text>`, the marker line, the JSON agent list, then often general
    instructions ("Use uv ...", "write your history log ...") and a line on logging the team's
    agents. The bare prompt is the task text and the general instructions without the lines that
    speak of agents (a bare run has none), which is exactly upstream's own bare prompt
    (tasks/bare/ next to tasks/initial/, every pair).
    """
    idx = text.find(UPSTREAM_MARKER)
    if idx < 0:
        raise WorkflowError([f"upstream task: the line {UPSTREAM_MARKER!r} was not found"])
    prompt = text[:idx].strip()
    if not prompt:
        raise WorkflowError(["upstream task: the task text before the agent list is empty"])
    rest = text[idx + len(UPSTREAM_MARKER) :].strip()
    try:
        items, end = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError as e:
        raise WorkflowError(
            [f"upstream task: agent list is not JSON ({e.msg} at line {e.lineno} column {e.colno})"]
        ) from None
    after = "\n".join(
        line for line in rest[end:].strip().splitlines() if not re.search(r"\bagents?\b", line, flags=re.I)
    ).strip()
    return (f"{prompt}\n\n{after}" if after else prompt), agents_from_upstream(items, "upstream agents")
