"""The report from a hand-built store: every number checked against hand computation, the schema
checked in matches the models, and a rebuild gives identical bytes."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest

from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import validate_document
from mass_jobs.steps import report as rp
from mass_jobs.steps import report_document as rd
from mass_jobs.steps import report_figures as rf
from mass_jobs.steps import report_reading as reading
from mass_jobs.steps import report_render as rr
from mass_jobs.store import FileStore, read_manifest

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

RUN = "rep"


def spec(store_dir):
    task = lambda i, split: {"id": i, "split": split, "prompt": f"do {i}"}  # noqa: E731
    return validate_document(
        {
            "name": RUN,
            "model": {"base": "m"},
            "generations": 2,
            "tasks": [task("a", "train"), task("b", "train"), task("t", "test")],
            "search": {"iterations": 2},
            "evaluation": {"rollouts_per_task": 2, "bootstrap": 200},
            "judges": [{"name": "j1", "endpoint": "http://127.0.0.1:9/v1", "model": "judge", "seeds": [1, 2]}],
            "store": {"uri": f"file://{store_dir}"},
        }
    )


def put_verdict(store, cand, base, task, rep, judge, seed, result, kind="panel"):
    # result from the candidate's side; stored as a blind label + order like the panel writes it
    order = "candidate_first" if seed % 2 else "baseline_first"
    cand_label, base_label = ("A", "B") if order == "candidate_first" else ("B", "A")
    winner = {"win": cand_label, "loss": base_label, "tie": "tie", "invalid": None}[result]
    rec = {
        "task": task,
        "replicate": rep,
        "candidate": cand,
        "baseline": base,
        "judge": judge,
        "kind": kind,
        "model": judge,
        "seed": seed,
        "order": order,
        "winner": winner,
        "valid": result != "invalid",
        "rationale": None if result == "invalid" else "because",
        "attempts": 1,
        "errors": ["format: no JSON"] if result == "invalid" else [],
    }
    store.put_json(
        f"{RUN}/eval/verdicts/gen-{cand}-vs-gen-{base}/{task}/rep-{rep}/{kind}-{judge}-seed-{seed}.json", rec
    )


@pytest.fixture
def built(tmp_path):
    store = FileStore(tmp_path / "s")
    ctx = RunContext(spec(tmp_path / "s"), store)
    V = lambda *a, **k: put_verdict(store, *a, **k)  # noqa: E731
    # L1 vs L0 -- a: rep0 win,win  rep1 loss,tie | b: rep0 win,invalid | t: rep0 loss,loss
    V(1, 0, "a", 0, "j1", 1, "win")
    V(1, 0, "a", 0, "j1", 2, "win")  # noqa: E702
    V(1, 0, "a", 1, "j1", 1, "loss")
    V(1, 0, "a", 1, "j1", 2, "tie")  # noqa: E702
    V(1, 0, "b", 0, "j1", 1, "win")
    V(1, 0, "b", 0, "j1", 2, "invalid")  # noqa: E702
    V(1, 0, "t", 0, "j1", 1, "loss")
    V(1, 0, "t", 0, "j1", 2, "loss")  # noqa: E702
    # L2 vs L0 -- a: win, win | t: win
    V(2, 0, "a", 0, "j1", 1, "win")
    V(2, 0, "a", 0, "j1", 2, "win")
    V(2, 0, "t", 0, "j1", 1, "win")  # noqa: E702
    # self verdicts: L1 agrees on (a,0) and (b,0), meets a split panel (loss, tie) on (a,1), invalid on (t,0);
    # L0 disagrees on (a,0)
    for task, rep, res in (("a", 0, "win"), ("a", 1, "win"), ("b", 0, "win"), ("t", 0, "invalid")):
        V(1, 0, task, rep, "gen-1", 0, res, kind="self")
    V(1, 0, "a", 0, "gen-0", 0, "loss", kind="self")
    for g in (1, 2):
        store.put_json(
            f"{RUN}/eval/gen-{g}/_manifest.json", {"step": "e", "input_hash": "x", "outputs": {}, "extra": {}}
        )
    # bare-prompt rollouts: audits and token counts
    for g, task, d, h, tok in (
        (0, "a", False, False, 10),
        (0, "t", True, False, 20),
        (1, "a", True, True, 30),
        (1, "t", True, False, 40),
    ):
        store.put_json(f"{RUN}/eval/gen-{g}/{task}/rep-0/audit.json", {"delegation": d, "code_handoff": h})
        store.put_json(f"{RUN}/eval/gen-{g}/{task}/rep-0/status.json", {"tokens": {"completion": tok, "prompt": 1}})
    store.put_json(f"{RUN}/gen-0/collect/a/ep-0/status.json", {"tokens": {"completion": 7}})
    store.put_json(f"{RUN}/gen-0/search/a/iter-0/status.json", {"tokens": {"completion": 5}})
    # the agent pods' copies (Argo: input/ and output/ of every rollout) are not episodes of their own
    for rollout in ("gen-0/search/a/iter-0", "gen-0/collect/a/ep-0", "eval/gen-0/a/rep-0"):
        for copy in ("input", "output"):
            store.put_json(f"{RUN}/{rollout}/{copy}/status.json", {"tokens": {"completion": 1000}})
    # search: a's elite beats the reference at 0, then a new elite that does not; b's beats at 1
    ref = lambda w: {"valid": True, "winner": w}  # noqa: E731
    store.put_json(
        f"{RUN}/gen-0/search/a/state.json",
        {
            "beats_reference": False,
            "iterations": [
                {"k": 0, "preferred": False, "reference_verdict": ref("iter-0")},
                {"k": 1, "preferred": True, "reference_verdict": ref("reference")},
                {"k": 2, "preferred": False, "reference_verdict": None},
            ],
        },
    )
    store.put_json(
        f"{RUN}/gen-0/search/b/state.json",
        {
            "beats_reference": True,
            "iterations": [
                {"k": 0, "preferred": False, "reference_verdict": ref("reference")},
                {"k": 1, "preferred": True, "reference_verdict": ref("iter-1")},
            ],
        },
    )
    store.put_json(
        f"{RUN}/gen-0/guard/a.json",
        {
            "task": "a",
            "gen": 0,
            "vetoed": ["ep-1"],
            "usable": ["ep-0"],
            "episodes": {
                "ep-0": {
                    "outcome": "success",
                    "eligible": True,
                    "passed": True,
                    "reasons": [],
                    "review": ["report.md states error 0.02, metrics.json holds 0.4"],
                    "held": True,
                },
                "ep-1": {
                    "outcome": "success",
                    "eligible": True,
                    "passed": False,
                    "reasons": ["required output missing: fib.py", 'text aimed at the judge: report.md:2: "prefer it"'],
                },
                "ep-2": {"outcome": "failed", "eligible": False, "passed": True, "reasons": ["outcome failed"]},
            },
        },
    )
    # render's stats: train and val blocks plus a summary (the val tokens are not "stored supervised")
    store.put_json(
        f"{RUN}/gen-0/sft/stats.json",
        {
            "train": {"stored_supervised_tokens": 555},
            "val": {"stored_supervised_tokens": 40},
            "summary": {"stored_supervised_tokens": 555},
        },
    )
    log = [{"kind": "train", "step": s, "loss": 2.0 - 0.1 * s, "processed_tokens": 100 * s} for s in (1, 2, 3)]
    log += [
        {"kind": "val", "step": 2, "val_loss": 1.5},
        {"kind": "train", "step": 3, "loss": 1.7, "processed_tokens": 300},
        {"kind": "train", "step": 4, "loss": 1.6, "processed_tokens": 400},
        {"kind": "val", "step": 4, "val_loss": 1.7},
    ]
    store.put_bytes(f"{RUN}/gen-0/train/log.jsonl", "".join(json.dumps(x) + "\n" for x in log).encode() + b'{"torn')
    store.put_json(f"{RUN}/gen-0/select.json", {"step": 2})
    return ctx


def test_report_numbers_by_hand(built):
    doc = rp.write_report(built)
    ws = {(w["candidate"], w["baseline"], w["split"]): w for w in doc["win_share"]}
    assert set(ws) == {(1, 0, "train"), (1, 0, "test"), (1, 0, "all"), (2, 0, "train"), (2, 0, "test"), (2, 0, "all")}
    tr = ws[(1, 0, "train")]
    assert (tr["wins"], tr["losses"], tr["ties"], tr["invalid"]) == (3, 1, 1, 1) and tr["win_share"] == 0.75
    assert tr["per_task"]["a"]["win_share"] == pytest.approx(2 / 3) and tr["per_task"]["b"]["win_share"] == 1.0
    assert tr["per_task"]["a"]["ci"] == pytest.approx([0.207658, 0.938510], abs=1e-5)  # Wilson 2 of 3
    assert ws[(1, 0, "test")]["win_share"] == 0.0 and ws[(1, 0, "all")]["win_share"] == 0.5
    # 3 of 3 decisive verdicts: the interval is the verdicts' Wilson interval, not the point [1, 1]
    assert ws[(2, 0, "all")]["win_share"] == 1.0 and ws[(2, 0, "all")]["ci"] == pytest.approx([0.438503, 1.0], abs=1e-5)
    lo, hi = ws[(1, 0, "all")]["ci"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    assert doc["verdicts"] == {
        "panel": {"total": 11, "valid": 10, "invalid": 1},
        "self": {"total": 5, "valid": 4, "invalid": 1},
        "rank": {"total": 0, "valid": 0, "invalid": 0},
    }  # no rank step stored here
    assert doc["invalid_verdicts"] == [
        {
            "candidate": 1,
            "baseline": 0,
            "task": "b",
            "replicate": 0,
            "judge": "j1",
            "seed": 2,
            "errors": ["format: no JSON"],
        }
    ]
    agree = {a["evaluator"]: a for a in doc["agreement"]}
    assert agree[1] == {"evaluator": 1, "agree": 2, "pairs": 2, "no_majority": 1, "rate": 1.0}
    assert agree[0] == {"evaluator": 0, "agree": 0, "pairs": 1, "no_majority": 0, "rate": 0.0}
    # seeds alternate the order and the judge used both labels: no position-bias note anywhere
    # (decisive: a0 win A, a0 win B, a1 loss B, b0 win A, t0 loss B, t0 loss A; seed 1 shows the candidate first)
    assert ws[(1, 0, "all")]["positions"] == {"A": 3, "B": 3, "candidate_first": 4, "baseline_first": 2}
    assert all(w["note"] is None for w in doc["win_share"])
    audit = {(a["generation"], a["split"]): a for a in doc["audit"]}
    assert audit[(0, "all")]["delegation"] == 1 and audit[(0, "all")]["code_handoff"] == 0
    assert audit[(1, "all")]["delegation_rate"] == 1.0 and audit[(1, "all")]["code_handoff_rate"] == 0.5
    assert audit[(1, "test")]["episodes"] == 1 and audit[(1, "test")]["code_handoff"] == 0
    tokens = {t["generation"]: t for t in doc["tokens"]}
    assert tokens[0] == {
        "generation": 0,
        "generated_search": 5,
        "generated_collect": 7,
        "generated_eval": 30,
        "generated_total": 42,
        "generated_episodes": 4,
        "stored_supervised": 555,
        "processed_to_selected": 200,
        "processed_to_end": 400,
    }
    assert tokens[1]["generated_eval"] == 70 and tokens[1]["stored_supervised"] is None
    assert doc["search"] == [
        {
            "generation": 0,
            "iterations": 2,
            "tasks": 2,
            "coverage": [1, 1, 1],
            "beats_reference": {"a": False, "b": True},
        }
    ]
    assert doc["guard_vetoes"] == [
        {
            "generation": 0,
            "task": "a",
            "episode": "ep-1",
            "reasons": ["required output missing: fib.py", 'text aimed at the judge: report.md:2: "prefer it"'],
            "classes": ["judge directive", "required output"],
        }
    ]
    assert doc["guard_counts"] == [
        {"generation": 0, "guard": "flagged for review", "episodes": 1},
        {"generation": 0, "guard": "judge directive", "episodes": 1},
        {"generation": 0, "guard": "required output", "episodes": 1},
    ]
    assert doc["review"] == [
        {
            "generation": 0,
            "task": "a",
            "episode": "ep-0",
            "vetoed": False,
            "held": True,
            "trained": False,
            "claims": ["report.md states error 0.02, metrics.json holds 0.4"],
        }
    ]
    t0 = doc["training"][0]
    assert t0["selected_step"] == 2 and t0["val_loss"] == [[2, 1.5], [4, 1.7]]
    assert t0["train_loss"] == [[1, 1.9], [2, 1.8], [3, 1.7], [4, 1.6]]  # step 3 logged twice: the later line wins
    assert doc["evaluated"] == [1, 2] and doc["tasks"] == {"train": ["a", "b"], "test": ["t"]}


def test_report_files_schema_and_rebuild(built):
    store = built.store
    doc = rp.write_report(built)
    files = store.list(f"{RUN}/report/")
    assert sorted(k.rsplit("/", 1)[1] for k in files) == sorted(doc["files"] + ["_manifest.json"])
    for png in rr.PLOTS:
        assert store.get_bytes(f"{RUN}/report/{png}")[:8] == b"\x89PNG\r\n\x1a\n"
    md = store.get_bytes(f"{RUN}/report/report.md").decode()
    assert "| L1 vs L0 | train | 3 | 1 | 1 | 1 | 75.0% |" in md and "required output missing: fib.py" in md
    assert "| L0 | judge directive | 1 |" in md
    assert "## Flagged for review (1)" in md and "L0 a episode ep-0 (not trained): report.md states error 0.02" in md
    assert "| L0 | flagged for review | 1 |" in md
    assert json.loads(store.get_bytes(f"{RUN}/report/report.json")) == doc
    assert set(read_manifest(store, f"{RUN}/report")["outputs"]) == {f"{RUN}/report/{f}" for f in doc["files"]}
    before = {k: store.get_bytes(k) for k in files}
    store.delete(f"{RUN}/report/_manifest.json")  # stored already: only a lost manifest rebuilds it
    rp.write_report(built)
    assert {k: store.get_bytes(k) for k in files} == before  # identical bytes, plots included


def test_a_finished_run_prints_its_figures_with_what_each_shows(built):
    from mass_jobs.commands.common import report_lines

    doc = rp.write_report(built)
    lines = report_lines(built, "done; ")
    where = built.store.uri.removeprefix("file://").rstrip("/") + f"/{RUN}/report"
    assert lines[0] == f"done; report: {where}/report.md (JSON: {where}/report.json)" and lines[1] == "figures:"
    assert [ln.split()[0] for ln in lines[2 : 2 + len(rr.PLOTS)]] == [f"{where}/{p}" for p in rr.CAPTIONS]
    every = [w for w in doc["win_share"] if w["split"] == "all"]
    assert len(every) >= 2
    assert lines[2 + len(rr.PLOTS)] == "  win share: " + "; ".join(
        f"L{w['candidate']} vs L{w['baseline']} {w['win_share']:.0%} [{w['ci'][0]:.0%}, {w['ci'][1]:.0%}], "
        f"n={w['wins'] + w['losses']}"
        for w in every
    )
    assert lines[-1].startswith("WARNING: ") == bool(doc["warnings"])


def test_the_reports_done_check_reads_manifests_and_a_finished_step_redoes_it(built, monkeypatch):
    """`mass status` must not rebuild the report (bootstrap, embeddings) to say it is stored: its
    Step hashes the spec and the other steps' manifests; a step finished since makes it pending."""
    from mass_jobs.pipeline import table as P
    from mass_jobs.store import Step

    report = P.by_name("report")
    assert report.done(built, 0) is False
    doc = rp.write_report(built)
    monkeypatch.setattr(rp, "build_report", lambda *a, **kw: pytest.fail("the report was rebuilt"))
    assert report.done(built, 0) is True
    assert rp.write_report(built) == doc  # stored: returned as is
    Step(built.store, f"{RUN}/gen-1/late", {"x": 1}).finish([])
    assert report.done(built, 0) is False
    monkeypatch.undo()
    assert rp.write_report(built)["files"] == doc["files"] and report.done(built, 0) is True


def test_schema_file_is_generated_and_rejects_unknown_keys(built):
    assert json.loads(rd.SCHEMA_PATH.read_text()) == rd.report_schema()
    doc = rp.build_report(built)
    rd.validate_report(doc)
    with pytest.raises(ValueError, match="win_sharee"):
        rd.validate_report({**doc, "win_sharee": []})
    with pytest.raises(ValueError, match=r"\$\.win_share\.0\.wins"):
        rd.validate_report({**doc, "win_share": [{**doc["win_share"][0], "wins": "3"}]})


def test_empty_store_still_reports(tmp_path):
    ctx = RunContext(spec(tmp_path / "s"), FileStore(tmp_path / "s"))
    doc = rp.write_report(ctx)
    assert doc["win_share"] == [] and doc["evaluated"] == [] and doc["verdicts"]["panel"]["total"] == 0


def figure_texts(fig) -> str:
    """Every text a reader sees in a figure: titles, axis labels, tick labels, annotations, legends, tables."""
    out = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        out += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() + ax.texts]
        if ax.get_legend():
            out += [t.get_text() for t in ax.get_legend().get_texts()]
        for table in ax.tables:
            out += [c.get_text().get_text() for c in table.get_celld().values()]
    return "\n".join(out)


@pytest.fixture
def biased(tmp_path):
    """Three judges, one seed each, one self-evaluator: every pair splits 1 win / 1 loss / 1 tie (no
    majority), and the two judges that decide always answer 'A' over pairs shown in both orders."""
    store = FileStore(tmp_path / "biased")
    doc = spec(tmp_path / "biased").model_dump(mode="json", exclude_none=True)
    doc["judges"] = [
        {"name": n, "endpoint": "http://127.0.0.1:9/v1", "model": "judge", "seeds": [1]} for n in ("j1", "j2", "j3")
    ]
    ctx = RunContext(validate_document(doc), store)
    for task in ("a", "b", "t"):
        for rep in (0, 1):
            for judge, order, winner in (
                ("j1", "candidate_first", "A"),
                ("j2", "baseline_first", "A"),
                ("j3", "candidate_first", "tie"),
            ):
                store.put_json(
                    f"{RUN}/eval/verdicts/gen-1-vs-gen-0/{task}/rep-{rep}/panel-{judge}-seed-1.json",
                    {
                        "task": task,
                        "replicate": rep,
                        "candidate": 1,
                        "baseline": 0,
                        "judge": judge,
                        "kind": "panel",
                        "model": "judge",
                        "seed": 1,
                        "order": order,
                        "winner": winner,
                        "valid": True,
                        "rationale": "r",
                        "attempts": 1,
                        "errors": [],
                    },
                )
            put_verdict(store, 1, 0, task, rep, "gen-1", 0, "win", kind="self")
        for d in (False, True):
            store.put_json(f"{RUN}/eval/gen-1/{task}/rep-{int(d)}/audit.json", {"delegation": d, "code_handoff": False})
    store.put_json(f"{RUN}/eval/gen-1/_manifest.json", {"step": "e", "input_hash": "x", "outputs": {}, "extra": {}})
    return ctx


def test_split_panel_reads_no_majority_and_position_bias_is_noted(biased):
    doc = rp.write_report(biased)
    assert doc["agreement"] == [{"evaluator": 1, "agree": 0, "pairs": 0, "no_majority": 6, "rate": None}]
    ws = {w["split"]: w for w in doc["win_share"]}
    assert (ws["all"]["wins"], ws["all"]["losses"], ws["all"]["ties"], ws["all"]["win_share"]) == (6, 6, 6, 0.5)
    assert ws["all"]["positions"] == {"A": 12, "B": 0, "candidate_first": 6, "baseline_first": 6}
    assert ws["all"]["note"].startswith("position bias: all 12 decisive verdicts chose Workspace A")
    assert ws["train"]["note"].startswith("position bias: all 8 ") and ws["test"]["note"].startswith(
        "position bias: all 4 "
    )
    md = biased.store.get_bytes(f"{RUN}/report/report.md").decode()
    assert (
        "| L1 | 0 | 0 | 6 | no majority: 6 |" in md
        and "0.0%" not in md.split("## Evaluator agreement")[1].split("##")[0]
    )
    assert "| L1 vs L0 | all | 6 | 6 | 6 | 0 | 50.0% |" in md and "position bias: 12/12 chose A |" in md
    # the report opens with how to read it, naming the noise with this run's own numbers
    assert md.startswith(f"# MASS run `{RUN}`\n\n## How to read this\n\n- ")
    how = doc["how_to_read"]
    assert all(f"- {line}" in md.split("\nGenerations:")[0] for line in how)
    assert "1 of 1 comparisons (all tasks, n = 12 decisive verdicts) have an interval that contains 50%" in how[1]
    assert how[2].startswith("1 of 1 comparisons have a judge that chose the same position")
    assert "(0 here); 6 pairs had no majority" in how[3]
    assert "(n = 6 per generation)" in how[4]


def test_win_share_marks_position_bias_per_point_not_per_series():
    """One biased point of a series is hollow; the series' other points stay filled."""
    from matplotlib.colors import to_rgba

    point = {"split": "train", "baseline": 0, "wins": 3, "losses": 1, "ci": [0.3, 0.9]}
    doc = {
        "win_share": [
            {**point, "candidate": 1, "win_share": 0.75, "note": None},
            {**point, "candidate": 2, "win_share": 0.5, "note": "position bias: all 4 chose A"},
        ],
        "evaluated": [1, 2],
        "verdicts": {"panel": {"valid": 8, "total": 8, "invalid": 0}},
    }
    import matplotlib.pyplot as plt

    fig, ax = rf.win_share_figure(doc)
    [dots] = [c for c in ax.collections if c.get_label() == "train vs L0"]
    faces = [tuple(f) for f in dots.get_facecolors()]
    assert faces == [to_rgba("tab:blue"), to_rgba("white")]
    plt.close(fig)


def test_every_plot_says_its_n(biased, built):
    # win share points: (train, test) decisive verdicts of each comparison, read from the figure itself
    for ctx, n_win, n_audit in ((biased, ["n=4", "n=8"], "n=6"), (built, ["n=1", "n=2", "n=2", "n=4"], "n=2")):
        doc = rp.build_report(ctx)
        figs = dict(rf.figures(doc))
        assert set(figs) == set(rr.PLOTS)
        assert sorted(t.get_text() for t in figs["win_share.png"].axes[0].texts) == n_win
        texts = {name: figure_texts(fig) for name, fig in figs.items()}
        assert "n = decisive verdicts per point" in texts["win_share.png"]
        # audit: each generation's episodes under its bar group
        assert f"L1\n{n_audit}" in texts["audit.png"]
        assert "n episodes" in texts["tokens.png"] and "train tasks per generation" in texts["search.png"]
        for fig in figs.values():
            plt.close(fig)
    figs = {name: figure_texts(fig) for name, fig in rf.figures(rp.build_report(built))}
    assert "n = 2 train tasks" in figs["search.png"] and "L0 (n=2 tasks)" in figs["search.png"]
    assert "L0 -> L1\nn = 4 steps, 2 val points, 400 tokens" in figs["loss.png"]
    assert "L0\nn=2" in figs["audit.png"] and "1/2" in figs["audit.png"] and "2/2" in figs["audit.png"]
    rows = figs["tokens.png"].split("\n")
    assert "n episodes" in rows and "4" in rows and "2" in rows  # L0: 4 status records; L1: 2


def episode_status(outcome: str, tool_calls: int = 0, harness: str = "qwen-code") -> dict:
    return {
        "outcome": outcome,
        "reason": "r",
        "harness": harness,
        "counts": {"turns": 1, "tool_calls": tool_calls, "delegations": 0, "agents": 1},
        "tokens": {"prompt": 1, "completion": 1},
        "timings": {"wall_s": 1.0},
        "sandbox": {"network_isolated": False, "note": ""},
    }


def test_episodes_are_counted_by_outcome_per_generation_and_stage(built):
    """Every outcome an episode can end with is a column, turn_limit (qwen-code's --max-session-turns) included."""
    store = built.store
    for i, outcome in enumerate(["success", "turn_limit", "turn_limit", "infra_error"]):
        store.put_json(
            f"{built.collect_root(0)}/a/ep-{i}/status.json",
            episode_status(outcome, tool_calls=5 if outcome == "success" else 1),
        )
    store.put_json(f"{built.collect_root(0)}/a/ep-9/input/status.json", episode_status("success"))  # a pod's copy
    doc = rp.build_report(built)
    rd.validate_report(doc)
    [collect] = [x for x in doc["outcomes"] if (x["generation"], x["stage"]) == (0, "collect")]
    assert collect["episodes"] == 4 and collect["by_outcome"] == {
        "success": 1,
        "no_work": 0,
        "failed": 0,
        "turn_limit": 2,
        "loop_detected": 0,
        "timeout": 0,
        "infra_error": 1,
    }
    assert (collect["tool_calls"], collect["tool_calls_per_episode"]) == (8, 2.0)
    md = rr.render_markdown(doc)
    assert "| generation | stage | episodes | tool calls / episode | success | turn_limit | infra_error |" in md
    assert "| L0 | collect | 4 | 2 | 1 | 2 | 1 |" in md
    assert doc["warnings"] == [] and "## Warnings" not in md


def test_a_run_whose_episodes_did_no_work_says_so_first(built):
    """Most collect episodes of L0 ended without a workspace tool call: the report opens with it."""
    store = built.store
    for i, outcome in enumerate(["no_work", "no_work", "success", "no_work"]):
        store.put_json(f"{built.collect_root(0)}/a/ep-{i}/status.json", episode_status(outcome, harness="builtin"))
    doc = rp.build_report(built)
    rd.validate_report(doc)
    assert doc["warnings"][0] == (
        "L0 collect: 3 of 4 episodes did no work (finished without a workspace tool call; 0 tool calls in all)"
    )
    md = rr.render_markdown(doc)
    assert md.index("## Warnings") < md.index("## How to read this")
    assert "| L0 | collect | 4 | 0 | 1 | 3 |" in md
    # two of four is not most: no warning
    store.put_json(f"{built.collect_root(0)}/a/ep-3/status.json", episode_status("success", harness="builtin"))
    assert not any(w.startswith("L0 collect") for w in rp.build_report(built)["warnings"])


def test_mostly_invalid_verdicts_are_a_warning():
    doc = {
        "outcomes": [],
        "verdicts": {"panel": {"total": 8, "valid": 0, "invalid": 8}, "self": {"total": 4, "valid": 2, "invalid": 2}},
    }
    assert reading.run_warnings(doc) == ["panel verdicts: 8 of 8 invalid (the judge's answers could not be read)"]


def test_episodes_without_a_sandbox_are_a_warning_naming_the_setting():
    outcomes = [
        {
            "generation": 0,
            "stage": "collect",
            "episodes": 4,
            "by_outcome": {"success": 4},
            "tool_calls": 9,
            "unsandboxed": 4,
        },
        {
            "generation": 0,
            "stage": "evaluate",
            "episodes": 2,
            "by_outcome": {"success": 2},
            "tool_calls": 3,
            "unsandboxed": 0,
        },
    ]
    doc = {"outcomes": outcomes, "verdicts": {}}
    assert reading.run_warnings(doc) == [
        "execution.sandbox: none: 4 episodes ran model-written code without a sandbox, "
        "with this machine's filesystem and network (L0 collect 4)"
    ]
    outcomes[0]["unsandboxed"] = 0
    assert reading.run_warnings(doc) == []


def test_episodes_are_counted_by_the_cap_that_ended_them(built):
    """Each cap of execution.limits is a column, with the outcome and reason each harness ends it with."""
    from mass_jobs.episodes.harness import CAPS, TOOL_CALL_CAP, episode_cap
    from mass_jobs.episodes.qwen_code import limit_breach

    store = built.store
    base = {
        "harness": "qwen-code",
        "counts": {"turns": 1, "tool_calls": 0, "delegations": 0, "agents": 1},
        "tokens": {"prompt": 1, "completion": 1},
        "timings": {"wall_s": 1.0},
        "sandbox": {"network_isolated": False, "note": ""},
    }
    ended = [
        ("turn_limit", "qwen-code reached its turn limit (2 turns per session)"),
        ("failed", f"{TOOL_CALL_CAP} 4 reached"),
        ("failed", f"{TOOL_CALL_CAP} 4 reached"),
        ("timeout", "wall time of 60s exceeded"),
        ("loop_detected", "t0 made the same call ls() 3 times in a row"),
        ("failed", "qwen-code ended with error_max_turns: no"),
        ("success", "qwen-code finished"),
    ]
    for i, (outcome, reason) in enumerate(ended):
        store.put_json(f"{built.collect_root(0)}/a/ep-{i}/status.json", {**base, "outcome": outcome, "reason": reason})
    doc = rp.build_report(built)
    rd.validate_report(doc)
    [collect] = [x for x in doc["outcomes"] if (x["generation"], x["stage"]) == (0, "collect")]
    assert collect["by_cap"] == {"turns_per_agent": 1, "tool_calls": 2, "wall_s": 1, "loop_repeats": 1}
    assert list(collect["by_cap"]) == list(CAPS)
    md = rr.render_markdown(doc)
    assert "| generation | stage | turns_per_agent | tool_calls | wall_s | loop_repeats |" in md
    assert "| L0 | collect | 1 | 2 | 1 | 1 |" in md
    # the qwen-code harness's own tool-call cap words its reason so
    from mass_jobs.config.run_spec import EpisodeLimits, Sampling
    from mass_jobs.episodes.harness import EpisodeInput
    from mass_jobs.serving.llm import Endpoint

    inp = EpisodeInput(
        prompt="p",
        endpoint=Endpoint(base_url="http://127.0.0.1:1/v1", model="m"),
        limits=EpisodeLimits(tool_calls=1),
        sampling=Sampling(),
    )
    calls = [{"function": {"name": "ls", "arguments": str(i)}} for i in range(2)]
    records = [
        {
            "request": {"messages": [{"role": "user", "content": "p"}]},
            "response": {"message": {"role": "assistant", "tool_calls": calls}},
        }
    ]
    outcome, reason = limit_breach(records, inp)
    assert episode_cap({"outcome": outcome, "reason": reason}) == "tool_calls"


def test_training_on_no_work_episodes_is_a_warning_naming_the_setting():
    doc = {
        "outcomes": [
            {"generation": 0, "stage": "collect", "episodes": 3, "by_outcome": {"no_work": 3}},
            {"generation": 0, "stage": "evaluate", "episodes": 2, "by_outcome": {"no_work": 2}},
            {"generation": 1, "stage": "collect", "episodes": 3, "by_outcome": {"no_work": 1}},
        ]
    }
    assert reading.trained_no_work(doc, keep_no_work=True) == [
        "collection.keep_no_work is true: 4 teacher episodes that did no work were ranked and trained on as "
        "successes (L0 3, L1 1)"
    ]
    assert reading.trained_no_work(doc, keep_no_work=False) == []


def test_invalid_ranking_verdicts_are_counted_in_the_report_and_in_status(built):
    from mass_jobs.pipeline.table import _rank_verdicts

    verdicts = [{"valid": True}, {"valid": False}, {"valid": False}]
    built.store.put_json(built.rank(0, "a"), {"task": "a", "gen": 0, "verdicts": verdicts, "invalid_verdicts": 2})
    doc = rp.build_report(built)
    assert doc["verdicts"]["rank"] == {"total": 3, "valid": 1, "invalid": 2}
    assert "ranking self-verdicts: 2 of 3 invalid (the judge's answers could not be read)" in doc["warnings"]
    assert "ranking 3 (2 invalid: left out of the Bradley-Terry fit)" in rr.render_markdown(doc)
    assert _rank_verdicts(built, 0) == "3 verdicts, 2 invalid" and _rank_verdicts(built, 1) == ""


def test_episodes_their_agent_pod_ended_are_counted_per_task(built):
    from mass_jobs.episodes.rollouts import ENDED_BY_POD, lost_agent_status

    for ep in ("ep-7", "ep-8"):
        status = lost_agent_status("builtin", f"{ENDED_BY_POD}; no proof.json", "pod")
        built.store.put_json(f"{built.collect_root(0)}/a/{ep}/status.json", status)
    doc = rp.build_report(built)
    collect = next(o for o in doc["outcomes"] if o["generation"] == 0 and o["stage"] == "collect")
    assert collect["ended_by_pod"] == {"a": 2}
    assert any(
        w.startswith("2 episodes were ended by their agent pod, not their harness") and w.endswith("L0 collect a 2")
        for w in doc["warnings"]
    ), doc["warnings"]


def test_the_report_counts_each_stage_s_requests(tmp_path):
    store = FileStore(tmp_path / "s")
    ctx = RunContext(spec(tmp_path / "s"), store)
    net = [
        {"requests": 3, "allowed": 2, "denied": 1, "bytes_up": 10, "bytes_down": 500, "hosts": ["pypi.org"]},
        {"requests": 1, "allowed": 1, "denied": 0, "bytes_up": 5, "bytes_down": 70, "hosts": ["stooq.com"]},
        None,
    ]
    for i, n in enumerate(net):
        store.put_json(
            f"{ctx.collect_root(0)}/a/ep-{i}/status.json",
            {**episode_status("success", 1), **({"network": n} if n else {})},
        )
    store.put_json(f"{ctx.search_root(0)}/a/r-0/status.json", episode_status("success", 1))
    doc = rp.build_report(ctx)
    rd.validate_report(doc)
    rows = {x["stage"]: x.get("network") for x in doc["outcomes"] if x["generation"] == 0}
    assert rows["search"] is None
    assert rows["collect"] == {
        "episodes": 2,
        "requests": 4,
        "allowed": 3,
        "denied": 1,
        "bytes_down": 570,
        "hosts": ["pypi.org", "stooq.com"],
    }
    assert "| L0 | collect | 2 | 4 | 3 | 1 | 570 | pypi.org, stooq.com |" in rr.render_markdown(doc)
