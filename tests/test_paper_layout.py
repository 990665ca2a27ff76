"""The paper's model as a cluster serves it, in small: the tiny paper-layout checkpoint's shape, its
tool calls read by vLLM's own parser classes, the merge keeping every tensor, and the FP8 export
taking the official checkpoint's layout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from mass_jobs.serving.fp8 import Fp8ExportError, export_fp8, export_like, load_dequantized
from mass_jobs.serving.shards import TensorReader, weight_map
from mass_jobs.serving.tool_parsers import READS
from mass_jobs.steps.merge import merge_lora
from mass_jobs.steps.sft_tokens import _render_text

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    }
]
CALL = {"command": "ls -la results/ && cat results/summary.json", "timeout": 30}
THOUGHT = "The results folder should hold the summary; list it first."


def model_output(tokenizer) -> str:
    """What the model writes for one tool call, by its own template: the rendering of the reply less
    the generation prompt before it and the end of turn after it. The call's arguments come as the
    OpenAI JSON string a harness sends back."""
    head = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Summarise the results."}]
    reply = {
        "role": "assistant",
        "content": "",
        "reasoning_content": THOUGHT,
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "run_shell", "arguments": json.dumps(CALL)}}
        ],
    }
    prompt = _render_text(tokenizer, head, TOOLS, generation_prompt=True)
    full = _render_text(tokenizer, [*head, reply], TOOLS)
    assert full.startswith(prompt)
    return full[len(prompt) :].removesuffix("\n").removesuffix("<|im_end|>")


def test_the_checkpoint_has_the_published_layout(paper_layout_dirs):
    model_dir, _ = paper_layout_dirs
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and config["model_type"] == "qwen3_5"
    text = config["text_config"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert text["mtp_num_hidden_layers"] == 1 and set(config["vision_config"]) >= {"depth", "out_hidden_size"}
    meta = TensorReader(model_dir).meta()
    assert {d for d, _ in meta.values()} == {"BF16"}
    assert len(set(weight_map(model_dir).values())) == 3
    prefixes = {n.split(".layers.")[0].split(".blocks.")[0] for n in meta if ".layers." in n or ".blocks." in n}
    assert prefixes == {"model.language_model", "model.visual", "mtp"}
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_hidden.weight", "lm_head.weight"} <= set(meta)
    assert meta["mtp.fc.weight"][1] == (128, 256)
    assert meta["model.language_model.layers.0.linear_attn.in_proj_a.weight"][1] == (4, 128)


def test_the_template_writes_xml_calls_after_an_open_think(paper_layout_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(paper_layout_dirs[0])
    out = model_output(tokenizer)
    assert out == (
        f"{THOUGHT}\n</think>\n\n<tool_call>\n<function=run_shell>\n<parameter=command>\n"
        f"{CALL['command']}\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
    )
    off = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def vllm_parsed(paper_layout_dirs, tiny_model_dir, vllm_python):
    """vLLM's parsers over the paper-layout model's call (XML) and the tiny Qwen3 model's (JSON)."""
    from transformers import AutoTokenizer

    outputs = {
        "xml": model_output(AutoTokenizer.from_pretrained(paper_layout_dirs[0])),
        "json": model_output(AutoTokenizer.from_pretrained(tiny_model_dir)),
    }
    job = {
        "tokenizer": str(paper_layout_dirs[0]),
        "tools": TOOLS,
        "outputs": outputs,
        "tool_parsers": sorted(READS),
        "reasoning_parser": "qwen3",
    }
    done = subprocess.run(
        [str(vllm_python), str(ROOT / "tests" / "vllm_side" / "parse.py")],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_paper_specs_parsers_read_the_paper_models_calls(vllm_parsed):
    """paper.yaml's parsers, as vLLM itself runs them, turn the model's own call into a tool call."""
    parsers = yaml.safe_load((ROOT / "examples" / "paper.yaml").read_text())["execution"]["vllm"]
    assert parsers == {"tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3"}
    assert vllm_parsed["reasoning"]["xml"]["reasoning"].strip() == THOUGHT
    assert vllm_parsed["tools"][parsers["tool_call_parser"]]["xml"]["calls"] == [["run_shell", CALL]]


def test_hermes_leaves_the_paper_models_call_in_the_text(vllm_parsed):
    """The parser the chart used to pass: no tool call, the call stays content (a one-turn episode)."""
    got = vllm_parsed["tools"]["hermes"]["xml"]
    assert got["calls"] == [] and "<function=run_shell>" in got["content"]


@pytest.mark.parametrize("fmt", ["xml", "json"])
def test_the_validators_parser_table_is_what_vllm_reads(vllm_parsed, fmt):
    """`mass validate` refuses a parser by the project's table (READS); vLLM's classes must agree."""
    for parser, reads in READS.items():
        calls = vllm_parsed["tools"][parser][fmt]["calls"]
        assert (calls == [["run_shell", CALL]]) is (reads == fmt), (parser, fmt, calls)


def _adapter(parent: Path, out: Path) -> Path:
    """A LoRA adapter trained as the trainer loads the model (the causal LM, text-only names), with
    random B so the merge has something to add."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(parent, dtype=torch.float32)
    peft = get_peft_model(
        model,
        LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "in_proj_qkv", "down_proj"]),
    )
    peft.save_pretrained(out)
    return out


def test_the_merge_keeps_every_tensor_of_the_parent(paper_layout_dirs, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    parent, _ = paper_layout_dirs
    adapter = _adapter(parent, tmp_path / "adapter")
    merged_layers = merge_lora(parent, adapter, tmp_path / "merged")
    assert len(merged_layers) == 1 + 3 + 4  # q_proj in the full-attention layer, in_proj_qkv in 3, down_proj in 4
    before, after = TensorReader(parent), TensorReader(tmp_path / "merged")
    assert after.meta() == before.meta()  # every name, dtype and shape, MTP and vision tower included
    assert weight_map(tmp_path / "merged") == weight_map(parent)
    lora = load_file(adapter / "adapter_model.safetensors")
    changed = []
    for name in before.map:
        if not torch.equal(before.get(name), after.get(name)):
            changed.append(name)
    assert len(changed) == len(merged_layers) and all(n.startswith("model.language_model.layers.") for n in changed)
    key = "model.language_model.layers.3.self_attn.q_proj.weight"
    a = lora["base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"].float()
    b = lora["base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"].float()
    assert torch.equal(after.get(key), (before.get(key).float() + 2.0 * (b @ a)).to(torch.bfloat16))
    assert sorted(p.name for p in (tmp_path / "merged").iterdir() if not p.name.endswith(".safetensors")) == sorted(
        p.name for p in parent.iterdir() if not p.name.endswith(".safetensors")
    )
    # the merged model computes what the adapter on its parent computes (as loaded for training)
    from peft import PeftModel

    ids = torch.tensor([[5, 17, 301, 42, 7, 9]])
    with torch.no_grad():
        ref = (
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(parent, dtype=torch.float32), adapter)
            .merge_and_unload()(ids)
            .logits
        )
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(parent, dtype=torch.float32)(ids).logits
    err, moved = (got - ref).abs().max().item(), (base - ref).abs().max().item()
    assert err < moved / 20, (err, moved)


def test_the_fp8_export_takes_the_reference_layout(paper_layout_dirs, tmp_path):
    parent, reference = paper_layout_dirs
    report = export_like(parent, reference, tmp_path / "fp8")
    ref_meta, out_meta = TensorReader(reference).meta(), TensorReader(tmp_path / "fp8").meta()
    assert out_meta == ref_meta  # key by key: dtype and shape
    assert weight_map(tmp_path / "fp8") == weight_map(reference)
    scaled = [n for n in ref_meta if n.endswith("weight_scale_inv")]
    assert report["tensors"] == len(scaled) == 32 and report["copied"] == len(ref_meta) - 2 * len(scaled)
    assert {ref_meta[n][0] for n in scaled} == {"BF16"}
    assert out_meta["model.language_model.layers.0.linear_attn.in_proj_a.weight"][0] == "BF16"
    assert out_meta["mtp.layers.0.self_attn.q_proj.weight"][0] == "F8_E4M3"
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"] == json.loads((reference / "config.json").read_text())["quantization_config"]
    assert report["max_error_over_bound"] <= 1.0
    deq = load_dequantized(tmp_path / "fp8")
    w = TensorReader(parent).get("model.language_model.layers.1.mlp.up_proj.weight").float()
    assert (deq["model.language_model.layers.1.mlp.up_proj.weight"] - w).norm() / w.norm() < 0.05


def test_the_name_rule_misses_the_official_layout(paper_layout_dirs, tmp_path):
    """Without a reference, the name rule leaves the delta-net's in_proj_qkv/in_proj_z in bf16 and writes
    float32 scales: a layout the official checkpoint's loader does not expect."""
    parent, reference = paper_layout_dirs
    export_fp8(parent, tmp_path / "by-name")
    meta = TensorReader(tmp_path / "by-name").meta()
    ref = TensorReader(reference).meta()
    qkv = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    assert (meta[qkv][0], ref[qkv][0]) == ("BF16", "F8_E4M3")
    scale = "model.language_model.layers.3.self_attn.q_proj.weight_scale_inv"
    assert (meta[scale][0], ref[scale][0]) == ("F32", "BF16")


def test_a_model_that_is_not_the_references_is_refused_by_name(paper_layout_dirs, hybrid_dir, tmp_path):
    with pytest.raises(Fp8ExportError, match=r"only in the model: \['model\.embed_tokens\.weight'"):
        export_like(hybrid_dir, paper_layout_dirs[1], tmp_path / "fp8")
    assert not (tmp_path / "fp8").exists()  # refused before anything is written


@pytest.mark.parametrize("export, status", [(True, 0), (False, 2)])
def test_a_reference_goes_with_an_export(tmp_path, capsys, export, status):
    import shutil

    from mass_jobs.commands.cli import main

    doc = yaml.safe_load((ROOT / "examples" / "paper.yaml").read_text())
    assert doc["sft"]["fp8_reference"] == "Qwen/Qwen3.6-27B-FP8"
    doc["sft"]["fp8_export"] = export
    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks")
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(doc))
    assert main(["validate", str(tmp_path / "paper.yaml")]) == status
    err = capsys.readouterr().err
    assert (
        export
        or "$.sft.fp8_reference: expected sft.fp8_export: true to use a reference, found "
        "'Qwen/Qwen3.6-27B-FP8' with no FP8 export"
        in err
    ), err
