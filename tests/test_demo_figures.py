"""docs/demo.md's figures are generated (mass_jobs.tools.analysis.demo_figures) and stay equal to the
last generated file, docs/demo-figures.json, which names the machine they were measured on."""

import json

import pytest

from mass_jobs.tools.analysis import demo_figures as df

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

REPORT = {
    "run": "tiny",
    "warnings": [],
    "audit": [
        {
            "generation": g,
            "split": split,
            "episodes": n,
            "delegation": d,
            "code_handoff": 0,
            "delegation_rate": None,
            "code_handoff_rate": None,
            "graded": n,
            "task_score": s,
            "solved": 0,
        }
        for g, d, s in ((0, 0, 0.0), (1, 9, 0.028), (2, 12, 0.0))
        for split, n, d in (("all", 12, d), ("test", 4, min(d, 4)))
    ],
}
HOST = {
    "cpu": "Some CPU",
    "cores": 2,
    "torch": "2.13.0+cpu",
    "cpu_capability": "AVX512",
    "threads": "2",
    "python": "3.11.9",
}


def test_the_docs_table_is_the_last_generated_figures_file():
    fig = json.loads(df.FIGURES.read_text())
    doc = df.DOC.read_text()
    assert df.shown(doc) == df.table(fig), "docs/demo.md differs from docs/demo-figures.json: rerun the generator"
    assert df.rewrite(doc, fig) == doc
    assert fig["machine"]["cpu"] and fig["machine"]["cores"] >= 1 and len(fig["generations"]) == 3
    assert fig["run"] == "tiny"


def test_figures_come_from_the_reports_audit_rows():
    fig = df.figures(REPORT, 151.4, HOST)
    assert [(r["generation"], r["delegation"], r["test_delegation"]) for r in fig["generations"]] == [
        (0, 0, 0),
        (1, 9, 4),
        (2, 12, 4),
    ]
    text = df.table(fig)
    assert "| L1 | 9/12 | 4/4 | 0/12 | 2.8% | 0/12 |" in text
    assert (
        "Measured on Some CPU (2 cores; torch 2.13.0+cpu, CPU capability AVX512, 2 threads); the run took 2:31." in text
    )


def test_rewrite_replaces_only_the_marked_block_and_refuses_a_document_without_it():
    fig = df.figures(REPORT, None, HOST)
    doc = f"before\n{df.START}\nold table\n{df.END}\nafter\n"
    new = df.rewrite(doc, fig)
    assert new.startswith("before\n") and new.endswith(f"{df.END}\nafter\n") and "old table" not in new
    assert df.shown(new) == df.table(fig) and "the run took" not in new
    with pytest.raises(ValueError, match="demo-figures"):
        df.rewrite("no markers", fig)
