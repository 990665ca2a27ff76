"""Two runs that differ only in teacher composition (team vs single agent), compared in one table
from their stores: composition, windows by role, the three token quantities, win share vs L0."""

import json

import yaml

from mass_jobs.cli import main as cli_main
from mass_jobs.store import open_store


def make_run(tmp_path, name, teacher, windows, completion, stored, processed, win):
    uri = f"file://{tmp_path}/{name}-store"
    spec = {"name": name, "model": {"base": "m"}, "generations": 1,
            "tasks": [{"id": "a", "split": "train", "prompt": "do a"}],
            "collection": {"teacher": teacher}, "store": {"uri": uri}}
    path = tmp_path / f"{name}.yaml"
    (tmp_path / "m").mkdir(exist_ok=True)  # model locations are checked: the spec's model exists
    path.write_text(yaml.safe_dump(spec))
    store = open_store(uri)
    store.put_json(f"{name}/gen-0/collect/a/ep-0/status.json", {"tokens": {"completion": completion}})
    store.put_json(f"{name}/gen-0/sft/stats.json", {"train": {"windows_by_role": windows, "stored_supervised_tokens": stored},
                                                   "summary": {"stored_supervised_tokens": stored}})
    log = [{"kind": "train", "step": s, "loss": 1.0, "processed_tokens": processed * s} for s in (1, 2, 3)]
    store.put_bytes(f"{name}/gen-0/train/log.jsonl", "".join(json.dumps(x) + "\n" for x in log).encode())
    store.put_json(f"{name}/gen-0/select.json", {"step": 2})
    # panel verdicts of L1 vs L0: `win` wins out of 4 decisive
    for rep in range(4):
        winner = "A" if rep < win else "B"
        store.put_json(f"{name}/eval/verdicts/gen-1-vs-gen-0/a/rep-{rep}/panel-j-seed-1.json", {
            "task": "a", "replicate": rep, "candidate": 1, "baseline": 0, "judge": "j", "kind": "panel", "model": "j",
            "seed": 1, "order": "candidate_first", "winner": winner, "valid": True, "rationale": "r", "attempts": 1,
            "errors": []})
    return path


def test_team_and_single_agent_runs_side_by_side(tmp_path, capsys):
    team = make_run(tmp_path, "team", "team", {"orchestrator": 3, "worker": 6, "auxiliary": 1}, 900, 5000, 100, 3)
    solo = make_run(tmp_path, "solo", "single", {"orchestrator": 0, "worker": 7, "auxiliary": 0}, 400, 2000, 50, 1)
    out = tmp_path / "cmp"
    assert cli_main(["compare-runs", str(team), str(solo), "--out", str(out)]) == 0
    doc = json.loads((out / "compare.json").read_text())
    a, b = doc["runs"]
    assert (a["run"], a["composition"]["teacher"], b["composition"]["teacher"]) == ("team", "team", "single")
    assert a["windows_by_role"]["0"] == {"orchestrator": 3, "worker": 6, "auxiliary": 1}
    assert b["windows_by_role"]["0"]["orchestrator"] == 0
    assert a["tokens"]["0"] == {"generated_total": 900, "stored_supervised": 5000,
                                "processed_to_selected": 200, "processed_to_end": 300}
    assert b["tokens"]["0"] == {"generated_total": 400, "stored_supervised": 2000,
                                "processed_to_selected": 100, "processed_to_end": 150}
    assert (a["win_share_vs_l0"], b["win_share_vs_l0"]) == ({"1": 0.75}, {"1": 0.25})
    md = (out / "compare.md").read_text()
    assert md == capsys.readouterr().out
    for row in ("| teacher | team | single |", "| L0 orchestrator | 3 | 0 |", "| L0 generated | 900 | 400 |",
                "| L0 stored supervised | 5,000 | 2,000 |", "| L0 processed to selected | 200 | 100 |",
                "| L1 | 75.0% | 25.0% |", "| orchestrator share | 0.333 | 0.333 |"):
        assert row in md


def test_compare_runs_needs_two_distinct_runs(tmp_path, capsys):
    team = make_run(tmp_path, "team", "team", {}, 1, 1, 1, 0)
    assert cli_main(["compare-runs", str(team), "--out", str(tmp_path / "o")]) == 2
    assert "expected two or more run specs" in capsys.readouterr().err
    assert cli_main(["compare-runs", str(team), str(team), "--out", str(tmp_path / "o")]) == 2
    assert "distinct names" in capsys.readouterr().err
