"""The design block of an upstream MASS task (`search.workflow_format: upstream`): split, render, rewrite.

An upstream task text is `<task> <agent-team line> <JSON agent list ...> <rules>`: the design block
runs from the agent-team line to the last "Use uv for all Python workflows" (the phrase may also
occur inside the block), and the rules after it (uv, the history log) stay as written. A version of
the workflow is a free-text design block; the prompt is the task text with that block in place, and
the optimizer's reply carries a whole replacement block. The split, the rendering and how a reply is
cut back to a block follow the paper's code (`iterate_multi_agent_prompt.py`); tests/test_upstream_design.py
runs a transcription of it on the same inputs.

A task with no upstream text (a native task) gets a block made from its structured workflow: the
agent-team line and the agents as the upstream JSON list, the output contract and the call order
folded into the instructions, and no rules after it (its bare prompt has none).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mass_jobs.config.errors import WorkflowError
from mass_jobs.config.task_spec import Task, Workflow
from mass_jobs.spec.upstream_format import DESIGN_END, UPSTREAM_MARKER
from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, json_candidates

REPLY_KEY = "improved_multi_agent_design"
# the explanation the paper's optimizer gives beside the block: kept in proposal.json, read by nothing
REPLY_LISTS = (
    "changes_from_previous",
    "why_it_should_improve",
    "evidence_used",
    "expected_impact",
    "verification_checks",
)
# how close to its end a block may hold the end phrase for it to be cut there (a phrase further up is
# an instruction inside the block)
_END_CUT_FROM = 0.7
_TAIL_PROBE = 200


@dataclass(frozen=True)
class DesignTemplate:
    before: str  # the task text up to the agent-team line, as written
    design: str  # the initial design block, stripped
    after: str  # the rules from the last end phrase on, as written ("" when none)
    source: str | None = None  # the upstream text as written (an upstream task)

    @classmethod
    def parse(cls, text: str) -> DesignTemplate:
        start = text.find(UPSTREAM_MARKER)
        if start < 0:
            raise WorkflowError([f"upstream task: the line {UPSTREAM_MARKER!r} was not found"])
        end = text.rfind(DESIGN_END)
        if end < 0:
            raise WorkflowError([f"upstream task: the rules after the agent list ({DESIGN_END!r} ...) were not found"])
        if end <= start:
            raise WorkflowError([f"upstream task: {DESIGN_END!r} comes before the agent-team line"])
        return cls(text[:start], text[start:end].strip(), text[end:], text)

    @classmethod
    def of_task(cls, task: Task) -> DesignTemplate:
        if task.upstream_text is not None:
            return cls.parse(task.upstream_text)
        return cls(task.prompt.strip() + "\n\n", design_of(task.workflow), "")

    @property
    def task_text(self) -> str:
        """The task alone, as the paper's optimizer is shown it (escaped newlines read as newlines)."""
        text = self.before.rstrip()
        return (text.replace("\\n", "\n") if "\\n" in text else text).strip()

    @property
    def agent_lines(self) -> tuple[str, ...]:
        """The rules' lines that speak of agents: not in the bare prompt, so stripped with the block."""
        # stripped: the prompt's end is (a trailing space of the last line is not sent)
        return tuple(line.strip() for line in self.after.splitlines() if re.search(r"\bagents?\b", line, flags=re.I))

    def prompt(self, design: str) -> str:
        """The task text with `design` in place of the block (the initial block: the text as written)."""
        if self.source is not None and design.strip() == self.design:
            return self.source
        return f"{self.before}{design.strip()}\n\n{self.after.lstrip()}"

    def teacher_prompt(self, design: str, directive: str) -> str:
        """The collection prompt: the version's prompt, then the execution directive after a blank line."""
        return f"{self.prompt(design).rstrip()}\n\n{directive}"

    def cut(self, reply_design: str) -> str:
        """A proposed block as the search keeps it: it must open with the agent-team line; a copy of the
        rules after it (or the end phrase near its end) is cut off."""
        text = reply_design.strip()
        if not text.startswith(UPSTREAM_MARKER):
            raise WorkflowError([f"proposal: {REPLY_KEY} must start with {UPSTREAM_MARKER!r}"])
        tail = self.after.lstrip()
        if tail:
            at = text.find(tail[:_TAIL_PROBE])
            if at >= 0:
                return text[:at].rstrip()
        at = text.find(DESIGN_END)
        if at >= 0 and at >= int(_END_CUT_FROM * len(text)):
            text = text[:at].rstrip()
        return text


def design_of(wf: Workflow | None) -> str:
    """A structured workflow as an upstream design block (the default team when None)."""
    wf = wf or DEFAULT_WORKFLOW
    order = [
        f"{n}. {h.caller} -> {h.callee}"
        + (f"; returns: {h.returns}" if h.returns else "")
        + (f"; on failure: back to {h.on_failure}" if h.on_failure else "")
        for n, h in enumerate(wf.hops, 1)
    ]
    items = []
    for i, a in enumerate(wf.agents):
        text = a.instruction
        if a.contract:
            text += f"\nOutput to orchestrator: {a.contract}"
        if i == 0 and order:
            text += "\nCall order:\n" + "\n".join(order)
        items.append({"agent_id": a.id, "role": a.role, "instruction": text})
    return f"{UPSTREAM_MARKER}\n{json.dumps(items, indent=2, ensure_ascii=False)}"


def parse_design_reply(text: str | None, template: DesignTemplate) -> tuple[str, dict]:
    """(the proposed block, the reply's explanation lists) from an optimizer reply; WorkflowError says why not."""
    if not text or not text.strip():
        raise WorkflowError(["proposal: the reply is empty"])
    for cand in json_candidates(text):
        if isinstance(cand, dict) and REPLY_KEY in cand:
            if not isinstance(cand[REPLY_KEY], str):
                raise WorkflowError([f"proposal: {REPLY_KEY} must be a string (the whole design block)"])
            explanation = {k: cand[k] for k in REPLY_LISTS if isinstance(cand.get(k), list)}
            return template.cut(cand[REPLY_KEY]), explanation
    raise WorkflowError([f"proposal: no JSON object with {REPLY_KEY!r} was found in the reply"])
