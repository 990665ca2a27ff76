"""Attach a fresh LoRA (peft) to the parent model and name what is trainable."""

from __future__ import annotations

from mass_jobs.models import LoraSpec


def attach_lora(model, lora: LoraSpec):
    """Wrap `model` with a LoRA adapter; only the adapter's A and B matrices stay trainable."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in lora.target_modules if m not in present]
    if missing:
        raise ValueError(
            f"sft.lora.target_modules {missing} not found in the model (it has e.g. {sorted(present)[:12]})"
        )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def trainable_named_parameters(model) -> dict:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}
