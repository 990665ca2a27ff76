"""The SFT benchmark's own parts (`make bench` itself is not run here): its windows are real
harness conversations with the template's masks, its loss-fall and FLOP counts are what it says,
and its model's head can express what a frozen stock head cannot."""

from __future__ import annotations

import json

import pytest

from mass_jobs.steps.sft_tokens import IGNORE
from mass_jobs.tools import bench, bench_report

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)


def test_windows_are_masked_harness_conversations_of_every_role():
    windows = bench.corpus_windows(10, 512, seed=7)
    assert len(windows) == 10
    assert {w["role"] for w in windows} == {"orchestrator", "worker", "auxiliary"}
    for w in windows:
        assert len(w["input_ids"]) == len(w["labels"]) <= 512
        supervised = [t for t in w["labels"][1:] if t != IGNORE]
        assert len(supervised) == w["n_supervised"] > 0
        assert w["labels"].count(IGNORE) > 0  # prompts and tool results carry no loss
        assert all(lab in (IGNORE, tok) for tok, lab in zip(w["input_ids"], w["labels"]))
    assert bench.corpus_windows(10, 512, seed=7) == windows  # deterministic for its seed


def test_loss_fall_compares_the_first_and_last_steps():
    losses = [9.0] * 10 + [7.0] * 20 + [6.0] * 10
    first, last, fall = bench_report.loss_fall(losses, k=10)
    assert (first, last) == (9.0, 6.0) and fall == pytest.approx(1 / 3)


def test_model_flops_count_the_layers_the_head_and_attention(tmp_path):
    cfg = {
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # per layer: q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8x16 -> 576 parameters; head 8 x 100
    linear_and_head = 2 * 576 + 8 * 100
    attention = 2 * 2 * 64 * 8  # forward: 2 x layers x window x query width
    assert bench.model_flops_per_token(tmp_path, 64) == 2 * 2 * linear_and_head + 3 * attention


def test_the_bench_model_head_spans_more_logits_than_the_stock_init(tmp_path):
    """At the stock init the largest logit a unit-RMS hidden state can give any token is about
    0.02 x H (2.6 at H 128): LoRA alone could not take the loss far. Scaled, it can."""
    import torch
    from transformers import AutoModelForCausalLM

    path = bench.bench_model(tmp_path)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny").get_output_embeddings().weight
    scaled = AutoModelForCausalLM.from_pretrained(path).get_output_embeddings().weight
    H = stock.shape[1]
    reach = lambda w: float(w.norm(dim=1).max()) * H**0.5  # noqa: E731  (|w_i| x |h| with |h| = sqrt(H))
    assert reach(stock) < 3.5 and reach(scaled) == pytest.approx(bench.EMBED_SCALE * reach(stock), rel=1e-5)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(path).get_input_embeddings().weight, scaled)  # tied
