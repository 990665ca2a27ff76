"""A tiny model in the paper's checkpoint layout (Qwen3.6-27B as published), and its FP8 reference.

What code paths meet on the real checkpoint and not on a plain causal LM: the multimodal wrapper
(`Qwen3_5ForConditionalGeneration`: the text model under `model.language_model.`, a vision tower
under `model.visual.`), multi-token-prediction weights under `mtp.` that transformers does not load,
the nested `config.json` (`text_config`, `vision_config`), bfloat16 weights in several shards with
a `model.safetensors.index.json`, and the family's chat template: tool calls as XML function
blocks and a generation prompt that opens `<think>`. Every size is small and every weight random;
the widths that the real model's FP8 layout cares about are multiples of 128, as there.

`build_fp8_reference` writes the tiny stand-in for the official FP8 checkpoint
(`Qwen/Qwen3.6-27B-FP8`), made by the same rule: every linear weight of the decoder layers
(language model and MTP) that splits into whole 128x128 blocks is float8_e4m3fn with a bfloat16
`weight_scale_inv`; the gated-delta-net's `in_proj_a`/`in_proj_b` (one row per value head), the
vision tower, embeddings, norms and the head stay bfloat16 and are listed in the config's
`modules_to_not_convert`. The FP8 export (`mass_jobs.serving.fp8.export_like`) takes that
reference as its spec, as the paper's code takes the official one.

Run: `mass model tiny --paper-layout --out DIR [--fp8-reference DIR]`
"""

from __future__ import annotations

import json
from pathlib import Path

from mass_jobs.tiny.build import ARCH, HYBRID_VISION, TEMPLATE_HEAD, TOOL_TURNS, TURNS_OPEN, build_tokenizer

# Qwen3.5/3.6's own special tokens for images and video, beside the tiny tokenizer's.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
BLOCK = 128
# Widths: every projection the official FP8 checkpoint quantizes splits into 128x128 blocks here
# too (q with its output gate 512, k/v 128, the delta-net's qkv 256 and z 128); in_proj_a/b have
# one row per value head (4), as the real model's 48 rows, and stay bfloat16.
PAPER_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "max_position_embeddings": ARCH["max_position_embeddings"],
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
}
# The vision tower: the real one's patch grouping (2 frames, 2x2 merge) at a tiny width.
PAPER_VISION = {**HYBRID_VISION, "spatial_merge_size": 2, "temporal_patch_size": 2}
# The image processor's settings for the tiny vision tower (servers read them to size image inputs).
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": PAPER_VISION["patch_size"],
    "temporal_patch_size": PAPER_VISION["temporal_patch_size"],
    "merge_size": PAPER_VISION["spatial_merge_size"],
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "min_pixels": 64,
    "max_pixels": 4096,
}
# Which tensors go to which shard: the real checkpoint spreads layers over many shards; three are
# enough for every shard-by-shard path to cross a boundary.
SHARDS = 3

# The family's layout: the tool list as JSON signatures in the system turn, calls as XML function
# blocks (string values raw, others as JSON), tool results as user turns of <tool_response>
# blocks, reasoning kept for the turns after the last user query, and a generation prompt that
# opens <think> (closed and empty when thinking is off). {% generation %} marks what the model
# writes, for assistant-token masks.
PAPER_TEMPLATE = (
    TEMPLATE_HEAD
    + r"""
  {{- '# Tools\n\nThese functions are available:\n\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + ((tool.function if tool.function is defined else tool) | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nTo call a function, answer with exactly this block and nothing after it:\n\n' -}}
  {{- '<tool_call>\n<function=NAME>\n<parameter=ARGUMENT>\nVALUE\n</parameter>\n</function>\n</tool_call>\n\n' -}}
  {{- 'One <parameter> block per argument; a value may span lines.<|im_end|>\n' -}}
""".lstrip("\n")
    + TURNS_OPEN
    + r"""
      {%- if loop.index0 > ns.last_user -%}
        {{- '<think>\n' + ((m.reasoning_content or '') | string).strip('\n') + '\n</think>\n\n' -}}
      {%- endif -%}
      {{- content.strip('\n') -}}
      {%- for tc in (m.tool_calls or []) -%}
        {%- set f = tc.function if tc.function is defined else tc -%}
        {%- if content.strip('\n') or not loop.first -%}{{- '\n\n' -}}{%- endif -%}
        {{- '<tool_call>\n<function=' + f.name + '>\n' -}}
        {%- if f.arguments is mapping -%}
          {%- for k, v in f.arguments.items() -%}
            {{- '<parameter=' + k + '>\n' + (v if v is string else (v | tojson)) + '\n</parameter>\n' -}}
          {%- endfor -%}
        {%- endif -%}
        {{- '</function>\n</tool_call>' -}}
      {%- endfor -%}
      {{- '<|im_end|>' -}}
    {%- endgeneration -%}
    {{- '\n' -}}
""".lstrip("\n")
    + TOOL_TURNS
    + r"""
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}
  {%- else -%}{{- '<think>\n' -}}{%- endif -%}
{%- endif -%}
""".lstrip("\n")
).strip()


def paper_tokenizer():
    """The tiny tokenizer with the family's vision tokens and chat template."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(VISION_TOKENS, special_tokens=True)
    tokenizer.chat_template = PAPER_TEMPLATE
    return tokenizer


def _mtp_tensors(text_config, dtype) -> dict:
    """The multi-token-prediction head as the real checkpoint stores it: one full-attention decoder
    layer under `mtp.layers.0.`, the fc that joins embedding and hidden state, and three norms."""
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    full = text_config.layer_types.index("full_attention")
    out = {}
    for i in range(text_config.mtp_num_hidden_layers):
        layer = Qwen3_5DecoderLayer(text_config, layer_idx=full)
        out.update({f"mtp.layers.{i}.{k}": v for k, v in layer.state_dict().items()})
    h = text_config.hidden_size
    out["mtp.fc.weight"] = torch.randn(h, 2 * h) * 0.02
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        out[f"mtp.{norm}.weight"] = torch.zeros(h)
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def paper_state(seed: int, vocab_size: int, tokens: dict[str, int]):
    """(config, {checkpoint name: tensor}) of the tiny paper-layout model, bfloat16."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = {k: v for k, v in PAPER_TEXT.items()}
    config = Qwen3_5Config(
        text_config={
            **text,
            "vocab_size": vocab_size,
            "tie_word_embeddings": False,
            "dtype": "bfloat16",
            "eos_token_id": tokens["<|im_end|>"],
            "pad_token_id": tokens["<|endoftext|>"],
        },
        vision_config={**PAPER_VISION, "out_hidden_size": PAPER_TEXT["hidden_size"]},
        image_token_id=tokens["<|image_pad|>"],
        video_token_id=tokens["<|video_pad|>"],
        vision_start_token_id=tokens["<|vision_start|>"],
        vision_end_token_id=tokens["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.dtype = "bfloat16"
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3_5ForConditionalGeneration(config)
        state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
        state.update(_mtp_tensors(config.text_config, torch.bfloat16))
    return config, state


def write_shards(out: Path, state: dict, shards: int = SHARDS) -> dict[str, str]:
    """Tensors in name order, cut into `shards` files of about equal count, with the index."""
    from safetensors.torch import save_file

    from mass_jobs.serving.shards import nbytes, write_index

    names = sorted(state)
    per = -(-len(names) // shards)
    mapping = {}
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n] for n in part}, out / shard, metadata={"format": "pt"})
        mapping.update({n: shard for n in part})
    write_index(out, mapping, nbytes(state))
    return mapping


def build_paper_layout_model(out_dir, seed: int = 0) -> Path:
    """Write the tiny paper-layout checkpoint (config, three bf16 shards + index, tokenizer, template)."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = paper_tokenizer()
    tokens = {t: tokenizer.convert_tokens_to_ids(t) for t in ["<|im_end|>", "<|endoftext|>", *VISION_TOKENS]}
    config, state = paper_state(seed, len(tokenizer), tokens)
    config.save_pretrained(out)
    write_shards(out, state)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    GenerationConfig(
        eos_token_id=[tokens["<|im_end|>"], tokens["<|endoftext|>"]],
        pad_token_id=tokens["<|endoftext|>"],
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def official_fp8_rule(name: str, shape: tuple[int, ...]) -> bool:
    """Whether the official FP8 checkpoint stores this tensor in float8: a linear weight of a decoder
    layer (language model or MTP) made of whole 128x128 blocks."""
    return (
        len(shape) == 2
        and name.endswith(".weight")
        and ".layers." in name
        and ".visual." not in name
        and shape[0] % BLOCK == 0
        and shape[1] % BLOCK == 0
    )


def build_fp8_reference(src_dir, out_dir) -> Path:
    """The tiny stand-in for the official FP8 checkpoint, built from a bf16 paper-layout checkpoint by
    the official rule: same shards, float8 weights with bfloat16 `weight_scale_inv`, the config's
    `quantization_config` with the linear modules left unconverted."""
    import torch

    from mass_jobs.serving.fp8 import export_fp8

    export_fp8(src_dir, out_dir, BLOCK, rule=official_fp8_rule, scale_dtype=torch.bfloat16, report=False)
    return Path(out_dir)
