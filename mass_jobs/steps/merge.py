"""Merge the selected LoRA adapter into its parent: the next generation's model (MASS step 6).

W += (alpha / r) * B @ A for every adapted linear layer, computed in float32 and stored in the
parent's dtype, saved as a loadable Hugging Face model dir (safetensors) with the parent's
tokenizer and chat template. With `sft.fp8_export` a block-FP8 copy (mass_jobs.serving.fp8) is written
beside it with its measured dequantisation error.

The merged model is stored as plain objects under `<run>/gen-<g+1>/model/` (config.json,
model.safetensors, tokenizer files): KServe's storage initializer downloads exactly such a
directory from s3://. The step's manifest is `<run>/gen-<g>/merge/_manifest.json` (outside the
model dir, so the served directory holds only the model).

Run: `mass merge --spec SPEC --gen G` (reads `select.json`, writes `<run>/gen-<g+1>/model/`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mass_jobs.config.errors import StepFailed
from mass_jobs.run.generation_model import local_model_dir
from mass_jobs.serving.fp8 import export_fp8
from mass_jobs.serving.model_dirs import store_model_dir
from mass_jobs.store import MODEL_LIMITS, Step, Waiting, formed

PREFIX = "base_model.model."


class MergeError(StepFailed, ValueError):
    """The adapter does not fit the parent, or uses a variant this merge does not implement."""


def merge_lora(parent_dir: Path, adapter_dir: Path, out_dir: Path) -> dict:
    """Write the merged model to out_dir; returns {module: scaling} of every merged layer."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    for flag in ("use_dora", "use_rslora"):
        if cfg.get(flag):
            raise MergeError(f"adapter_config.{flag} is set; only plain LoRA (alpha / r scaling) is merged here")
    scaling = cfg["lora_alpha"] / cfg["r"]
    adapter = load_file(Path(adapter_dir) / "adapter_model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(parent_dir, dtype="auto")
    merged = {}
    for key_a in sorted(k for k in adapter if k.endswith(".lora_A.weight")):
        path = key_a[len(PREFIX): -len(".lora_A.weight")]
        key_b = key_a.replace(".lora_A.", ".lora_B.")
        if key_b not in adapter:
            raise MergeError(f"adapter has {key_a} without {key_b}")
        try:
            layer = model.get_submodule(path)
        except AttributeError as err:
            raise MergeError(f"adapter module {path!r} is not in the parent model") from err
        if layer.weight is model.get_input_embeddings().weight:
            # a LoRA on a tied LM head changes the output projection only: untie before merging
            layer.weight = torch.nn.Parameter(layer.weight.detach().clone())
            model.config.tie_word_embeddings = False
        with torch.no_grad():
            delta = scaling * (adapter[key_b].float() @ adapter[key_a].float())
            if delta.shape != layer.weight.shape:
                raise MergeError(f"{path}: B @ A has shape {tuple(delta.shape)}, weight {tuple(layer.weight.shape)}")
            layer.weight.copy_((layer.weight.float() + delta).to(layer.weight.dtype))
        merged[path] = scaling
    if not merged:
        raise MergeError(f"{adapter_dir}: no lora_A/lora_B weights found")
    out = Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(parent_dir).save_pretrained(out)
    return merged


def run_merge(ctx, gen: int, work_dir: Path) -> dict:
    """select.json's checkpoint + gen g's model -> `<run>/gen-<g+1>/model/` (+ `model-fp8/`)."""

    step = formed(merge_step(ctx, gen), MergeError)
    chosen = ctx.store.get_json(ctx.select(gen))
    if step.done:
        return ctx.store.get_json(step.manifest_key)["extra"]
    step.start()
    work = Path(work_dir)
    adapter = work / f"step-{chosen['step']}"
    shutil.rmtree(adapter, ignore_errors=True)
    ctx.store.get_dir(chosen["checkpoint"], adapter, MODEL_LIMITS)
    merged_dir = work / "merged"
    layers = merge_lora(local_model_dir(ctx, gen, work / "models"), adapter, merged_dir)
    keys = store_model_dir(ctx.store, ctx.model(gen + 1), merged_dir)
    extra = {"step": chosen["step"], "merged_layers": len(layers), "scaling": next(iter(layers.values()))}
    if ctx.spec.sft.fp8_export:
        report = export_fp8(merged_dir, work / "merged-fp8")
        keys += store_model_dir(ctx.store, ctx.model_fp8(gen + 1), work / "merged-fp8")
        extra["fp8"] = {k: report[k] for k in ("tensors", "max_error_over_bound", "max_relative_frobenius_error")}
    step.finish(keys, extra=extra)
    return extra


def merge_step(ctx, gen: int):
    """The merge's Step: the selected checkpoint (key and content) and the FP8 export switch."""

    if not ctx.store.exists(ctx.select(gen)):
        return Waiting(f"generation {gen}: no selected checkpoint at {ctx.select(gen)} (run `mass select` first)")
    chosen = ctx.store.get_json(ctx.select(gen))
    return Step(ctx.store, ctx.merge_step(gen), inputs={
        "checkpoint": chosen["checkpoint"], "checkpoint_sha256": ctx.store.sha256(chosen["checkpoint"]),
        "fp8": ctx.spec.sft.fp8_export,
    }, owns=(ctx.model(gen + 1) + "/", ctx.model_fp8(gen + 1) + "/"))  # it writes the next generation's model
