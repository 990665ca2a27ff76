"""Workflow information proxies: the Gaussian MI/TC estimators against closed form on synthetic
Gaussian data, task-mean removal against a confounded design, the local embedder, and the report's
section computed from a hand-built store."""

import json
import math

import numpy as np
import pytest

from mass_jobs.judging import information as info
from mass_jobs.judging.embed import HashEmbedder
from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import validate_document
from mass_jobs.steps import report as rp
from mass_jobs.store import FileStore

N = 200_000  # samples: the estimator's bias (~ d1*d2 / 2n) and noise are then below 1e-3 nats


def random_cov(p, seed):
    a = np.random.default_rng(seed).normal(size=(p, p))
    return a @ a.T + 0.5 * np.eye(p)


def draw(cov, n=N, seed=1):
    return np.random.default_rng(seed).multivariate_normal(np.zeros(len(cov)), cov, size=n)


def test_mi_of_correlated_pairs_matches_closed_form():
    # X, Y each 3-d, coordinate i of X correlated rho with coordinate i of Y: I = -1.5 log(1 - rho^2)
    rho, d = 0.6, 3
    cov = np.eye(2 * d)
    for i in range(d):
        cov[i, d + i] = cov[d + i, i] = rho
    xy = draw(cov)
    expected = -0.5 * d * math.log(1 - rho**2)
    assert expected == pytest.approx(0.6695, abs=1e-4)
    assert info.gaussian_mi(xy[:, :d], xy[:, d:]) == pytest.approx(expected, abs=0.01)
    assert info.gaussian_tc_from_cov(cov, [range(d), range(d, 2 * d)]) == pytest.approx(expected, abs=1e-12)


def test_tc_of_a_random_covariance_matches_closed_form():
    cov = random_cov(5, seed=3)
    expected = 0.5 * (np.log(np.diag(cov)).sum() - np.linalg.slogdet(cov)[1])
    assert expected > 0.5  # a genuinely dependent design, so the comparison means something
    assert info.gaussian_tc(draw(cov)) == pytest.approx(expected, abs=0.01)
    blocks = [[0, 1], [2], [3, 4]]  # block TC: sum of block log-dets minus the joint
    by_blocks = 0.5 * (sum(np.linalg.slogdet(cov[np.ix_(b, b)])[1] for b in blocks) - np.linalg.slogdet(cov)[1])
    assert info.gaussian_tc(draw(cov), blocks) == pytest.approx(by_blocks, abs=0.01)
    assert by_blocks < expected  # grouping hides the dependence inside blocks


def test_independent_variables_give_near_zero_and_constant_columns_are_refused():
    x = np.random.default_rng(0).normal(size=(N, 4))
    assert abs(info.gaussian_tc(x)) < 2e-4
    with pytest.raises(ValueError, match=r"columns \[1\] are constant"):
        info.gaussian_tc(np.column_stack([x[:, 0], np.ones(N)]))


def test_task_mean_removal_separates_between_task_confounding_from_within_task_dependence():
    rng = np.random.default_rng(7)
    tasks = np.repeat(np.arange(200), 500)
    offset = rng.normal(scale=2.0, size=200)[tasks]  # the task drives both variables
    # within a task: (e, y) jointly Gaussian with correlation 0.3 -> I = -0.5 log(1 - 0.09)
    z = rng.multivariate_normal([0, 0], [[1, 0.3], [0.3, 1]], size=len(tasks))
    e, y = offset + z[:, 0], offset + z[:, 1]
    raw = info.gaussian_mi(e, y)
    within = info.gaussian_mi(info.remove_group_means(e[:, None], tasks), info.remove_group_means(y[:, None], tasks))
    assert raw > 0.5  # mostly the shared task offset (correlation about (4 + 0.3) / 5)
    assert within == pytest.approx(-0.5 * math.log(1 - 0.09), abs=0.01)


def test_hash_embedder_is_deterministic_normalised_and_lexical():
    emb = HashEmbedder(64)
    texts = ["the coder writes fib.py and tests it", "the coder writes fib.py and checks it", "plot the sharpe ratio"]
    a, b = emb.embed(texts), emb.embed(list(texts))
    assert a.shape == (3, 64) and np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert a[0] @ a[1] > 0.5 > abs(a[0] @ a[2])
    with pytest.raises(ValueError, match="dim"):
        HashEmbedder(1)


# ---------------------------------------------------------------- from the store into the report

RUN = "inf"
WF_GOOD = {
    "agents": [
        {"id": "orchestrator", "role": "lead", "instruction": "split the work, check every file"},
        {"id": "coder", "role": "coder", "instruction": "write fib.py with unit tests"},
    ],
    "hops": [],
}
WF_BAD = {"agents": [{"id": "orchestrator", "role": "lead", "instruction": "do everything alone quickly"}], "hops": []}


def state(records, selection="elite"):
    return {"beats_reference": False, "selection": selection, "iterations": records}


def rec(k, wf, outcome, won):
    v = {"valid": True, "winner": f"iter-{k}" if won else "iter-0", "rationale": ""}
    return {
        "k": k,
        "workflow": wf,
        "outcome": outcome,
        "preferred": won and k > 0,
        "verdict": None if k == 0 else v,
        "reference_verdict": v if k == 0 else None,
    }


@pytest.fixture
def ctx(tmp_path):
    spec = validate_document(
        {
            "name": RUN,
            "model": {"base": "m"},
            "generations": 1,
            "tasks": [{"id": t, "split": "train", "prompt": f"do {t}"} for t in ("a", "b")]
            + [{"id": "t", "split": "test", "prompt": "do t"}],
            "search": {"iterations": 5},
            "store": {"uri": f"file://{tmp_path}/s"},
        }
    )
    store = FileStore(tmp_path / "s")
    # per task 6 rollouts alternating the good and the bad workflow, plus a failed proposal (no rollout)
    outcomes = ["success", "failed", "success", "failed", "failed", "success"]
    wins = [True, False, True, False, True, True]
    for task in ("a", "b"):
        recs = [rec(k, WF_GOOD if k % 2 == 0 else WF_BAD, outcomes[k], wins[k]) for k in range(6)]
        recs.insert(3, {"k": 99, "workflow": None, "outcome": None, "preferred": False})
        store.put_json(f"{RUN}/gen-0/search/{task}/state.json", state(recs))
    return RunContext(spec, store)


def test_search_samples_and_proxies_from_a_store(ctx):
    samples = info.search_samples({"a": ctx.store.get_json(ctx.search_state(0, "a"))})
    assert [(s["k"], s["outcome"], s["verdict"]) for s in samples] == [
        (0, 1, 1),
        (1, 0, 0),
        (2, 1, 1),
        (3, 0, 0),
        (4, 0, 1),
        (5, 1, 1),
    ]  # the failed proposal is no sample
    # under the champion rule every version's verdict is the one against the reference
    champ = [
        dict(r, verdict=None, reference_verdict=r.get("verdict") or r.get("reference_verdict"))
        for r in ctx.store.get_json(ctx.search_state(0, "a"))["iterations"]
    ]
    assert [s["verdict"] for s in info.search_samples({"a": state(champ, "champion")})] == [1, 0, 1, 0, 1, 1]
    assert [s["verdict"] for s in info.search_samples({"a": state(champ, "elite")})] == [1, 0, 0, 0, 0, 0]
    rows = info.workflow_information(ctx)
    assert len(rows) == 1
    r = rows[0]
    assert (r.generation, r.samples, r.tasks, r.success_rate, r.win_rate) == (0, 12, 2, 0.5, 0.666667)
    # Two distinct texts: the one principal component is the good/bad indicator g, so the Gaussian MI is
    # -0.5 log(1 - phi^2) of the 2x2 tables. g x outcome: 2 1 / 1 2 -> phi = 1/3;
    # g x verdict: 3 0 / 1 2 -> phi = 6 / sqrt(72), MI = 0.5 log 2.
    assert r.dims == 1
    assert r.mi_outcome == pytest.approx(-0.5 * math.log(1 - 1 / 9), abs=1e-6)
    assert r.mi_verdict == pytest.approx(0.5 * math.log(2), abs=1e-6)
    g = np.array([1, 0, 1, 0, 1, 0] * 2)
    o = np.array([1, 0, 1, 0, 0, 1] * 2)
    v = np.array([1, 0, 1, 0, 1, 1] * 2)
    assert r.tc == pytest.approx(-0.5 * np.linalg.slogdet(np.corrcoef([g, o, v]))[1], abs=1e-6)
    # both tasks hold the same pattern: removing task means leaves every correlation as it was
    assert (r.dims_within, r.mi_outcome_within, r.tc_within) == (1, r.mi_outcome, r.tc)


def test_report_has_the_information_section_and_plot(ctx):
    doc = rp.write_report(ctx)
    assert [x["samples"] for x in doc["information"]] == [12]
    assert "information.png" in doc["files"]
    assert ctx.store.get_bytes(f"{RUN}/report/information.png")[:8] == b"\x89PNG\r\n\x1a\n"
    md = ctx.store.get_bytes(f"{RUN}/report/report.md").decode()
    assert "Workflow information (Gaussian proxies)" in md and "| L0 | hash-256 | 12 | 2 |" in md
    assert json.loads(ctx.store.get_bytes(f"{RUN}/report/report.json"))["information"][0]["embedder"] == "hash-256"


# ---------------------------------------------------------------- a transformer embedder from a local dir


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A 1-layer BERT with a 20-word vocabulary, built here (the format of a packaged sentence encoder)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d = tmp_path_factory.mktemp("tiny-encoder")
    words = "the coder writes fib py and tests it plot sharpe ratio report checks".split()
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
    BertTokenizerFast(vocab_file=str(d / "vocab.txt")).save_pretrained(d)
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=6 + len(words),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(d)
    return d


def test_transformer_embedder_pools_real_tokens_only(tiny_encoder):
    from mass_jobs.judging.embed import TransformerEmbedder, make_embedder

    emb = TransformerEmbedder(tiny_encoder, batch_size=8)
    short, long = "the coder writes fib.py", "plot the sharpe ratio and report checks and tests it"
    alone = emb.embed([short])
    batched = emb.embed([short, long])  # padded to the longer text: padding must not move the mean
    assert alone.shape == (1, 32) and np.allclose(np.linalg.norm(batched, axis=1), 1.0)
    assert np.allclose(alone[0], batched[0], atol=1e-5)
    assert not np.allclose(batched[0], batched[1], atol=1e-3)
    assert np.array_equal(make_embedder(str(tiny_encoder)).embed([short]), alone)
    assert make_embedder("hash").name == "hash-256"
    with pytest.raises(FileNotFoundError, match="config.json"):
        make_embedder(str(tiny_encoder / "missing"))


def test_the_reports_embedder_is_the_specs_and_its_done_check_agrees(ctx, tiny_encoder, tmp_path, capsys):
    """evaluation.embedder decides the information proxies; `mass status` rebuilds the report with
    the same one, so a report made with a model embedder reads done, not pending."""
    import yaml

    from mass_jobs.commands.cli import main as cli_main
    from mass_jobs.pipeline import table as P
    from mass_jobs.spec.load import load_spec

    spec = tmp_path / "spec.yaml"
    (tmp_path / "m").mkdir()  # model locations are checked: the spec's model exists
    doc = ctx.spec.model_dump(mode="json", exclude_defaults=True)
    doc.setdefault("evaluation", {})["embedder"] = str(tiny_encoder)
    spec.write_text(yaml.safe_dump(doc))
    RunContext(load_spec(spec), ctx.store).claim_spec()  # the run was started: its store holds its spec
    assert cli_main(["report", "--spec", str(spec)]) == 0
    info_rows = json.loads(ctx.store.get_bytes(f"{RUN}/report/report.json"))["information"]
    assert info_rows[0]["embedder"] == f"transformer-{tiny_encoder.name}" and info_rows[0]["samples"] == 12
    assert P.by_name("report").done(RunContext(load_spec(spec), ctx.store), 0) is True
    hashed = {**doc, "evaluation": {**doc["evaluation"], "embedder": "hash"}}
    spec.write_text(yaml.safe_dump(hashed))
    assert (
        P.by_name("report").done(RunContext(load_spec(spec), ctx.store), 0) is False
    )  # another embedder: redo the report
    spec.write_text(yaml.safe_dump({**doc, "evaluation": {**doc["evaluation"], "embedder": str(tmp_path / "nowhere")}}))
    assert cli_main(["report", "--spec", str(spec)]) == 2
    assert "$.evaluation.embedder: expected 'hash', 'minilm' or a model dir with config.json" in capsys.readouterr().err
