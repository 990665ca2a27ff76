"""The upstream MASS task format: used as is (`format: upstream`, carrying id, split, deliverables,
guards and files), converted (`mass import upstream DIR`), and a clear error when `format` is
missing. Task texts here are written for the test, shaped like upstream's (task text, the marker
line, a JSON agent list, then general instructions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.cli import main
from mass_jobs.spec.load import load_spec
from mass_jobs.spec.upstream_format import UPSTREAM_MARKER, import_upstream

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

TASK = "Write fib.py that prints the first 10 Fibonacci numbers.\\n\\nDeliverables:\\n1) fib.py"
AGENTS = [
    {"agent_id": "agent_orchestrator", "role": "Lead", "instruction": "Plan and delegate."},
    {"agent_id": "agent_coder", "role": "Coder", "instruction": "Write the code."},
]
TAIL = "Use uv for all Python workflows. Write your plan in logs.txt."
TEAM = "In logs.txt, also list every agent you created and how the agents handed work to each other."


def upstream_text(task: str = TASK) -> str:
    """Shaped like upstream's initial/ files: the general instructions, then a line on the team."""
    return f"{task}\n\n{UPSTREAM_MARKER} \n{json.dumps(AGENTS, indent=2)}\n\n{TAIL}\n{TEAM} "


def spec_with(tmp_path: Path, *entries: dict) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    doc = {"name": "up", "model": {"base": "model"}, "tasks": list(entries), "store": {"uri": "file://runs"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    return tmp_path / "spec.yaml"


def test_instructions_after_the_agent_list_belong_to_the_prompt_but_not_those_on_the_team():
    """Upstream's bare prompt of a task is its initial/ file without the agent list and without the
    line on logging the agents: the general instructions stay, the team's bookkeeping goes."""
    prompt, wf = import_upstream(upstream_text())
    assert prompt == f"{TASK}\n\n{TAIL}" and "agent" not in prompt
    assert [a.id for a in wf.agents] == ["agent-orchestrator", "agent-coder"]


def test_an_upstream_task_carries_deliverables_guards_and_files(tmp_path):
    (tmp_path / "q1.txt").write_text(upstream_text())
    spec = load_spec(
        spec_with(
            tmp_path,
            {
                "file": "q1.txt",
                "format": "upstream",
                "id": "q1",
                "split": "train",
                "deliverables": ["fib.py"],
                "guards": {"protected_paths": ["data/n.txt"]},
                "files": {"data/n.txt": "10\n"},
            },
        )
    )
    [task] = spec.resolved_tasks()
    assert (task.id, task.split, task.deliverables, task.files) == ("q1", "train", ["fib.py"], {"data/n.txt": "10\n"})
    assert task.guards.protected_paths == ["data/n.txt"]
    assert task.prompt.endswith(TAIL) and [a.role for a in task.workflow.agents] == ["Lead", "Coder"]


def test_an_upstream_task_without_format_says_how_to_load_it(tmp_path, capsys):
    (tmp_path / "q1.txt").write_text(upstream_text())
    spec = spec_with(tmp_path, {"file": "q1.txt", "id": "q1", "split": "train"})
    assert main(["validate", str(spec)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0] == f"{spec}: invalid run spec, 1 error(s):"
    assert lines[1].startswith("  $.tasks[0].file: q1.txt: expected ")
    assert lines[1].endswith(
        "; an upstream MASS task (text, then an agent list) needs `format: upstream` (with `id` "
        "and `split`) next to `file:`, or convert it: `mass import upstream DIR`"
    )


def test_an_upstream_task_without_id_and_split_names_those_keys(tmp_path, capsys):
    (tmp_path / "q1.txt").write_text(upstream_text())
    spec = spec_with(tmp_path, {"file": "q1.txt", "format": "upstream"})
    assert main(["validate", str(spec)]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  $.tasks[0].id: required next to `format: upstream` (an upstream task file has no id or split of its own)",
        "  $.tasks[0].split: required next to `format: upstream` (an upstream task file has no id or split of its own)",
    ]


def upstream_dir(root: Path) -> Path:
    src = root / "upstream"
    (src / "bare").mkdir(parents=True)
    (src / "initial").mkdir()
    (src / "splits.json").write_text(
        json.dumps(
            {
                "designated_train": [7, 8],
                "test": [9],
                "excluded_from_teacher_collection": {"8": "no winner"},
                "task_prompt_pattern": "bare/query{task_id}.txt",
                "initial_workflow_pattern": "initial/query{task_id}_ourTeam.txt",
            }
        )
    )
    for tid in (7, 8, 9):
        task = f"Task {tid}: write t{tid}.py."
        (src / "bare" / f"query{tid}.txt").write_text(f"{task}\n\n{TAIL}")
        (src / "initial" / f"query{tid}_ourTeam.txt").write_text(upstream_text(task))
    return src


def test_import_converts_a_task_directory_to_native_task_files(tmp_path, capsys):
    src, out = upstream_dir(tmp_path), tmp_path / "tasks"
    assert main(["import", "upstream", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 task file(s) written" in printed and "note: upstream excluded ['8'] from teacher collection" in printed
    assert f"  - file: {(out / 'query7.yaml').resolve()}" in printed.splitlines()  # absolute: valid from any spec
    assert "teacher_directive" not in printed
    (src / "teacher_directive.txt").write_text("Follow these requirements.\n")
    assert main(["import", "upstream", str(src), "--out", str(out)]) == 0
    assert "note: upstream's teacher_directive.txt is not imported" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["query7.yaml", "query8.yaml", "query9.yaml"]
    spec = load_spec(spec_with(tmp_path, {"file": "tasks/query7.yaml"}, {"file": "tasks/query9.yaml"}))
    task = spec.task("query9")
    assert (task.id, task.split, task.prompt) == ("query9", "test", f"Task 9: write t9.py.\n\n{TAIL}")
    assert [a.id for a in task.workflow.agents] == ["agent-orchestrator", "agent-coder"]


def test_import_names_what_is_missing(tmp_path, capsys):
    src = upstream_dir(tmp_path)
    (src / "initial" / "query8_ourTeam.txt").unlink()
    assert main(["import", "upstream", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{src / 'splits.json'}: invalid upstream task directory, 1 error(s):",
        f"  $.designated_train[1]: expected the file {src / 'initial/query8_ourTeam.txt'} (FileNotFoundError)",
    ]
    assert main(["import", "upstream", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    assert "expected an upstream splits.json (FileNotFoundError" in capsys.readouterr().err


def test_the_documented_example_loads(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "docs" / "paper.md").read_text()
    block = readme.split("## Upstream tasks", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    [entry] = yaml.safe_load(block)["tasks"]
    (tmp_path / Path(entry["file"]).parent).mkdir(parents=True)
    (tmp_path / entry["file"]).write_text(upstream_text())
    [task] = load_spec(spec_with(tmp_path, entry)).resolved_tasks()
    assert (task.id, task.deliverables, task.guards.required_outputs) == (
        "query51",
        ["research_report.md", "results/metrics.json"],
        ["results/metrics.json"],
    )


def test_a_missing_task_file_is_named_with_the_path_it_was_looked_for_at(tmp_path, capsys):
    spec = spec_with(tmp_path, {"file": "tasks/q1.txt", "format": "upstream", "id": "q1", "split": "train"})
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert (
        f"$.tasks[0].file: expected a readable task file, found 'tasks/q1.txt' at '{tmp_path / 'tasks/q1.txt'}'" in err
    )


# Shaped like the paper's tasks (written for this test: the project ships no upstream text): a
# "Deliverables:" list with escaped line breaks, a data host named by URL, the general rules after.
PAPER_LIKE = {
    1: (
        "Fetch the structure https://files.rcsb.org/download/1abc.pdb and compute its radius of gyration."
        "\\n\\nDeliverables:\\n1) A short report research_report.md\\n2) results/metrics.json with rg_angstrom"
        "\\n3) a plot of the contact map\\n\\nBe precise."
    ),
    2: (
        "Download the 10-year yield from https://fred.stlouisfed.org/graph/fredgraph.csv?id=DGS10 and fit an AR(1)."
        "\\nDeliverables:\\n1) research_report.md\\n2) figures/yield_fit.png"
    ),
    3: "Simulate a 2-D random walk and describe its mean squared displacement.",
}


def paper_like_dir(root: Path) -> Path:
    src = root / "checkout" / "tasks"
    (src / "bare").mkdir(parents=True)
    (src / "initial").mkdir()
    (src / "splits.json").write_text(json.dumps({"designated_train": [1, 2], "test": [3]}))
    for tid, task in PAPER_LIKE.items():
        (src / "bare" / f"query{tid}.txt").write_text(f"{task}\n\n{TAIL}")
        (src / "initial" / f"query{tid}_ourTeam.txt").write_text(upstream_text(task))
    return src


def test_importing_the_papers_tasks_derives_deliverables_and_hosts_and_marks_the_rest(tmp_path, capsys):
    """Deliverables (and required outputs) from each prompt's "Deliverables:" list, hosts from its URLs;
    what no prompt says (an item without a path, metrics' ranges, checks, a task without the list)
    opens the file for a person; the overlay runs them as the paper spec's tasks, and it validates."""
    src, examples = paper_like_dir(tmp_path), tmp_path / "examples"
    examples.mkdir()
    spec = examples / "paper.yaml"
    spec.write_text((Path(__file__).resolve().parents[1] / "examples" / "paper.yaml").read_text())
    out = examples / "tasks" / "upstream"
    assert main(["import", "upstream", str(src), "--out", str(out), "--for", str(spec)]) == 0
    printed = capsys.readouterr().out
    assert f"run them: mass run {spec} --overlay {out / 'overlay.yaml'}" in printed
    assert "3 task file(s) open with what a person must still review" in printed
    q1, q2, q3 = (yaml.safe_load((out / f"query{i}.yaml").read_text()) for i in (1, 2, 3))
    assert q1["deliverables"] == q1["guards"]["required_outputs"] == ["research_report.md", "results/metrics.json"]
    assert q2["deliverables"] == ["research_report.md", "figures/yield_fit.png"]
    assert (q1["network"], q2["network"]) == (["files.rcsb.org"], ["fred.stlouisfed.org"])
    assert "deliverables" not in q3 and "guards" not in q3 and "network" not in q3
    head = (out / "query1.yaml").read_text().split("\nid: ", 1)[0].splitlines()
    assert head[0] == f"# imported from {src / 'initial' / 'query1_ourTeam.txt'}"
    assert head[1] == "# to review: deliverables: item 'a plot of the contact map' names no file: add its path by hand"
    assert "metrics' ranges and check commands are not in the prompt" in head[2]
    assert "has no 'Deliverables:' list" in (out / "query3.yaml").read_text().split("\nid: ", 1)[0]
    assert yaml.safe_load((out / "overlay.yaml").read_text())["tasks"] == [
        {"file": f"tasks/upstream/query{i}.yaml"} for i in (1, 2, 3)
    ]
    assert main(["validate", str(spec), "--overlay", str(out / "overlay.yaml")]) == 0
    # the overlay's tasks replace the paper's own three (their files are not even here)
    assert "valid run spec 'paper': 3 task(s) (2 train, 1 test)" in capsys.readouterr().out
