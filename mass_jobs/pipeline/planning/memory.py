"""Training memory per rank, from the model's config alone (no weights).

The config is instantiated on PyTorch's meta device, so parameter counts, layer widths and the
LoRA targets come from the real module tree (the same code `mass train` loads), not a table.
A rank holds (bytes):

- weights: every parameter in the training dtype (bf16 on GPU, fp32 on CPU); FSDP keeps 1/world of
  them plus one decoder layer gathered at a time.
- adapter, gradients, optimizer: the LoRA A/B matrices in fp32 (peft keeps adapters in fp32), their
  gradients (DDP: plus its reduction buckets, the same size again) and AdamW's two moments.
- activations: what autograd keeps for one window (one window per micro-step; accumulation adds
  nothing). Per token and decoder layer: the two RMSNorms' input and output (4H), the attention
  path (the q-norm's input, the rotated query and the attention output, which the output
  projection reads in place: 3q; the key-norm input and value: 2kv), the SwiGLU MLP (4I), and per
  adapted layer the LoRA dropout's copy of its input plus the mask when dropout > 0, and the
  rank-r intermediate. With gradient checkpointing only each layer's input (H per token) is kept,
  and one layer is recomputed at a time in the backward pass, after the loss's logits are gone:
  the rebuilt layer's tensors plus the gradients its backward creates come to 6q + 5kv on the
  attention path (measured); the peak is the larger of that and the logits.
  Linear-attention layers are counted like attention layers of their own head widths.
- logits: with the chunked loss (`sft.loss_chunk`) one chunk's fp32 logits, turned into their
  gradient in place (training/loss.py), on GPU plus a bf16 copy (the head's output, then the
  gradient's cast); the hidden states' gradient (window x H) is kept for the backward pass. With
  whole-window logits (no chunk, or an adapted head) the loss holds the logits, their log-softmax
  and its gradient: three fp32 copies of window x vocabulary, on GPU plus the bf16 head output.

The tests hold this against the measured peak of a real training step of the tiny model on CPU.

    mass plan SPEC [--config CONFIG] [--gpu-memory GIB] [--set sft.parallel=ddp|fsdp]
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.training.lora import resolve_targets

GIB = 2**30
CUDA_RUNTIME = 1 * GIB  # CUDA context, cuBLAS/NCCL workspaces: a fixed allowance per GPU


# Configs shipped beside the examples for hub ids a spec may name (no hub access to read theirs):
# the paper's Qwen3.6-27B has the Qwen3.5-27B text layout.
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SHIPPED_CONFIGS = {
    "Qwen/Qwen3.6-27B": "qwen3.5-27b-config.json",
    "Qwen/Qwen3.6-27B-FP8": "qwen3.5-27b-config.json",
    "Qwen/Qwen3.5-27B": "qwen3.5-27b-config.json",
}


def shipped_config(base: str) -> Path | None:
    """The shipped config for hub id `base`, where this checkout has it; None otherwise."""
    name = SHIPPED_CONFIGS.get(base)
    return EXAMPLES / name if name and (EXAMPLES / name).is_file() else None


def config_source(spec: RunSpec, config: str | None = None) -> Path:
    """Where the model's config is read: `config`, the spec's local base model, or the config shipped
    for its hub id; ValueError naming the flag and a value to give it otherwise."""
    where = Path(config) if config else Path(spec.model.base)
    if where.is_dir():
        where = where / "config.json"
    if where.is_file():
        return where
    if config is None and (shipped := shipped_config(spec.model.base)) is not None:
        return shipped
    known = ", ".join(sorted(SHIPPED_CONFIGS))
    raise ValueError(
        f"model.base {spec.model.base!r} is no local model dir with a config.json: pass --config PATH "
        f"with the model's config.json (a model dir works too); configs ship for {known} "
        f"(--config examples/qwen3.5-27b-config.json from a checkout)"
    )


def load_config(spec: RunSpec, config: str | None = None):
    """The model's config: `config` (a config.json or a model dir), else the spec's local base model,
    else the config shipped for its hub id (`config_source`)."""
    from transformers import AutoConfig

    where = config_source(spec, config)
    doc = json.loads(where.read_text())
    if "model_type" not in doc:
        raise ValueError(f"{where}: a model config needs a model_type")
    return AutoConfig.for_model(doc.pop("model_type"), **doc)


def meta_model(config):
    """The model's module tree without storage (no weights are read or allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def lora_targets(model, lora) -> list[str]:
    """Full names of the adapted modules, resolved by the trainer's own rule."""
    import torch.nn as nn

    targets = resolve_targets(model, lora)
    names = list(targets.modules)
    if not targets.from_spec:
        return names

    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in names)
    ]


@dataclass
class Memory:
    device: str
    parallel: str
    world: int
    window: int
    loss_chunk: int | None
    gradient_checkpointing: bool
    parameters: int
    lora_parameters: int
    target_kinds: list[str]
    adapted_modules: int
    weights: float
    adapter: float
    gradients: float
    optimizer: float
    activations: float
    recompute: float
    logits: float
    runtime: float

    @property
    def total(self) -> float:
        # the loss's logits live while the backward starts; a checkpointed layer is rebuilt later
        return (
            self.weights
            + self.adapter
            + self.gradients
            + self.optimizer
            + self.activations
            + max(self.logits, self.recompute)
            + self.runtime
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def _layer_widths(text, layer_type: str) -> tuple[int, int]:
    """(query-like width q, key/value-like width kv) of one layer's token mixer."""
    if layer_type == "linear_attention":
        return (
            text.linear_num_value_heads * text.linear_value_head_dim,
            text.linear_num_key_heads * text.linear_key_head_dim,
        )
    hd = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return text.num_attention_heads * hd, text.num_key_value_heads * hd


def training_memory(
    spec: RunSpec,
    config,
    *,
    parallel: str = "ddp",
    window: int | None = None,
    loss_chunk="spec",
    device: str | None = None,
) -> Memory:
    """Peak bytes on one rank for one training window of `spec` (see the module docstring)."""

    sft = spec.sft
    device = device or ("cuda" if sft.gpus_per_replica > 0 else "cpu")
    world = sft.replicas * max(sft.gpus_per_replica, 1)
    T = window or sft.window
    model = meta_model(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    H, V, L = text.hidden_size, text.vocab_size, text.num_hidden_layers
    I = text.intermediate_size  # noqa: E741 (the dimensions' usual letters)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * L
    wbytes = 2 if device == "cuda" else 4
    abytes = 2 if device == "cuda" else 4
    params = sum(p.numel() for p in model.parameters())
    targets = lora_targets(model, sft.lora)
    modules = dict(model.named_modules())
    r = sft.lora.r
    lora_params = sum(r * (modules[n].in_features + modules[n].out_features) for n in targets)
    shard = world if parallel == "fsdp" else 1

    # per layer: the adapted modules' LoRA activations (dropout copy + 1-byte mask, rank-r output)
    lora_act = [0.0] * L
    for n in targets:
        parts = n.split(".")
        idx = next(
            (int(parts[i + 1]) for i, p in enumerate(parts[:-1]) if p == "layers" and parts[i + 1].isdigit()), None
        )
        if idx is None or idx >= L:
            continue
        m = modules[n]
        copy = m.in_features * (abytes + 1) if sft.lora.dropout > 0 else 0
        lora_act[idx] += copy + r * abytes
    layer_saved, layer_rebuilt = [], []
    for i in range(L):
        q, kv = _layer_widths(text, layer_types[i])
        layer_saved.append((4 * H + 3 * q + 2 * kv + 4 * I) * abytes + lora_act[i])
        layer_rebuilt.append((4 * H + 6 * q + 5 * kv + 4 * I) * abytes + lora_act[i])
    if sft.gradient_checkpointing:
        saved, recompute = L * H * abytes, max(layer_rebuilt)  # layer inputs; one layer rebuilt in backward
    else:
        saved, recompute = sum(layer_saved), 0
    saved += 2 * H * abytes  # final norm
    chunk = sft.loss_chunk if loss_chunk == "spec" else loss_chunk  # None: whole-window logits
    adapts_head = any(n.endswith("lm_head") for n in targets)
    chunked = chunk is not None and not adapts_head
    positions = min(chunk, T) if chunked else T
    logits = float(positions * V * ((4 if chunked else 12) + (2 if device == "cuda" else 0)))
    hidden_out = 2 * T * H * abytes if chunked else 0  # last hidden states and their gradient
    layer_params = max(sum(p.numel() for p in lay.parameters()) for lay in model.get_decoder().layers)
    weights = params * wbytes / shard + (layer_params * wbytes if shard > 1 else 0)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in targets})
    return Memory(
        device=device,
        parallel=parallel,
        world=world,
        window=T,
        loss_chunk=chunk if chunked else None,
        gradient_checkpointing=sft.gradient_checkpointing,
        parameters=params,
        lora_parameters=lora_params,
        target_kinds=kinds,
        adapted_modules=len(targets),
        weights=weights,
        adapter=4 * lora_params / shard,
        gradients=4 * lora_params / shard * (1 if parallel == "fsdp" else 2 if world > 1 else 1),
        optimizer=8 * lora_params / shard,
        activations=T * saved + hidden_out,
        recompute=float(T * recompute),
        logits=logits,
        runtime=CUDA_RUNTIME if device == "cuda" else 0.0,
    )


def fits(mem: Memory, gpu_gib: float) -> bool:
    return mem.device != "cuda" or mem.total <= gpu_gib * GIB


def refusal(mem: Memory, gpu_gib: float) -> str:
    parts = ", ".join(
        f"{k} {getattr(mem, k) / GIB:.1f}"
        for k in ("weights", "adapter", "gradients", "optimizer", "activations", "recompute", "logits", "runtime")
    )
    return (
        f"training will not fit: {mem.total / GIB:.1f} GiB per GPU ({parts} GiB; window {mem.window}, "
        f"{mem.parallel} over {mem.world} ranks) > the declared {gpu_gib:g} GiB GPU"
    )
