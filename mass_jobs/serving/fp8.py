"""Block-FP8 weights: 128x128 blocks, float8 e4m3, one scale per block.

The layout serving stacks read (DeepSeek-V3 / transformers "fp8" with `weight_block_size`):
`<name>` holds float8_e4m3fn values and `<name>_scale_inv` the per-block scale, so
dequantised = fp8 * scale_inv, block by block. e4m3 keeps 3 mantissa bits, so rounding is
within 2^-4 of a value for normal numbers and within 2^-10 of the block scale for subnormals;
`error_bound` states exactly that and the export measures against it.

Used by `mass merge` when `sft.fp8_export` is set: `export_like` in the layout of the model's
official FP8 checkpoint (`sft.fp8_reference`), as the paper's code exports, else `export_fp8` by
name. Both go shard by shard: one output shard and one source tensor in memory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mass_jobs.serving.shards import TensorReader, by_shard, copy_side_files, nbytes, write_index

BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn
REL_STEP = 2.0**-4  # half an ulp relative to a normal value (3 mantissa bits)
SUB_STEP = 2.0**-10  # half the subnormal spacing (2^-9), in units of the block scale


def _blocks(w, block: int):
    import torch.nn.functional as F

    rows, cols = w.shape
    pr, pc = -rows % block, -cols % block
    padded = F.pad(w.float(), (0, pc, 0, pr))
    return padded.view((rows + pr) // block, block, (cols + pc) // block, block), (rows, cols)


def quantize_block_fp8(w, block: int = BLOCK):
    """(fp8 tensor of w's shape, float32 scale_inv of shape [ceil(rows/b), ceil(cols/b)])."""
    import torch

    blocks, (rows, cols) = _blocks(w, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    q = q.view(blocks.shape[0] * block, blocks.shape[2] * block)[:rows, :cols].contiguous()
    return q, scale.float()


def dequantize_block_fp8(q, scale_inv, block: int = BLOCK):
    blocks, (rows, cols) = _blocks(q.float(), block)
    out = blocks * scale_inv[:, None, :, None]
    return out.view(blocks.shape[0] * block, blocks.shape[2] * block)[:rows, :cols]


def error_bound(w, scale_inv, block: int = BLOCK):
    """Elementwise bound on |w - dequantize(quantize(w))|."""
    import torch

    per_elem_scale = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[: w.shape[0], : w.shape[1]]
    return torch.maximum(w.float().abs() * REL_STEP, per_elem_scale * SUB_STEP) * (1 + 1e-6)


def quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """Without a reference: linear weights of the decoder blocks; embeddings, norms and the LM head
    stay in full precision."""
    return len(shape) == 2 and ".layers." in name and name.endswith("_proj.weight")


class Fp8ExportError(ValueError):
    """The model and the FP8 reference do not hold the same tensors (the message names them)."""


def _measure(t, q, s, block: int) -> dict:
    err = (dequantize_block_fp8(q, s.float(), block) - t.float()).abs()
    bound = error_bound(t, s.float(), block)
    return {
        "max_abs_error": float(err.max()),
        "max_error_over_bound": float((err / bound).max()),
        "relative_frobenius_error": float(err.norm() / t.float().norm().clamp_min(1e-30)),
    }


def _write(src: Path, out: Path, layout: dict[str, list[str]], quantize: set[str], block: int, scale_dtype) -> dict:
    """Write `layout` ({shard: tensor names}) from `src`, the names in `quantize` as block-FP8 with a
    `<name>_scale_inv`; one output shard in memory at a time. Returns the per-tensor error report."""
    from safetensors.torch import save_file

    reader, mapping, total, report, peak = TensorReader(src), {}, 0, {}, 0
    for shard, names in layout.items():
        tensors = {}
        for name in names:
            t = reader.get(name)
            if name in quantize:
                q, s = quantize_block_fp8(t, block)
                report[name] = _measure(t, q, s, block)
                tensors[name], tensors[name + "_scale_inv"] = q, s.to(scale_dtype)
                peak = max(peak, 4 * t.numel() * 4)  # float32 copy, padded blocks, quotient, error
            else:
                tensors[name] = t
        save_file(tensors, out / shard, metadata={"format": "pt"})
        mapping.update({n: shard for n in tensors})
        total += nbytes(tensors)
        peak = max(peak, nbytes(tensors))
    write_index(out, mapping, total)
    return {"per_tensor": report, "peak_bytes_bound": peak, "shards": len(layout)}


def _summary(block: int, written: dict, copied: int, **extra) -> dict:
    report = written["per_tensor"]
    return {
        "block": block,
        "tensors": len(report),
        "copied": copied,
        "max_error_over_bound": max((r["max_error_over_bound"] for r in report.values()), default=0.0),
        "max_relative_frobenius_error": max((r["relative_frobenius_error"] for r in report.values()), default=0.0),
        "peak_bytes_bound": written["peak_bytes_bound"],
        "shards": written["shards"],
        **extra,
        "per_tensor": report,
    }


def export_fp8(
    model_dir: Path, out_dir: Path, block: int = BLOCK, rule=quantizable, scale_dtype=None, report: bool = True
) -> dict:
    """Block-FP8 copy of a safetensors model dir, quantizing the tensors `rule(name, shape)` picks
    (default: the name rule, float32 scales), shard by shard as the source is laid out; the config's
    `quantization_config` lists the 2-D weights left unconverted. Returns the measured error report
    (written beside the weights with `report`). A model with an official FP8 checkpoint is exported
    by `export_like` instead."""
    import torch

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = TensorReader(model_dir)
    meta = reader.meta()
    quantize = {n for n, (_, shape) in meta.items() if rule(n, shape)}
    written = _write(model_dir, out_dir, by_shard(reader.map), quantize, block, scale_dtype or torch.float32)
    copy_side_files(model_dir, out_dir)
    kept = sorted(
        n[: -len(".weight")]
        for n, (_, shape) in meta.items()
        if n not in quantize and len(shape) == 2 and n.endswith(".weight") and "norm" not in n and "embed" not in n
    )
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
        "modules_to_not_convert": kept,
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    summary = _summary(block, written, len(meta) - len(quantize), reference=None)
    if report:
        (out_dir / "fp8_report.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def export_like(model_dir: Path, reference_dir: Path, out_dir: Path, reference: str | None = None) -> dict:
    """Block-FP8 copy of a model in the layout of an official FP8 checkpoint, as the paper's code
    makes it: a tensor is quantized iff the reference stores it with a `_scale_inv`; scales take the
    reference's dtype, shards its file layout, config (with its `quantization_config`) and tokenizer
    files are the reference's, so the server loads the student as it loads the official model. The
    model's own chat template is kept (a run's template override holds for every generation).
    Refuses, naming them, tensors one side has and the other lacks, or whose shapes differ. The report
    names the reference as `reference` gives it (the spec's location), else by its directory."""
    model_dir, reference_dir, out_dir = Path(model_dir), Path(reference_dir), Path(out_dir)
    ref_reader = TensorReader(reference_dir)
    ref = ref_reader.meta()
    src = TensorReader(model_dir).meta()
    scaled = {n[: -len("_scale_inv")] for n in ref if n.endswith("_scale_inv")}
    weights = {n for n in ref if not n.endswith("_scale_inv")}
    problems = [
        f"only in the model: {sorted(set(src) - weights)[:5]}" if set(src) - weights else "",
        f"only in the reference: {sorted(weights - set(src))[:5]}" if weights - set(src) else "",
    ]
    problems += [
        f"{n}: shape {src[n][1]} in the model, {ref[n][1]} in the reference"
        for n in sorted(weights & set(src))
        if src[n][1] != ref[n][1]
    ][:5]
    problems = [p for p in problems if p]
    if problems:
        raise Fp8ExportError(f"{model_dir} does not match the FP8 reference {reference_dir}: " + "; ".join(problems))
    qc = json.loads((reference_dir / "config.json").read_text()).get("quantization_config") or {}
    block = int((qc.get("weight_block_size") or [BLOCK])[0])
    scale_dtypes = {ref[n + "_scale_inv"][0] for n in scaled}
    import torch

    scale_dtype = {"BF16": torch.bfloat16, "F16": torch.float16}.get(next(iter(scale_dtypes), "F32"), torch.float32)
    layout = {
        shard: [n for n in names if not n.endswith("_scale_inv")] for shard, names in by_shard(ref_reader.map).items()
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    written = _write(model_dir, out_dir, layout, scaled, block, scale_dtype)
    copy_side_files(reference_dir, out_dir)
    if (model_dir / "chat_template.jinja").is_file():
        shutil.copy2(model_dir / "chat_template.jinja", out_dir / "chat_template.jinja")
    summary = _summary(
        block,
        written,
        len(weights) - len(scaled),
        reference=reference or str(reference_dir),
        scale_dtype=str(scale_dtype).removeprefix("torch."),
    )
    (out_dir / "fp8_report.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def load_dequantized(fp8_dir: Path) -> dict:
    """State dict of an FP8 export with every quantised weight dequantised to float32."""
    reader = TensorReader(Path(fp8_dir))
    tensors = {n: reader.get(n) for n in reader.map}
    block = json.loads((Path(fp8_dir) / "config.json").read_text())["quantization_config"]["weight_block_size"][0]
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        out[name] = (
            dequantize_block_fp8(t, tensors[name + "_scale_inv"], block) if name + "_scale_inv" in tensors else t
        )
    return out
