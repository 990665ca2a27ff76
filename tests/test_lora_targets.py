"""LoRA targets resolved from the model: every linear layer of the language model, on a dense
tiny Qwen3 and on a hybrid-attention tiny Qwen3.5 (linear-attention layers, vision tower)."""

from __future__ import annotations

import pytest
import torch

from mass_jobs.config.run_spec import LoraSpec, OptimizerSpec, SftSpec
from mass_jobs.tiny.build import tiny_hybrid_model
from mass_jobs.training.loop import Trainer
from mass_jobs.training.lora import adapted_summary, attach_lora, resolve_targets
from tests.fixtures.training_data import synthetic_windows

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

ATTENTION = ["k_proj", "o_proj", "q_proj", "v_proj"]
MLP = ["down_proj", "gate_proj", "up_proj"]
LINEAR_ATTENTION = ["in_proj_qkv", "in_proj_z", "out_proj"]


def kinds(names):
    return sorted({n.rsplit(".", 1)[-1] for n in names})


def test_dense_model_gets_attention_and_mlp_projections(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    t = resolve_targets(model, LoraSpec(r=8))
    assert kinds(t.modules) == sorted(ATTENTION + MLP) and len(t.modules) == 2 * 7  # two layers
    assert not t.from_spec and t.skipped_narrow == []


def test_hybrid_model_adapts_linear_attention_but_not_vision_gates_or_head():
    model = tiny_hybrid_model(vision=True)
    assert model.config.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    t = resolve_targets(model, LoraSpec(r=8))
    assert kinds(t.modules) == sorted(ATTENTION + MLP + LINEAR_ATTENTION)
    assert all(n.startswith("model.language_model.layers.") for n in t.modules)  # no vision tower, no lm_head
    assert [n for n in t.modules if "linear_attn" in n] == [
        f"model.language_model.layers.{i}.linear_attn.{k}"
        for i in range(3)
        for k in ("out_proj", "in_proj_qkv", "in_proj_z")
    ]
    # the per-head gates (4 outputs, one per value head) are narrower than r = 8
    assert t.skipped_narrow == ["in_proj_a", "in_proj_b"]
    peft_model = attach_lora(model, LoraSpec(r=8, alpha=16, dropout=0.0), t)
    s = adapted_summary(peft_model, t)
    # per linear-attention layer: qkv 128x128 + z 128x64 + out 64x128 = 32,768 (x3); full attention:
    # q 128x256 (output gate) + k, v 128x64 + o 128x128 = 65,536; MLP 3 x 128x256 = 98,304 (x4)
    assert s["adapted_parameters"] == 3 * 32768 + 65536 + 4 * 98304 == 557056
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert s["lora_parameters"] == trainable == 8 * (3 * 640 + 1024 + 4 * 1152)  # r x (in + out), summed
    assert s["adapted_modules"] == 25 and s["target_kinds"] == sorted(ATTENTION + MLP + LINEAR_ATTENTION)
    assert not any("visual" in n for n, p in peft_model.named_parameters() if p.requires_grad)


def test_listed_names_are_used_and_unknown_ones_are_errors():
    model = tiny_hybrid_model()
    t = resolve_targets(model, LoraSpec(r=8, target_modules=["in_proj_qkv", "q_proj"]))
    assert t.from_spec and t.modules == ["in_proj_qkv", "q_proj"]
    s = adapted_summary(attach_lora(model, LoraSpec(r=8, target_modules=["in_proj_qkv", "q_proj"]), t), t)
    assert s["target_kinds"] == ["in_proj_qkv", "q_proj"] and s["adapted_modules"] == 3 + 1
    with pytest.raises(ValueError, match=r"target_modules \['qkv_proj'\] not found"):
        resolve_targets(tiny_hybrid_model(), LoraSpec(target_modules=["qkv_proj"]))
    with pytest.raises(ValueError, match="at least sft.lora.r=4096 wide"):
        resolve_targets(tiny_hybrid_model(), LoraSpec(r=4096))


def test_training_moves_the_linear_attention_adapters_and_records_the_count(hybrid_dir, tmp_path):
    sft = SftSpec(
        window=256,
        context=0,
        steps=2,
        val_every=2,
        save_every=2,
        gradient_checkpointing=True,
        loss_chunk=64,
        lora=LoraSpec(r=8, alpha=16, dropout=0.0),
        optimizer=OptimizerSpec(lr=2e-3, warmup_steps=1),
    )
    trainer = Trainer(
        hybrid_dir,
        synthetic_windows(4, 0, length=96),
        synthetic_windows(1, 1, length=96),
        sft,
        tmp_path / "out",
        progress=False,
    )
    trainer.setup()
    result = trainer.train()
    assert result.lora["adapted_parameters"] == 557056 and result.lora["skipped_narrow"] == ["in_proj_a", "in_proj_b"]
    moved = {n: float(p.detach().abs().max()) for n, p in trainer.peft_model.named_parameters() if "lora_B" in n}
    linear_attn = {n: v for n, v in moved.items() if ".linear_attn." in n}
    assert len(linear_attn) == 9 and len(moved) == 25  # lora_B starts at zero: every adapter moved
    assert all(v > 0 for v in moved.values()), [n for n, v in moved.items() if v == 0]
    assert all(torch.isfinite(torch.tensor(v)) for v in result.val_losses.values())
    # a spec that adapts the LM head keeps it in the model (full logits) and trains its adapter too
    head = Trainer(
        hybrid_dir,
        synthetic_windows(2, 0),
        [],
        sft.model_copy(update={"lora": LoraSpec(r=8, target_modules=["q_proj", "lm_head"])}),
        tmp_path / "x",
        progress=False,
    )
    head.setup()
    assert head.head_weight is None and head.lora_summary["target_kinds"] == ["lm_head", "q_proj"]
    loss, n = head.window_loss(synthetic_windows(1, 2, length=96)[0])
    loss.backward()
    grads = [p.grad for name, p in head.peft_model.named_parameters() if "lm_head.lora_B" in name]
    assert n > 0 and len(grads) == 1 and grads[0].abs().max() > 0
