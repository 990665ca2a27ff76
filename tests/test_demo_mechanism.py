"""The demo reproduces MASS's mechanism at tiny scale (examples/tiny.yaml, what `make demo` runs).

The warm tiny model (models/tiny-warm, shipped with the repository) works alone on a bare prompt and delegates
when a workflow in its prompt tells it to. Two generations of search -> teacher collection (workflow
+ directive in the prompt, so the teacher delegates) -> SFT on the bare task must make delegation
the model's own: the report's bare-prompt delegation D at L2 exceeds D at L0. The grader's task
score sits beside it in the report and is recomputed here from the stored workspaces.
"""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from mass_jobs.judging.grade import grade_workspace
from mass_jobs.spec.load import load_spec

SPEC = Path(__file__).parents[1] / "examples" / "tiny.yaml"  # the demo itself


def demo_spec(model_dir: Path, store: Path):
    from mass_jobs.spec.load import validate_document

    doc = yaml.safe_load(SPEC.read_text())
    doc["model"]["base"] = doc["judges"][0]["model"] = str(model_dir)
    doc["store"]["uri"] = f"file://{store}"
    return doc, validate_document(doc)


def test_grader_checks_deliverables_and_expected_content(tmp_path):
    _, spec = demo_spec(tmp_path, tmp_path / "store")
    fib = next(t for t in spec.resolved_tasks() if t.id == "fib")
    ws = tmp_path / "ws"
    (ws / "results").mkdir(parents=True)
    g = grade_workspace(fib, ws)
    assert (g.checks, g.passed, g.score, g.solved) == (3, 0, 0.0, False)
    (ws / "fib.py").write_text("print(1)\n")
    (ws / "results" / "fib.json").write_text("[0, 1, 1, 2]")
    g = grade_workspace(fib, ws)
    assert (g.passed, g.missing, g.wrong) == (2, (), ("results/fib.json",))
    (ws / "results" / "fib.json").write_text("[0,1,1,2,3,5,8,13,21,34]\n")  # JSON compares as values
    assert grade_workspace(fib, ws).solved
    sort = next(t for t in spec.resolved_tasks() if t.id == "sort")
    (ws / "sort.py").write_text("")
    (ws / "results" / "sorted.txt").write_text("1 3 5 9")  # text compares as tokens
    assert grade_workspace(sort, ws).score == 1.0


def test_expect_must_name_a_deliverable(tmp_path):
    from mass_jobs.spec.load import SpecError, validate_document

    doc, _ = demo_spec(tmp_path, tmp_path / "store")
    doc["tasks"][0]["expect"] = {"results/other.json": "[]"}
    with pytest.raises(SpecError, match=r"tasks\[0\]\.expect\.results/other\.json.*deliverables"):
        validate_document(doc)


def _grade_stored(ctx, gen: int, tasks: dict) -> list[float]:
    """Grade each stored rollout workspace, unpacked here with tarfile (not the report's code path)."""
    import tempfile

    scores = []
    for key in ctx.store.list(f"{ctx.eval(gen)}/"):
        if not key.endswith("/workspace.tar.gz"):
            continue
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(Path(ctx.store.root) / key) as tar:
            tar.extractall(tmp, filter="data")
            scores.append(grade_workspace(tasks[key.split("/")[3]], Path(tmp)).score)
    return scores


@pytest.mark.slow(cost=240)
def test_two_generations_internalise_delegation_on_bare_prompts(tmp_path, warm_tiny_model_dir):
    doc, _ = demo_spec(warm_tiny_model_dir, tmp_path / "store")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mass_jobs.commands.cli",
            "run",
            str(spec_path),
            "--work-dir",
            str(tmp_path / "work"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_mechanism(spec_path, tmp_path / "store")


def check_mechanism(spec_path: Path, store_root: Path) -> None:
    """What a finished demo run must show, read from its store (also usable on a `make demo` run)."""
    from mass_jobs.run.context import RunContext
    from mass_jobs.store import FileStore

    spec = load_spec(spec_path)
    ctx = RunContext(spec, FileStore(store_root))
    report = ctx.store.get_json(f"{ctx.report()}/report.json")
    rows = {(a["generation"], a["split"]): a for a in report["audit"]}
    n = len(spec.resolved_tasks()) * spec.evaluation.rollouts_per_task
    l0, l2 = rows[(0, "all")], rows[(2, "all")]
    assert l0["episodes"] == l2["episodes"] == n
    assert l2["delegation"] > l0["delegation"], (l0, rows[(1, "all")], l2)
    assert l0["delegation"] <= n // 4  # L0 mostly works alone on a bare prompt

    # the task score beside it: graded from the stored workspaces, equal to the report's
    tasks = {t.id: t for t in spec.resolved_tasks()}
    for g in (0, 1, 2):
        scores = _grade_stored(ctx, g, tasks)
        assert rows[(g, "all")]["graded"] == len(scores) == n
        assert rows[(g, "all")]["task_score"] == pytest.approx(sum(scores) / n)
    md = ctx.store.get_bytes(f"{ctx.report()}/report.md").decode()
    assert "| task score | solved |" in md
    print(
        json.dumps(
            {
                g: {k: rows[(g, "all")][k] for k in ("delegation", "code_handoff", "task_score", "solved")}
                for g in (0, 1, 2)
            }
        )
    )
