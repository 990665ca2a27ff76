"""Two runs that differ only in teacher composition (team vs single agent), compared in one table
from their stores: composition, windows by role, the three token quantities, win share vs L0."""

import json

import yaml

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import load_spec
from mass_jobs.store import open_store


def make_run(tmp_path, name, teacher, windows, completion, stored, processed, win, sft=None, selected=None):
    uri = f"file://{tmp_path}/{name}-store"
    spec = {
        "name": name,
        "model": {"base": "m"},
        "generations": 1,
        "tasks": [{"id": "a", "split": "train", "prompt": "do a"}, {"id": "h", "split": "test", "prompt": "do h"}],
        "judges": [{"name": "j", "endpoint": "http://judge.invalid/v1", "model": "j"}],
        "collection": {"teacher": teacher},
        "store": {"uri": uri},
        **({"sft": sft} if sft else {}),
    }
    path = tmp_path / f"{name}.yaml"
    (tmp_path / "m").mkdir(exist_ok=True)  # model locations are checked: the spec's model exists
    path.write_text(yaml.safe_dump(spec))
    store = open_store(uri)
    RunContext(load_spec(path), store).claim_spec()  # the run was started: its store holds its spec
    store.put_json(f"{name}/gen-0/collect/a/ep-0/status.json", {"tokens": {"completion": completion}})
    store.put_json(
        f"{name}/gen-0/sft/stats.json",
        {
            "train": {"windows_by_role": windows, "stored_supervised_tokens": stored},
            "summary": {"stored_supervised_tokens": stored},
        },
    )
    log = [{"kind": "train", "step": s, "loss": 1.0, "processed_tokens": processed * s} for s in (1, 2, 3)]
    store.put_bytes(f"{name}/gen-0/train/log.jsonl", "".join(json.dumps(x) + "\n" for x in log).encode())
    store.put_json(f"{name}/gen-0/select.json", selected or {"step": 2, "by": "val_loss"})
    # panel verdicts of L1 vs L0: `win` wins out of 4 decisive
    for rep in range(4):
        winner = "A" if rep < win else "B"
        store.put_json(
            f"{name}/eval/verdicts/gen-1-vs-gen-0/a/rep-{rep}/panel-j-seed-1.json",
            {
                "task": "a",
                "replicate": rep,
                "candidate": 1,
                "baseline": 0,
                "judge": "j",
                "kind": "panel",
                "model": "j",
                "seed": 1,
                "order": "candidate_first",
                "winner": winner,
                "valid": True,
                "rationale": "r",
                "attempts": 1,
                "errors": [],
            },
        )
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
    assert a["tokens"]["0"] == {
        "generated_total": 900,
        "stored_supervised": 5000,
        "processed_to_selected": 200,
        "processed_to_end": 300,
    }
    assert b["tokens"]["0"] == {
        "generated_total": 400,
        "stored_supervised": 2000,
        "processed_to_selected": 100,
        "processed_to_end": 150,
    }
    assert (a["win_share_vs_l0"], b["win_share_vs_l0"]) == ({"1": 0.75}, {"1": 0.25})
    md = (out / "compare.md").read_text()
    assert md == capsys.readouterr().out
    for row in (
        "| teacher | team | single |",
        "| L0 orchestrator | 3 | 0 |",
        "| L0 generated | 900 | 400 |",
        "| L0 stored supervised | 5,000 | 2,000 |",
        "| L0 processed to selected | 200 | 100 |",
        "| L1 | 75.0% | 25.0% |",
        "| orchestrator share | 0.333 | 0.333 |",
    ):
        assert row in md


def test_compare_runs_needs_two_distinct_runs(tmp_path, capsys):
    team = make_run(tmp_path, "team", "team", {}, 1, 1, 1, 0)
    assert cli_main(["compare-runs", str(team), "--out", str(tmp_path / "o")]) == 2
    assert "expected two or more run specs" in capsys.readouterr().err
    assert cli_main(["compare-runs", str(team), str(team), "--out", str(tmp_path / "o")]) == 2
    assert "distinct names" in capsys.readouterr().err


def test_two_presets_side_by_side_in_one_report(tmp_path):
    """Runs that differ only in sft.preset: M (the paper's) vs S+ (no orchestrator windows, panel selection)."""
    m = make_run(
        tmp_path, "m", "team", {"orchestrator": 3, "worker": 6, "auxiliary": 1}, 900, 5000, 100, 3, sft={"preset": "M"}
    )
    s = make_run(
        tmp_path,
        "s",
        "team",
        {"orchestrator": 0, "worker": 6, "auxiliary": 1},
        900,
        4100,
        100,
        2,
        sft={"preset": "S+", "panel": {"tasks": ["h"]}},
        selected={"step": 3, "by": "panel"},
    )
    open_store(f"file://{tmp_path}/s-store").put_json(
        "s/gen-1/collect/a/ep-0/status.json", {"tokens": {"completion": 50}}
    )
    out = tmp_path / "cmp"
    assert cli_main(["compare-runs", str(m), str(s), "--out", str(out)]) == 0
    a, b = json.loads((out / "compare.json").read_text())["runs"]
    assert (a["composition"]["preset"], b["composition"]["preset"]) == ("M", "S+")
    assert (a["composition"]["window_roles"], b["composition"]["window_roles"]) == (
        "orchestrator, worker, auxiliary",
        "worker, auxiliary",
    )
    assert (a["composition"]["orchestrator_share"], b["composition"]["orchestrator_share"]) == (0.333333, 0.0)
    assert (a["selected"], b["selected"]) == ({"0": "2 (validation loss)"}, {"0": "3 (judge panel)"})
    # the token accounting of each run, per generation and in total (one generation here)
    assert a["tokens_total"] == {
        "generated_total": 900,
        "stored_supervised": 5000,
        "processed_to_selected": 200,
        "processed_to_end": 300,
    }
    assert b["tokens"]["1"]["generated_total"] == 50
    assert b["tokens_total"] == {
        "generated_total": 950,
        "stored_supervised": 4100,
        "processed_to_selected": 300,
        "processed_to_end": 300,
    }
    md = (out / "compare.md").read_text()
    for row in (
        "| preset | M | S+ |",
        "| checkpoint_selection | validation loss | judge panel |",
        "| training_episodes | winners | winners |",
        "| orchestrator share | 0.333 | 0.000 |",
        "| L0 step | 2 (validation loss) | 3 (judge panel) |",
        "| L0 orchestrator | 3 | 0 |",
        "| run stored supervised | 5,000 | 4,100 |",
        "| run processed to selected | 200 | 300 |",
        "| L1 | 75.0% | 50.0% |",
        "| run generated | 900 | 950 |",
    ):
        assert row in md, row
    # each run's own report says its composition, how its checkpoint was chosen and its token totals
    from mass_jobs.commands.common import open_run
    from mass_jobs.steps.report import build_report
    from mass_jobs.steps.report_render import render_markdown

    doc = build_report(open_run(str(s)))
    assert doc["composition"] == {
        "preset": "S+",
        "teacher": "team",
        "window_roles": ["worker", "auxiliary"],
        "training_episodes": "winners",
        "orchestrator_share": 0.0,
        "checkpoint_selection": "panel",
    }
    assert doc["training"][0]["selected_step"] == 3 and doc["training"][0]["selected_by"] == "panel"
    report = render_markdown(doc)
    assert (
        "windows of worker, auxiliary from winners ranked episodes; orchestrator share 0.000; checkpoint by the judge panel"
        in report
    )
    assert "| L0 | 3 (panel) |" in report
    assert "| run | 2 | 950 (0 / 950 / 0) | 4,100 | 300 | 300 |" in report


def test_a_run_that_never_ran_is_named_not_compared_or_reported(tmp_path, capsys):
    team = make_run(tmp_path, "team", "team", {}, 1, 1, 1, 0)
    doc = yaml.safe_load(team.read_text())
    doc["name"], doc["store"]["uri"] = "later", f"file://{tmp_path}/later-store"
    later = tmp_path / "later.yaml"
    later.write_text(yaml.safe_dump(doc))
    out = tmp_path / "o"
    assert cli_main(["compare-runs", str(team), str(later), "--out", str(out)]) == 1
    assert (
        f"run 'later' was never started: file://{tmp_path}/later-store/later/spec.json does not exist"
        in capsys.readouterr().err
    )
    assert not out.exists()
    assert cli_main(["report", str(later)]) == 1
    assert "mass report: run 'later' was never started" in capsys.readouterr().err
    assert not (tmp_path / "later-store" / "later" / "report").exists()
