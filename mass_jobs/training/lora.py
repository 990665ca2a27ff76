"""Attach a fresh LoRA (peft) to the parent model, choosing its target layers from the model itself.

Without `sft.lora.target_modules` the targets are every linear layer of the language model (the
modules under `model.get_decoder()`), so a hybrid model's linear-attention projections
(`in_proj_qkv`, `in_proj_z`, `out_proj` in Qwen3.5-style layers) are adapted like its attention
and MLP projections, while vision towers, projectors and the LM head (all outside the decoder) are
not. A layer narrower than the rank on either side (the per-head gate projections `in_proj_a` and
`in_proj_b`) is left out: a rank-r update of it is no low-rank update. On the paper's model this
gives the target list of its public training script. Listed names are matched as peft matches
them (by name suffix, anywhere in the model).

Used by `mass train`; no command of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from mass_jobs.config.run_spec import LoraSpec


@dataclass(frozen=True)
class LoraTargets:
    modules: list[str]  # full module names (model root), or the spec's names
    skipped_narrow: list[str]  # linear layers of the language model left out for being narrower than r
    from_spec: bool


def language_model_linears(model) -> dict[str, object]:
    """Full name -> nn.Linear for every linear layer under the model's decoder (its language model)."""
    import torch.nn as nn

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        raise ValueError(
            f"{type(model).__name__} exposes no decoder (get_decoder) to take LoRA targets from; "
            "list them in sft.lora.target_modules"
        )
    inside = {id(m) for m in decoder.modules()}
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) in inside}


def resolve_targets(model, lora: LoraSpec) -> LoraTargets:
    """The modules a LoRA of `lora` adapts on `model` (see the module docstring)."""
    if lora.target_modules:
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [m for m in lora.target_modules if m not in present]
        if missing:
            raise ValueError(
                f"sft.lora.target_modules {missing} not found in the model (it has e.g. {sorted(present)[:12]})"
            )
        return LoraTargets(list(lora.target_modules), [], True)
    linears = language_model_linears(model)
    keep = [n for n, m in linears.items() if min(m.in_features, m.out_features) >= lora.r]
    narrow = sorted({n.rsplit(".", 1)[-1] for n in linears} - {n.rsplit(".", 1)[-1] for n in keep})
    if not keep:
        raise ValueError(f"no linear layer of the language model is at least sft.lora.r={lora.r} wide")
    return LoraTargets(keep, narrow, False)


def attach_lora(model, lora: LoraSpec, targets: LoraTargets | None = None):
    """Wrap `model` with a LoRA adapter; only the adapter's A and B matrices stay trainable."""
    from peft import LoraConfig, get_peft_model

    targets = targets or resolve_targets(model, lora)
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(targets.modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def adapted_summary(peft_model, targets: LoraTargets) -> dict:
    """What the adapter covers: layer kinds, module count, parameters adapted and trained."""
    kinds, modules, adapted, trainable = set(), 0, 0, 0
    for name, m in peft_model.named_modules():
        if hasattr(m, "lora_A") and hasattr(m, "base_layer") and "default" in getattr(m, "lora_A", {}):
            base = m.base_layer
            kinds.add(name.rsplit(".", 1)[-1])
            modules += 1
            adapted += base.weight.numel()
            trainable += sum(p.numel() for p in (m.lora_A["default"].weight, m.lora_B["default"].weight))
    return {
        "target_kinds": sorted(kinds),
        "adapted_modules": modules,
        "adapted_parameters": adapted,  # parent weights the adapter updates (sum of in x out)
        "lora_parameters": trainable,  # the adapter's own A and B (sum of r x (in + out))
        "skipped_narrow": targets.skipped_narrow,
        "targets_from_spec": targets.from_spec,
    }


def trainable_named_parameters(model) -> dict:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}
