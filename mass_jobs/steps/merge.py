"""Merge the selected LoRA adapter into its parent: the next generation's model (MASS step 6).

W += (alpha / r) * B @ A for every adapted linear layer, computed in float32 and stored in the
parent's dtype, shard by shard as the parent is laid out (`mass_jobs.serving.shards`): every other
tensor of the parent is copied as it is, vision tower and MTP weights included, with the parent's
config, tokenizer and chat template, as the paper's `merge_lora.py` does. With `sft.fp8_export` a
block-FP8 copy (mass_jobs.serving.fp8; in the layout of `sft.fp8_reference` when set) is written
beside it with its measured dequantisation error.

The merged model is stored as plain objects under `<run>/gen-<g+1>/model/` (config.json, the
safetensors shards and their index, tokenizer files): KServe's storage initializer downloads exactly
such a directory from s3://. The step's manifest is `<run>/gen-<g>/merge/_manifest.json` (outside the
model dir, so the served directory holds only the model).

Run: `mass merge --spec SPEC --gen G` (reads `select.json`, writes `<run>/gen-<g+1>/model/`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mass_jobs.config.errors import StepFailed
from mass_jobs.run.generation_model import local_model_dir
from mass_jobs.serving.fp8 import export_fp8, export_like
from mass_jobs.serving.model_dirs import resolve_model, store_model_dir
from mass_jobs.serving.shards import TensorReader, by_shard, copy_side_files, nbytes, write_index
from mass_jobs.store import MODEL_LIMITS, Step, Waiting, formed

PREFIX = "base_model.model."


class MergeError(StepFailed, ValueError):
    """The adapter does not fit the parent, or uses a variant this merge does not implement."""


def checkpoint_key(path: str, names) -> str | None:
    """The parent checkpoint's name for the weight of module `path` as the trainer named it. The
    trainer loads the causal LM; a multimodal checkpoint (Qwen3.5/3.6) keeps that text model under
    `model.language_model.`, which transformers renames on load, so both spellings are tried."""
    tail = path[len("model.") :] if path.startswith("model.") else None
    for key in (f"{path}.weight", f"model.language_model.{tail}.weight" if tail is not None else None):
        if key is not None and key in names:
            return key
    return None


def _adapter_pairs(adapter_dir: Path) -> tuple[dict, float]:
    """({module path: (A, B)}, alpha / r) of a plain LoRA adapter."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    for flag in ("use_dora", "use_rslora"):
        if cfg.get(flag):
            raise MergeError(f"adapter_config.{flag} is set; only plain LoRA (alpha / r scaling) is merged here")
    adapter = load_file(Path(adapter_dir) / "adapter_model.safetensors")
    pairs = {}
    for key_a in sorted(k for k in adapter if k.endswith(".lora_A.weight")):
        key_b = key_a.replace(".lora_A.", ".lora_B.")
        if key_b not in adapter:
            raise MergeError(f"adapter has {key_a} without {key_b}")
        pairs[key_a[len(PREFIX) : -len(".lora_A.weight")]] = (adapter[key_a], adapter[key_b])
    if not pairs:
        raise MergeError(f"{adapter_dir}: no lora_A/lora_B weights found")
    return pairs, cfg["lora_alpha"] / cfg["r"]


def merge_lora(parent_dir: Path, adapter_dir: Path, out_dir: Path) -> dict:
    """Write the merged model to out_dir, shard by shard as the parent is laid out: every tensor of
    the parent is copied (vision tower and MTP weights included), the adapted linear weights get
    W += (alpha / r) * B @ A in float32, cast back to their dtype. Config, tokenizer and template
    files are the parent's. Returns {module: scaling} of every merged layer."""
    import torch
    from safetensors.torch import save_file

    pairs, scaling = _adapter_pairs(adapter_dir)
    reader = TensorReader(parent_dir)
    config = json.loads((Path(parent_dir) / "config.json").read_text())
    targets, untied = {}, None
    for path in pairs:
        key = checkpoint_key(path, reader.map)
        if key is None and path == "lm_head" and _tied(config):
            untied = next((k for k in reader.map if k.endswith("embed_tokens.weight")), None)
            key = untied and "lm_head.weight"
        if key is None:
            raise MergeError(f"adapter module {path!r} is not in the parent model")
        targets[key] = path
    out = Path(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    mapping, total, merged = {}, 0, {}
    shards = by_shard(reader.map)
    for i, (shard, names) in enumerate(shards.items()):
        tensors = {n: reader.get(n) for n in names}
        if untied and i == len(shards) - 1:  # a LoRA on a tied head changes the output projection only
            tensors["lm_head.weight"] = reader.get(untied).clone()
        for key in sorted(set(tensors) & set(targets)):
            a, b = pairs[targets[key]]
            weight = tensors[key]
            with torch.no_grad():
                delta = scaling * (b.float() @ a.float())
                if delta.shape != weight.shape:
                    raise MergeError(
                        f"{targets[key]}: B @ A has shape {tuple(delta.shape)}, weight {tuple(weight.shape)}"
                    )
                tensors[key] = (weight.float() + delta).to(weight.dtype)
            merged[targets[key]] = scaling
        tensors = {n: t.contiguous() for n, t in tensors.items()}
        save_file(tensors, out / shard, metadata={"format": "pt"})
        mapping.update({n: shard for n in tensors})
        total += nbytes(tensors)
    write_index(out, mapping, total)
    copy_side_files(parent_dir, out)
    if untied:
        _untie(out / "config.json", config)
    return merged


def _tied(config: dict) -> bool:
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def _untie(path: Path, config: dict) -> None:
    config = dict(config)
    config["tie_word_embeddings"] = False
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {**config["text_config"], "tie_word_embeddings": False}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


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
        reference = ctx.spec.sft.fp8_reference
        report = (
            export_like(
                merged_dir,
                resolve_model(reference, store_options=ctx.store_options()),
                work / "merged-fp8",
                reference=reference,
            )
            if reference
            else export_fp8(merged_dir, work / "merged-fp8")
        )
        keys += store_model_dir(ctx.store, ctx.model_fp8(gen + 1), work / "merged-fp8")
        extra["fp8"] = {
            k: report[k]
            for k in (
                "tensors",
                "copied",
                "max_error_over_bound",
                "max_relative_frobenius_error",
                "peak_bytes_bound",
                "reference",
            )
        }
    step.finish(keys, extra=extra)
    return extra


def merge_step(ctx, gen: int):
    """The merge's Step: the selected checkpoint (key and content) and the FP8 export switch."""

    if not ctx.store.exists(ctx.select(gen)):
        return Waiting(f"generation {gen}: no selected checkpoint at {ctx.select(gen)} (run `mass select` first)")
    chosen = ctx.store.get_json(ctx.select(gen))
    return Step(
        ctx.store,
        ctx.merge_step(gen),
        inputs={
            "checkpoint": chosen["checkpoint"],
            "checkpoint_sha256": ctx.store.sha256(chosen["checkpoint"]),
            "fp8": ctx.spec.sft.fp8_export,
            # only when set, so the hash of a merge without a reference stays what earlier runs stored
            **({"fp8_reference": ctx.spec.sft.fp8_reference} if ctx.spec.sft.fp8_reference else {}),
        },
        owns=(ctx.model(gen + 1) + "/", ctx.model_fp8(gen + 1) + "/"),
    )  # it writes the next generation's model
