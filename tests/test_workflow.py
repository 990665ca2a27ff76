"""Workflows as data: validation errors name paths, rendering, the upstream importer, proposals."""

import json

import pytest

from mass_jobs.config.task_spec import Workflow
from mass_jobs.spec.upstream_format import UPSTREAM_MARKER, import_upstream
from mass_jobs.spec.workflow import (
    DEFAULT_WORKFLOW,
    DIRECTIVE_HEADER,
    SEPARATOR,
    TEACHER_DIRECTIVE,
    WorkflowError,
    diff_workflows,
    parse_proposal,
    render_workflow,
    teacher_prompt,
    teacher_prompt_parts,
    validate_workflow,
    workflow_prompt_parts,
)

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

UPSTREAM = f"""Build a momentum backtest on prices.csv and write results/metrics.json.
Report the Sharpe ratio.

{UPSTREAM_MARKER}
[
  {{"agent_id": "Orchestrator", "role": "lead", "instruction": "Coordinate the team."}},
  {{"agent_id": "Data Engineer", "role": "data", "instruction": "Load and clean prices.csv."}},
  {{"agent_id": "data_engineer", "role": "data-2", "instruction": "Second data worker."}}
]
"""


def test_upstream_import_splits_prompt_and_agents():
    prompt, wf = import_upstream(UPSTREAM)
    assert prompt == "Build a momentum backtest on prices.csv and write results/metrics.json.\nReport the Sharpe ratio."
    assert [a.id for a in wf.agents] == ["orchestrator", "data-engineer", "data-engineer-2"]
    assert [a.role for a in wf.agents] == ["lead", "data", "data-2"]
    assert wf.hops == []


@pytest.mark.parametrize(
    "text,needle",
    [
        ("just a task", "was not found"),
        (f'task\n{UPSTREAM_MARKER}\n[{{"agent_id": 1}}', "not JSON"),
        (f'task\n{UPSTREAM_MARKER}\n[{{"agent_id": "a", "role": "r"}}]', "upstream agents[0].instruction"),
        (f"task\n{UPSTREAM_MARKER}\n[]", "non-empty JSON list"),
        (f'{UPSTREAM_MARKER}\n[{{"agent_id": "a", "role": "r", "instruction": "i"}}]', "empty"),
    ],
    ids=["no-marker", "bad-json", "missing-instruction", "empty-list", "no-task-text"],
)
def test_upstream_import_errors(text, needle):
    with pytest.raises(WorkflowError) as e:
        import_upstream(text)
    assert needle in str(e.value)


def test_validation_names_every_bad_path():
    with pytest.raises(WorkflowError) as e:
        validate_workflow({"agents": [{"id": "Bad Id", "role": "r"}], "extra": 1}, "proposal")
    assert e.value.errors == [
        '$.proposal.agents[0].id: expected a string matching ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, found string "Bad Id"',
        "$.proposal.agents[0].instruction: required key is missing",
        "$.proposal.extra: unknown key; expected one of: agents, hops",
    ]
    with pytest.raises(WorkflowError) as e:
        validate_workflow(
            {
                "agents": [{"id": "a", "role": "r", "instruction": "i"}, {"id": "a", "role": "r", "instruction": "i"}],
                "hops": [{"caller": "a", "callee": "ghost"}],
            }
        )
    assert len(e.value.errors) == 2
    assert "$.workflow.agents[1].id" in e.value.errors[0] and "$.workflow.hops[0].callee" in e.value.errors[1]


def test_default_workflow_is_valid_and_renders_every_field():
    wf = validate_workflow(DEFAULT_WORKFLOW.model_dump(mode="json"))
    assert wf == DEFAULT_WORKFLOW and len(wf.agents) == 3 and wf.agents[0].id == "orchestrator"
    text = render_workflow(wf)
    for a in wf.agents:
        assert a.instruction in text and a.contract in text
    assert "1. orchestrator -> implementer" in text and "on failure: back to implementer" in text
    assert render_workflow(wf) == text  # deterministic


def test_teacher_prompt_pieces_join_exactly():
    parts = teacher_prompt_parts("  Solve it.  ", DEFAULT_WORKFLOW)
    assert parts.task == "Solve it."
    assert parts.workflow == render_workflow(DEFAULT_WORKFLOW)
    assert parts.directive == f"{DIRECTIVE_HEADER}\n{TEACHER_DIRECTIVE}"
    full = teacher_prompt("  Solve it.  ", DEFAULT_WORKFLOW)
    assert full == parts.task + SEPARATOR + parts.workflow + SEPARATOR + parts.directive
    # the render step removes exactly these two pieces and gets the bare task back
    assert full.replace(SEPARATOR + parts.workflow, "").replace(SEPARATOR + parts.directive, "") == "Solve it."
    # the paper's seven points: real delegation and no code by the orchestrator, foreground only, one step
    # at a time, self-contained assignments, check and narrow re-delegation, bounded work, a final summary
    for duty in (
        "delegation tool",
        "write\n   no pipeline or analysis code yourself",
        "Foreground only",
        "predecessor",
        "self-contained",
        "Check returned artifacts",
        "narrowed scope",
        "Bounded work",
        "do not end while a worker is still running",
        "final answer summarises every worker call",
    ):
        assert duty in TEACHER_DIRECTIVE
    assert [line.split(".")[0] for line in TEACHER_DIRECTIVE.splitlines() if line[:1].isdigit()] == list("1234567")
    assert teacher_prompt("t", DEFAULT_WORKFLOW, directive="Be careful.").endswith(f"{DIRECTIVE_HEADER}\nBe careful.")
    assert workflow_prompt_parts("t", None).text == "t"


def test_parse_proposal_accepts_fenced_bare_and_upstream_lists():
    wf = {"agents": [{"id": "lead", "role": "lead", "instruction": "lead", "contract": "report.md"}], "hops": []}
    assert (
        parse_proposal(f'<think>{{"agents": 1}}</think>Here:\n```json\n{json.dumps(wf)}\n```').agents[0].contract
        == "report.md"
    )
    assert parse_proposal("Sure. " + json.dumps({"workflow": wf}) + " done").agents[0].id == "lead"
    upstream = [{"agent_id": "Lead", "role": "r", "instruction": "i"}]
    assert parse_proposal(json.dumps(upstream)).agents[0].id == "lead"


@pytest.mark.parametrize(
    "reply,needle",
    [
        ("", "empty"),
        ("I would add a reviewer.", "no JSON object"),
        ('{"agents": [{"id": "x", "role": "r"}]}', "$.proposal.agents[0].instruction: required key is missing"),
    ],
    ids=["empty", "prose", "invalid"],
)
def test_parse_proposal_errors(reply, needle):
    with pytest.raises(WorkflowError) as e:
        parse_proposal(reply)
    assert needle in str(e.value)


def test_diff_workflows_lists_changes():
    old = DEFAULT_WORKFLOW
    new = Workflow.model_validate(
        {
            "agents": [
                old.agents[0].model_dump(),
                {**old.agents[1].model_dump(), "contract": "more"},
                {"id": "tester", "role": "t", "instruction": "test"},
            ]
        }
    )
    assert diff_workflows(old, new) == [
        "added agent tester (t)",
        "removed agent reviewer",
        "changed contract of implementer",
        "hops changed (2 -> 0)",
    ]
    assert diff_workflows(None, old) == ["initial version"]
    assert diff_workflows(old, old) == ["no change"]


def test_qwen_codes_directive_names_its_delegation_call_and_keeps_the_seven_requirements():
    from mass_jobs.spec.workflow import QWEN_CODE_DIRECTIVE, TEACHER_DIRECTIVE, teacher_directive

    assert teacher_directive("builtin") == TEACHER_DIRECTIVE and teacher_directive("qwen-code") == QWEN_CODE_DIRECTIVE
    for needed in ("`agent`", 'subagent_type: "general-purpose"', "run_in_background: false"):
        assert needed in QWEN_CODE_DIRECTIVE and needed not in TEACHER_DIRECTIVE
    numbered = [line.split(".", 1)[0] for line in QWEN_CODE_DIRECTIVE.splitlines() if line[:1].isdigit()]
    assert numbered == ["1", "2", "3", "4", "5", "6", "7"]
    assert QWEN_CODE_DIRECTIVE.split("\n3. ", 1)[1] == TEACHER_DIRECTIVE.split("\n3. ", 1)[1]
