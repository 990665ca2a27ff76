"""Workspace evidence at the paper's code's content and caps: the tree, the preflight, the excerpts,
the results appendix, bounded reads, and the evaluator's request fitted to the served context."""

import json
import os
from pathlib import Path

from mass_jobs.judging import evidence as ev
from mass_jobs.judging.compare import EVALUATOR_SYSTEM, RUBRIC, verdict_request


def write(root: Path, rel: str, text: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_tree_lists_at_most_400_entries_6_levels_and_names_a_crowded_folder(tmp_path: Path):
    for i in range(150):
        write(tmp_path, f"data/raw/f{i:03}.csv", "x")
    for i in range(450):
        write(tmp_path, f"many/sub{i // 50}/g{i:03}.txt", "y")
    write(tmp_path, "a/b/c/d/e/f/g/deep.txt", "z")
    write(tmp_path, "plots/fig.png", "png")
    (tmp_path / "escape").symlink_to("/etc")
    tree = ev.file_tree(tmp_path)
    lines = tree.splitlines()
    assert lines[0] == "workspace/"
    assert "      ... [150 entries, over the 100 listed per folder]" in lines  # inside data/raw/
    assert not any("f000.csv" in line for line in lines)
    assert sum(1 for line in lines[1:] if not line.startswith("...") and "entries, over" not in line) == 400
    assert lines[-1] == "... (tree truncated)"
    shallow = ev.file_tree(tmp_path, ev.Caps(tree_entries=10_000))
    assert "  escape  [link, not followed]" in shallow.splitlines() and "passwd" not in shallow
    assert "f/" in shallow and "deep.txt" not in shallow and "g/" not in shallow  # levels 1..6 only
    assert "    fig.png  [.png binary/large]" in shallow


def test_preflight_names_deliverables_core_files_and_plot_paths(tmp_path: Path):
    write(tmp_path, "report.md", "r")
    write(tmp_path, "deliverables/plots/loss.png", "p")
    text = ev.preflight(
        tmp_path, "Plot deliverables/plots/loss.png and acc.png; write report.md.", ["report.md", "results/out.json"]
    )
    assert "- report.md: FOUND" in text and "- results/out.json: MISSING" in text
    assert "- research_report.md: MISSING" in text and "- requirements.txt: MISSING" in text
    assert "  - [ok] deliverables/plots/loss.png" in text and "  - [missing] deliverables/plots/acc.png" in text


def test_excerpts_follow_the_caps_head_and_tail_kept(tmp_path: Path):
    write(tmp_path, "report.md", "HEAD" + "r" * 100_000 + "TAIL")
    write(tmp_path, "results/metrics.json", json.dumps({"k": "v" * 300_000}))
    for i in range(6):
        write(tmp_path, f"run_{i}.py", f"print({i})\n")
    write(tmp_path, "tests/test_a.py", "t" * 20_000)
    write(tmp_path, "tests/test_b.py", "b")
    write(tmp_path, "notes.txt", "not a priority file")
    text = ev.bundle(tmp_path, "task", ["report.md"])
    report = text.split("FILE report.md [truncated]:\n", 1)[1].split("\n\nFILE ", 1)[0]
    assert report.startswith("HEAD") and report.endswith("TAIL") and "[... middle omitted ...]" in report
    assert len(report) <= 28_000 + len(ev.OMITTED)
    metrics = text.split("FILE results/metrics.json [truncated]:\n", 1)[1].split("\n\nFILE ", 1)[0]
    assert len(metrics) <= 24_000 + len(ev.OMITTED)
    shown = [line for line in text.splitlines() if line.startswith("FILE run_")]
    assert shown == [f"FILE run_{i}.py:" for i in range(4)]  # four entry scripts
    assert "FILE tests/test_a.py [truncated]:" in text and "test_b.py:" not in text  # one test, 8,000 characters
    assert "not a priority file" not in text and "notes.txt" in text  # in the tree only
    assert ev.bundle(tmp_path, "task", ["report.md"]) == text  # deterministic


def test_token_caps_cut_before_character_caps():
    text, cut = ev.excerpt("x" * 100_000, None, 1000)
    assert cut and ev.count_tokens(text) <= 1000 + ev.count_tokens(ev.OMITTED)
    same, cut = ev.excerpt("short", 10, 10)
    assert same == "short" and not cut


def test_a_huge_sparse_file_is_read_by_head_and_tail_only(tmp_path: Path):
    big = tmp_path / "report.md"
    with big.open("wb") as f:
        f.write(b"START")
        f.truncate(8 << 30)  # 8 GiB, sparse: reading it whole would take minutes and the memory
        f.seek((8 << 30) - 3)
        f.write(b"END")
    text = ev.bundle(tmp_path, "", ["report.md"])
    body = text.split("FILE report.md [truncated]:\n", 1)[1]
    assert body.startswith("START") and body.rstrip().endswith("END") and len(body) < 30_000


def test_results_appendix_per_file_and_total_budget(tmp_path: Path):
    for i in range(10):
        write(tmp_path, f"results/r{i}.json", json.dumps({"i": i, "pad": "p" * 19_980}))
    write(tmp_path, "results/big.json", "[" + "1," * 20_000 + "1]")
    write(tmp_path, "results/raw_records.json", "[]")
    write(tmp_path, "results/sub/deep.json", "{}")
    text = ev.results_appendix(tmp_path)
    assert "raw_records.json" not in text
    assert "FILE results/big.json [truncated]:" in text
    shown = [line for line in text.splitlines() if line.startswith("FILE ")]
    bodies = sum(len(b) for b in text.split("FILE ")[1:])
    assert bodies <= 120_000 + 200 * len(shown)
    omitted = text.rsplit("Omitted, over the appendix budget: ", 1)[1].split(", ")
    assert omitted and len(shown) + len(omitted) == 12
    assert ev.results_appendix(tmp_path / "none") == "results/ is missing."
    os.remove(tmp_path / "results/sub/deep.json")


def test_verdict_request_fits_the_budget_and_keeps_both_workspaces():
    a, b = "A-start " + "a" * 400_000 + " A-end", "B-start " + "b" * 10_000 + " B-end"
    user = verdict_request("Do the task.", a, b, budget_tokens=20_000)
    total = ev.count_tokens(EVALUATOR_SYSTEM) + ev.count_tokens(user)
    assert total <= 20_000
    assert "A-start" in user and "A-end" in user and "cut to fit the served context" in user
    assert "B-start" in user and "B-end" in user and user.endswith(RUBRIC)
    assert verdict_request("t", "x", "y") == verdict_request("t", "x", "y", budget_tokens=10_000)


def test_prompt_budget_is_the_served_context_less_reply_and_margin():
    from mass_jobs.spec.load import validate_document

    spec = validate_document(
        {
            "name": "b",
            "model": {"base": "m", "sampling": {"context_length": 65536, "max_output_tokens": 1000}},
            "tasks": [{"id": "t", "split": "train", "prompt": "p"}, {"id": "u", "split": "test", "prompt": "q"}],
            "store": {"uri": "file:///tmp/x"},
        }
    )
    assert ev.prompt_budget(spec) == 65536 - 1000 - 8192
    assert ev.caps_of(spec) == ev.Caps()
