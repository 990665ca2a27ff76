"""Which weights serve a generation: the block-FP8 export where the server reads it, else BF16, with why.

The paper serves every generation after L0 from its block-FP8 export, so the next cycle's episodes
come from the FP8 weights. Here a generation g >= 1 is served from `gen-<g>/model-fp8/` when
  - `sft.fp8_export` wrote that copy and `sft.serve_fp8` is on, and
  - the server is vLLM on a CUDA GPU: the cluster's KServe runtime with `execution.resources.server.gpu`
    >= 1, or a local `execution.serving: vllm` whose first CUDA device has compute capability >= 7.5
    (vLLM runs FP8 weights as W8A8 from 8.9 and weight-only W8A16 through its Marlin kernels from 7.5);
and from the BF16 `gen-<g>/model/` otherwise, the reason recorded: transformers' embedded server,
vLLM's CPU backend and an older GPU have no block-FP8 path. Generation 0 is `model.base` as given,
or with `model.serve` (the official FP8 checkpoint) served from that where vLLM on a GPU serves, as
the paper serves L0.
`mass validate` prints the decision for the spec (`summary`); a local run records what it served in
`gen-<g>/serving.json` (the report's and an operator's answer to "which weights made this data").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MIN_CAPABILITY = (7, 5)  # FP8 weight-only (Marlin); W8A8 from W8A8_CAPABILITY
W8A8_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Choice:
    weights: Literal["base", "serve", "fp8", "bf16", "none"]  # serve: model.serve, generation 0
    reason: str

    def as_dict(self) -> dict:
        return {"weights": self.weights, "reason": self.reason}


def _exported(spec) -> Choice | None:
    if not spec.sft.fp8_export:
        return Choice("bf16", "sft.fp8_export is false: the merge writes no FP8 copy")
    if not spec.sft.serve_fp8:
        return Choice("bf16", "sft.serve_fp8 is false: the FP8 copy is written, not served")
    return None


def on_gpu(capability: tuple[int, int] | None, where: str) -> Choice:
    """vLLM's choice for a CUDA device of `capability` (None: no CUDA device)."""
    if capability is None:
        return Choice("bf16", f"{where} has no CUDA GPU: vLLM's CPU backend has no block-FP8 kernels")
    a, b = capability
    if tuple(capability) < MIN_CAPABILITY:
        return Choice("bf16", f"{where}'s GPU has compute capability {a}.{b}, under the 7.5 vLLM's FP8 kernels need")
    mode = "W8A8" if tuple(capability) >= W8A8_CAPABILITY else "weight-only W8A16 (Marlin)"
    return Choice("fp8", f"vLLM on {where}'s CUDA GPU (compute capability {a}.{b}) serves the block-FP8 export, {mode}")


BASE = Choice("base", "generation 0 is model.base as given")


def for_cluster(spec, gen: int) -> Choice:
    """What KServe's vLLM runtime serves generation `gen` from."""
    if gen == 0:
        if not spec.model.serve:
            return BASE
        if spec.execution.resources.server.gpu < 1:
            return Choice(
                "base",
                "execution.resources.server.gpu is 0: vLLM's CPU backend cannot serve model.serve's "
                "FP8 weights, so generation 0 is model.base",
            )
        return Choice(
            "serve",
            f"KServe's vLLM runtime on a GPU serves generation 0 from model.serve "
            f"({spec.model.serve}), as the paper does",
        )
    fixed = _exported(spec)
    if fixed:
        return fixed
    if spec.execution.resources.server.gpu < 1:
        return Choice("bf16", "execution.resources.server.gpu is 0: vLLM's CPU backend has no block-FP8 kernels")
    return Choice(
        "fp8",
        "KServe's vLLM runtime on a GPU serves the block-FP8 export (W8A8 from compute capability "
        "8.9, weight-only from 7.5)",
    )


def for_local(spec, gen: int, capability: tuple[int, int] | None) -> Choice:
    """What a local run serves generation `gen` from, given the local CUDA device (None: none)."""
    serving = spec.execution.serving
    if serving == "external":
        return Choice("none", "execution.serving is external: the roles' endpoints serve their own models")
    if gen == 0:
        if not spec.model.serve:
            return BASE
        if serving == "embedded":
            return Choice(
                "base",
                "execution.serving is embedded: transformers' server cannot serve model.serve's FP8 "
                "weights, so generation 0 is model.base",
            )
        gpu = on_gpu(capability, "this machine")
        if gpu.weights != "fp8":
            return Choice("base", f"{gpu.reason}, so generation 0 is model.base, not model.serve")
        return Choice("serve", f"{gpu.reason.replace('the block-FP8 export', 'model.serve')} for generation 0")
    fixed = _exported(spec)
    if fixed:
        return fixed
    if serving == "embedded":
        return Choice(
            "bf16",
            "execution.serving is embedded: transformers' server serves the BF16 weights; the "
            "block-FP8 export is served by vLLM on a CUDA GPU",
        )
    return on_gpu(capability, "this machine")


def local_capability() -> tuple[int, int] | None:
    """The compute capability of the first CUDA device torch sees, or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def unquantized(spec) -> str:
    """The merged weights' precision, as served when the FP8 copy is not: the spec's model.dtype
    (auto: the checkpoint's own, BF16 for the models this runs). "bf16" in serving.json names that
    copy whatever its dtype."""
    return {"float32": "FP32", "float16": "FP16"}.get(spec.model.dtype, "BF16")


def summary(spec) -> str:
    """What `mass validate` says about serving: generation 0 when `model.serve` is set, then L1 and later."""
    later = _later(spec)
    if not spec.model.serve:
        return later
    if spec.execution.mode == "argo":
        c = for_cluster(spec, 0)
    elif spec.execution.serving == "vllm":
        c = Choice(
            "maybe",
            "vLLM serves model.serve where this machine's first CUDA GPU has compute capability "
            ">= 7.5, else model.base; gen-0/serving.json records which and why",
        )
    else:
        c = for_local(spec, 0, None)
    where = {"serve": f"model.serve ({spec.model.serve})", "base": "model.base"}.get(
        c.weights, "model.serve or model.base"
    )
    return f"serving: generation 0 from {where}: {c.reason}\n{later}"


def _later(spec) -> str:
    """The line on serving L1 and later, naming the merged weights' real dtype."""
    if spec.generations < 1:
        return "serving: only generation 0 (model.base as given)"
    word = unquantized(spec)

    def said(c: Choice) -> str:
        name = word if c.weights == "bf16" else c.weights.upper()
        return f"serving: generations 1+ from the {name} weights: {c.reason.replace('BF16', word)}"

    if spec.execution.mode == "argo":
        return said(for_cluster(spec, 1))
    fixed = _exported(spec)
    if spec.execution.serving == "vllm" and fixed is None:
        return (
            "serving: generations 1+ from the FP8 weights when this machine's first CUDA GPU has compute "
            f"capability >= 7.5 (vLLM's FP8 kernels), else from the {word} weights; gen-<g>/serving.json records "
            "which and why"
        )
    c = for_local(spec, 1, None)
    return said(c) if c.weights != "none" else f"serving: {c.reason}"
