"""Block-FP8 weights: 128x128 blocks, float8 e4m3, one float32 scale per block.

The layout serving stacks read (DeepSeek-V3 / transformers "fp8" with `weight_block_size`):
`<name>` holds float8_e4m3fn values and `<name>_scale_inv` the per-block scale, so
dequantised = fp8 * scale_inv, block by block. e4m3 keeps 3 mantissa bits, so rounding is
within 2^-4 of a value for normal numbers and within 2^-10 of the block scale for subnormals;
`error_bound` states exactly that and the export measures against it.

Used by `mass merge` when `sft.fp8_export` is set.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def quantizable(name: str, tensor) -> bool:
    """Linear weights of the decoder blocks; embeddings, norms and the LM head stay in full precision."""
    return tensor.dim() == 2 and ".layers." in name and name.endswith("_proj.weight")


def export_fp8(model_dir: Path, out_dir: Path, block: int = BLOCK) -> dict:
    """Write a block-FP8 copy of a safetensors model dir; returns the measured error report."""
    from safetensors.torch import load_file, save_file

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    out, report = {}, {}
    for name, t in tensors.items():
        if not quantizable(name, t):
            out[name] = t
            continue
        q, s = quantize_block_fp8(t, block)
        err = (dequantize_block_fp8(q, s, block) - t.float()).abs()
        bound = error_bound(t, s, block)
        out[name], out[name + "_scale_inv"] = q, s
        report[name] = {
            "max_abs_error": float(err.max()),
            "max_error_over_bound": float((err / bound).max()),
            "relative_frobenius_error": float(err.norm() / t.float().norm().clamp_min(1e-30)),
        }
    save_file(out, out_dir / "model.safetensors")
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out_dir / f.name)
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [block, block]}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    summary = {
        "block": block, "tensors": len(report),
        "max_error_over_bound": max((r["max_error_over_bound"] for r in report.values()), default=0.0),
        "max_relative_frobenius_error": max((r["relative_frobenius_error"] for r in report.values()), default=0.0),
        "per_tensor": report,
    }
    (out_dir / "fp8_report.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def load_dequantized(fp8_dir: Path) -> dict:
    """State dict of an FP8 export with every quantised weight dequantised to float32."""
    from safetensors.torch import load_file

    tensors = load_file(Path(fp8_dir) / "model.safetensors")
    block = json.loads((Path(fp8_dir) / "config.json").read_text())["quantization_config"]["weight_block_size"][0]
    out = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        out[name] = dequantize_block_fp8(t, tensors[name + "_scale_inv"], block) if name + "_scale_inv" in tensors else t
    return out
