"""`search.workflow_format: upstream`: the paper's task text with its design block rewritten in place.

The parity half runs a transcription of the paper's code (`iterate_multi_agent_prompt.py`:
`_read_query_template`, `_render_query_with_design`, `_normalize_generated_design_block`; the teacher
prompt of `mass/pipeline.py`'s `collect`) beside this project's on the same grid of task layouts and
optimizer replies. The run half searches, collects and strips through the real harness with a
scripted endpoint (a test fixture) and checks each prompt against the transcription.
"""

from __future__ import annotations

import itertools
import json

import pytest

from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.spec.upstream_design import DesignTemplate, parse_design_reply
from mass_jobs.spec.upstream_format import import_upstream
from mass_jobs.spec.workflow import WorkflowError, teacher_directive
from mass_jobs.spec.workflow_docs import teacher_parts
from mass_jobs.steps.collect import run_collect
from mass_jobs.steps.render_sft import load_episode
from mass_jobs.steps.search import Search
from mass_jobs.steps.sft_threads import is_lead, rebuild_threads, strip_teacher_prompt, teacher_text_left
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode

START = "Create an agent team with following agent candidates to solve this problem:"
END = "Use uv for all Python workflows"


# ---------------------------------------------------------------- the paper's code, transcribed


def paper_template(raw: str) -> tuple[str, str, str, str]:
    """(before, design, after, task text): the split of the paper's `_read_query_template`."""
    start = raw.find(START)
    if start < 0:
        raise ValueError("start marker not found")
    end = raw.rfind(END)  # the last one: the phrase may sit inside the block
    if end < 0:
        raise ValueError("end marker not found")
    if end <= start:
        raise ValueError("end before start")
    before, design, after = raw[:start], raw[start:end].strip(), raw[end:]
    task = before.rstrip()
    if "\\n" in task:
        task = task.replace("\\n", "\n")
    return before, design, after, task.strip()


def paper_render(before: str, after: str, design: str) -> str:
    return f"{before}{design.strip()}\n\n{after.lstrip()}"


def paper_cut(design_text: str, after: str) -> str:
    text = design_text.strip()
    if not text.startswith(START):
        raise RuntimeError("missing design block prefix")
    after_prefix = after.lstrip()
    if after_prefix:
        at = text.find(after_prefix[:200])
        if at >= 0:
            return text[:at].rstrip()
    at = text.find(END)
    if at >= 0 and at >= int(0.7 * len(text)):
        text = text[:at].rstrip()
    return text


def paper_teacher(query: str, directive_file: str) -> str:
    return query.rstrip() + "\n\n" + directive_file


# ---------------------------------------------------------------- the grid

AGENTS = [
    {"agent_id": "agent_lead", "role": "Lead", "instruction": "Plan, delegate and check."},
    {"agent_id": "agent_writer", "role": "Writer", "instruction": "Write the files you are assigned."},
]
# the end phrase inside the block too: the split must take the last one
AGENTS_WITH_PHRASE = AGENTS + [{"agent_id": "agent_env", "role": "Env", "instruction": f"{END} you run."}]
BEFORES = [
    "Fit a model to data.csv.\\n\\nDeliverables: report.md (precision@k).\n\n",
    "Fit a model to data.csv and report precision@k.\n",
    "Fit a model. Report precision@k. \n\n",
]
GAPS = ["\n\n", "\n", "\n\n\n"]
AFTERS = [
    f"{END}: run code with uv run.\nIn logs.txt, list every agent you started and its role. ",
    f"{END}; keep a log in logs.txt.",
    f"{END}.\n\nWrite logs.txt as you go.\n",
]


def layouts():
    for before, agents, gap, after in itertools.product(BEFORES, (AGENTS, AGENTS_WITH_PHRASE), GAPS, AFTERS):
        yield before + START + " \n" + json.dumps(agents, indent=2) + gap + after


def replies(after: str) -> list[str]:
    block = (
        START
        + "\n"
        + json.dumps(
            AGENTS[:1]
            + [{"agent_id": "agent_checker", "role": "Checker", "instruction": "Rerun every number of the report."}],
            indent=2,
        )
    )
    long_tail = " ".join(["The checker reports to the lead."] * 12)
    return [
        block,
        block + "\n\n" + after.lstrip(),
        f"  {block}\n{END} for the checker too.  ",
        f"{block}\n{END} when you test.\n{long_tail}",
        block + "\n\n" + after.lstrip()[:150],
        "An improved team:\n" + block,
    ]


CASES = list(layouts())


def test_the_grid_covers_every_branch_of_the_papers_split_and_cut():
    cut_by_tail = cut_by_phrase = phrase_kept = refused = phrase_inside = 0
    for raw in CASES:
        before, design, after, _ = paper_template(raw)
        phrase_inside += END in design
        for reply in replies(after):
            try:
                kept = paper_cut(reply, after)
            except RuntimeError:
                refused += 1
                continue
            cut_by_tail += after.lstrip()[:200] in reply.strip()
            cut_by_phrase += END in reply and END not in kept and after.lstrip()[:200] not in reply.strip()
            phrase_kept += END in kept
    assert len(CASES) == 54 and phrase_inside == 27
    assert min(cut_by_tail, cut_by_phrase, phrase_kept, refused) > 0, (cut_by_tail, cut_by_phrase, phrase_kept, refused)


@pytest.mark.parametrize("raw", CASES, ids=[f"layout-{i}" for i in range(len(CASES))])
def test_split_render_cut_and_teacher_prompt_are_the_papers(raw):
    before, design, after, task = paper_template(raw)
    t = DesignTemplate.parse(raw)
    assert (t.before, t.design, t.after, t.task_text) == (before, design, after, task)
    assert t.prompt(design) == raw  # version 0 runs the task file as written
    directive = "Run the team for real.\nFinish cleanly.\n"
    for reply in replies(after):
        try:
            expected = paper_cut(reply, after)
        except RuntimeError:
            with pytest.raises(WorkflowError, match="must start with"):
                t.cut(reply)
            with pytest.raises(WorkflowError, match="must start with"):
                parse_design_reply(json.dumps({"improved_multi_agent_design": reply}), t)
            continue
        assert t.cut(reply) == expected
        # the reply as the paper's optimizer writes it: the block in a JSON object beside its explanation
        doc = {"improved_multi_agent_design": reply, "changes_from_previous": ["added a checker"], "evidence_used": []}
        got, explanation = parse_design_reply(f"<think>the checker first</think>\n{json.dumps(doc)}", t)
        assert got == expected and explanation == {"changes_from_previous": ["added a checker"], "evidence_used": []}
        query = paper_render(before, after, expected)
        assert t.prompt(expected) == query
        assert t.teacher_prompt(expected, directive) == paper_teacher(query, directive)


@pytest.mark.parametrize("raw", CASES, ids=[f"layout-{i}" for i in range(len(CASES))])
def test_a_teacher_prompt_strips_back_to_the_bare_task(raw, tmp_path):
    """The render step's rule on the upstream layout: the exact teacher prompt becomes the bare task
    (upstream's own bare file, here what `import_upstream` derives); a harness-changed one (qwen-code's
    `precision @k`) loses the block, the rules that name agents and the directive."""
    from mass_jobs.config.task_spec import Task
    from mass_jobs.steps.sft_threads import EpisodeTrace

    bare, _ = import_upstream(raw)
    task = Task(id="t1", split="train", prompt=bare, upstream_text=raw)
    t = DesignTemplate.parse(raw)
    for design in (t.design, t.cut(replies(t.after)[0])):
        parts = teacher_parts(task, {"design": design}, "Run the team for real.")
        pieces = (parts.workflow, parts.directive, *parts.agent_rules)
        ep = EpisodeTrace("t1", 0, [], bare_prompt=bare, teacher_prompt=parts.text, strip_pieces=pieces)
        out, n = strip_teacher_prompt([{"role": "user", "content": parts.text}], parts.text, bare, pieces)
        assert n == 1 and out[0]["content"] == bare
        sent = parts.text.strip().replace("precision@k", "precision @k")
        out, n = strip_teacher_prompt([{"role": "user", "content": sent}], parts.text, bare, pieces)
        assert n == 1 and teacher_text_left(out, ep) is None
        assert out[0]["content"].split() == bare.replace("precision@k", "precision @k").split()


def test_a_native_task_gets_a_block_from_its_workflow_and_no_rules():
    from mass_jobs.config.task_spec import Task
    from mass_jobs.spec.workflow import DEFAULT_WORKFLOW

    task = Task(id="t1", split="train", prompt="Write report.md.", workflow=DEFAULT_WORKFLOW)
    t = DesignTemplate.of_task(task)
    assert t.before == "Write report.md.\n\n" and t.after == "" and t.design.startswith(START)
    agents = json.loads(t.design[len(START) :])
    assert [a["agent_id"] for a in agents] == [a.id for a in DEFAULT_WORKFLOW.agents]
    assert "Output to orchestrator: " + DEFAULT_WORKFLOW.agents[1].contract in agents[1]["instruction"]
    assert "Call order:\n1. orchestrator -> implementer" in agents[0]["instruction"]
    assert t.prompt(t.design) == paper_render(t.before, t.after, t.design)
    # with no rules to copy, only the end phrase near the end is cut
    assert t.cut(t.design + f"\n{END}.") == t.design


def test_the_spec_refuses_an_upstream_text_with_no_block_under_the_upstream_format(tmp_path, capsys):
    import yaml

    from mass_jobs.commands.cli import main

    raw = next(iter(CASES))
    (tmp_path / "model").mkdir()
    doc = {
        "name": "u",
        "model": {"base": "model"},
        "store": {"uri": "file://runs"},
        "search": {"workflow_format": "upstream"},
        "tasks": [
            {"id": "t1", "split": "train", "prompt": "Fit a model.", "upstream_text": raw.replace(END, "Use pip")}
        ],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 2
    err = capsys.readouterr().err
    assert "$.tasks[0].upstream_text: expected the line 'Create an agent team" in err
    doc["search"]["workflow_format"] = "structured"  # the structured format never reads it
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 0


def test_an_upstream_task_file_keeps_its_text(tmp_path):
    from mass_jobs.spec.load import load_spec

    raw = CASES[0]
    (tmp_path / "q1.txt").write_text(raw)
    (tmp_path / "model").mkdir()
    (tmp_path / "spec.yaml").write_text(
        json.dumps(
            {
                "name": "u",
                "model": {"base": "model"},
                "store": {"uri": "file://runs"},
                "search": {"workflow_format": "upstream"},
                "tasks": [{"file": "q1.txt", "format": "upstream", "id": "q1", "split": "train"}],
            }
        )
    )
    task = load_spec(tmp_path / "spec.yaml").task("q1")
    assert task.upstream_text == raw and task.prompt == import_upstream(raw)[0]


# ---------------------------------------------------------------- a run


UPSTREAM_TASK = (
    "Write report.md with your score.\\n\\nDeliverables: report.md.\n\n"
    + START
    + " \n"
    + json.dumps(AGENTS_WITH_PHRASE, indent=2)
    + "\n\n"
    + AFTERS[0]
)


def test_a_search_collection_and_render_in_the_upstream_format(make_store, inner_spec, judging_endpoint):
    store = make_store("file")
    bare, _ = import_upstream(UPSTREAM_TASK)
    spec = inner_spec(
        store,
        search={"iterations": 1, "workflow_format": "upstream"},
        tasks=[
            {
                "id": "t1",
                "split": "train",
                "prompt": bare,
                "upstream_text": UPSTREAM_TASK,
                "deliverables": ["report.md"],
            }
        ],
    )
    ep = judging_endpoint()
    before, design0, after, task_text = paper_template(UPSTREAM_TASK)
    block = (
        START
        + "\n"
        + json.dumps(
            AGENTS[:1] + [{"agent_id": "agent_checker", "role": "Checker", "instruction": "Rerun the numbers."}],
            indent=2,
        )
    )
    add_episodes(ep, episode(1), episode(5))
    ep.add(
        "optimizer",
        Reply.text(json.dumps({"agents": [{"id": "orchestrator", "role": "lead", "instruction": "Lead."}]})),
        Reply.text(
            json.dumps(
                {
                    "improved_multi_agent_design": block + "\n\n" + after,  # copied the rules too
                    "changes_from_previous": ["a checker reruns the numbers"],
                }
            )
        ),
    )
    add_episodes(ep, episode(7))
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    state = Search(ctx, 0, "t1", client, episode_runner(spec, ep.endpoint)).run()

    root = "inner/gen-0/search/t1"
    # v0 is the task text as written; v1 the paper's rendering of the kept block
    assert store.get_bytes(f"{root}/iter-0/prompt.txt").decode() == UPSTREAM_TASK
    assert store.get_bytes(f"{root}/iter-1/prompt.txt").decode() == paper_render(
        before, after, paper_cut(block + "\n\n" + after, after)
    )
    assert store.get_bytes(f"{root}/reference/prompt.txt").decode() == bare
    assert store.get_json(f"{root}/iter-1/workflow.json") == {"design": block}
    proposal = store.get_json(f"{root}/iter-1/proposal.json")
    assert proposal["attempts"] == 2 and "improved_multi_agent_design" in proposal["errors"][0]
    assert proposal["explanation"] == {"changes_from_previous": ["a checker reruns the numbers"]}
    assert state.elite == 1 and state.elite_workflow == {"design": block}
    assert state.feedback[1].changes == ["design block: 4 line(s) added, 9 removed, in 2 place(s)"]
    # the optimizer saw the task alone, the block as text, the rules apart, and the paper's reply contract
    requests = [r["body"]["messages"] for r in ep.requests if r["key"] == "optimizer"]
    system, brief = requests[0][0]["content"], requests[0][1]["content"]
    assert '"improved_multi_agent_design"' in system and START in system and '"hops"' not in system
    assert f"TASK:\n{task_text}\n\n" in brief and f"CURRENT WORKFLOW (v0):\n{design0}\n\n" in brief
    assert f"RULES AFTER THE DESIGN BLOCK (part of the task, kept as they are):\n{after.strip()}" in brief
    assert requests[1][-1]["content"].endswith("its design block starting with the agent-team line.")

    # the teacher runs the champion's block with the directive after it, as the paper's collect does
    ep.add("orchestrator", *[Reply.call("finish", summary="nothing to delegate") for _ in range(4)])
    run_collect(ctx, 0, "t1", episode_runner(spec, ep.endpoint))
    teacher = paper_teacher(paper_render(before, after, block), teacher_directive(spec.execution.harness))
    doc = store.get_json("inner/gen-0/collect/t1/ep-0/episode.json")
    assert doc["prompt"] == teacher and doc["prompt_parts"]["agent_rules"] == [AFTERS[0].splitlines()[1].strip()]
    assert ep.requests[-1]["body"]["messages"][1]["content"] == teacher
    # and the render step finds it in the orchestrator's thread and leaves the bare task
    trace = load_episode(ctx, 0, spec.task("t1"), 0)
    threads = rebuild_threads(trace.records, trace.harness, False, spec.sft.thread_roles, trace.teacher_prompt)
    lead = next(t for t in threads if is_lead(t))
    messages, n = strip_teacher_prompt(lead.messages, trace.teacher_prompt, trace.bare_prompt, trace.strip_pieces)
    first = next(m for m in messages if m["role"] == "user")
    assert n == 1 and first["content"] == bare and teacher_text_left(messages, trace) is None
