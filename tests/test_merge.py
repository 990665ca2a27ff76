"""Select, merge and block-FP8 export: chosen step, merged logits = adapter logits, FP8 error bound."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mass_jobs.config.run_spec import LoraSpec
from mass_jobs.serving.fp8 import dequantize_block_fp8, error_bound, export_fp8, load_dequantized, quantize_block_fp8
from mass_jobs.steps.merge import MergeError, merge_lora
from mass_jobs.steps.select import SelectError, select_checkpoint


def log(vals: dict[int, float]) -> list[dict]:
    out = []
    for s in range(0, max(vals) + 1):
        if s:
            out.append({"kind": "train", "step": s, "processed_tokens": 100 * s})
        if s in vals:
            out.append({"kind": "val", "step": s, "val_loss": vals[s]})
    return out


@pytest.mark.parametrize(
    "vals,saved,step",
    [
        ({0: 1.0, 2: 3.0, 4: 2.0, 6: 2.5}, [2, 4, 6], 4),
        ({0: 0.1, 2: 2.0, 4: 2.0}, [2, 4], 2),  # tie -> earlier; step 0 never chosen
        ({2: float("nan"), 4: 5.0, 6: float("inf"), 8: 1.0}, [2, 4, 6], 4),  # non-finite skipped; 8 was not saved
    ],
    ids=["lowest", "tie-earlier", "non-finite"],
)
def test_select(vals, saved, step):
    chosen = select_checkpoint(log(vals), saved)
    assert chosen["step"] == step
    assert chosen["processed_supervised_tokens"] == 100 * step
    assert chosen["processed_supervised_tokens_total"] == 100 * max(vals)


def test_select_without_finite_loss():
    with pytest.raises(SelectError, match="finite validation loss"):
        select_checkpoint(log({2: float("nan")}), [2])


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA with random (non-zero) A and B, saved in peft's format."""
    from transformers import AutoModelForCausalLM

    from mass_jobs.training.lora import attach_lora

    torch.manual_seed(0)
    model = attach_lora(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraSpec(r=4, alpha=16, dropout=0.0, target_modules=["q_proj", "o_proj", "up_proj", "lm_head"]),
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.05)
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(out)
    return out


def test_merged_logits_equal_adapter_logits(tiny_model_dir, adapter, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    layers = merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    assert len(layers) == 3 * 2 + 1 and set(layers.values()) == {4.0}  # alpha / r; a tied LM head too
    ids = torch.randint(10, 5000, (2, 48))
    with torch.no_grad():
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter).eval()
        want = peft_model(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        got = merged(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-2  # the adapter really changes the outputs
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), float((got - want).abs().max())
    tok = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert tok.chat_template == AutoTokenizer.from_pretrained(tiny_model_dir).chat_template


def test_merge_rejects_unsupported_adapter(tiny_model_dir, adapter, tmp_path):
    import shutil

    bad = tmp_path / "dora"
    shutil.copytree(adapter, bad)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(MergeError, match="use_dora"):
        merge_lora(tiny_model_dir, bad, tmp_path / "out")


@pytest.mark.parametrize("shape", [(128, 128), (300, 200), (64, 384)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_fp8_block_roundtrip_within_bound(shape):
    torch.manual_seed(1)
    w = torch.randn(shape) * torch.logspace(-4, 0, shape[1])  # wide dynamic range: subnormals get exercised
    q, s = quantize_block_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert s.shape == (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))
    err = (dequantize_block_fp8(q, s) - w).abs()
    assert bool((err <= error_bound(w, s)).all())
    assert float(err.norm() / w.norm()) < 0.04


def test_fp8_export_of_merged_model(tiny_model_dir, adapter, tmp_path):
    from transformers import AutoModelForCausalLM

    merge_lora(tiny_model_dir, adapter, tmp_path / "merged")
    report = export_fp8(tmp_path / "merged", tmp_path / "fp8")
    assert report["tensors"] == 2 * 7 and report["max_error_over_bound"] <= 1.0
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.randint(10, 5000, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        model.load_state_dict(load_dequantized(tmp_path / "fp8"), strict=False)
        got = model(input_ids=ids).logits
    # random weights make every layer's rounding count (measured: ~5% of the logits' norm)
    assert float((got - want).norm() / want.norm()) < 0.1


@pytest.mark.slow(cost=10)  # a merge, then a model server on its output: the slow tier
def test_run_merge_stores_plain_model_objects_that_serve(tiny_model_dir, adapter, tmp_path, s3_env):
    """L_1 lands as plain objects under <run>/gen-1/model/ on S3 (what KServe's storage initializer
    downloads), at the URI `mass validate --outputs` hands Argo, and that URI serves."""
    import uuid
    from pathlib import Path

    import yaml

    from mass_jobs.pipeline.table import argo_outputs
    from mass_jobs.run.context import RunContext
    from mass_jobs.serving.llm import ModelClient
    from mass_jobs.serving.model_dirs import resolve_model
    from mass_jobs.serving.serve import ModelServer
    from mass_jobs.spec.load import validate_document
    from mass_jobs.steps.merge import run_merge
    from mass_jobs.store import open_store, read_manifest

    doc = yaml.safe_load((Path(__file__).parent / "specs" / "ci-e2e.yaml").read_text())
    doc["model"]["base"] = str(tiny_model_dir)
    prefix = f"merge-{uuid.uuid4().hex[:8]}"
    opts = {"endpoint_url": s3_env["endpoint_url"], "region": s3_env["region"]}
    doc["store"] = {"uri": f"s3://{s3_env['bucket']}/{prefix}", **opts}
    ctx = RunContext(validate_document(doc), None)
    ctx = RunContext(ctx.spec, open_store(ctx.spec.store))
    ckpt = f"{ctx.train(0)}/step-2"
    ctx.store.put_dir(ckpt, adapter)
    ctx.store.put_json(ctx.select(0), {"step": 2, "checkpoint": ckpt})

    extra = run_merge(ctx, 0, tmp_path / "work")
    assert extra["step"] == 2 and extra["merged_layers"] == 3 * 2 + 1  # q, o, up in 2 layers + the LM head
    keys = ctx.store.list(ctx.model(1) + "/")
    names = {k.removeprefix(ctx.model(1) + "/") for k in keys}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    assert not ctx.store.exists(ctx.model(1))  # no single archive: KServe could not serve one
    assert set(read_manifest(ctx.store, f"{ctx.gen(0)}/merge")["outputs"]) == set(keys)

    uri = argo_outputs(ctx.spec, 1)["model-uri"]
    assert uri == f"s3://{s3_env['bucket']}/{prefix}/ci-e2e/gen-1/model/"  # the slash: never model-fp8/ too
    local = resolve_model(uri, cache_dir=tmp_path / "cache", store_options=opts)
    assert {p.name for p in local.iterdir()} - {".mass-complete"} == names
    direct = tmp_path / "direct"
    merge_lora(tiny_model_dir, adapter, direct)
    assert (local / "model.safetensors").read_bytes() == (direct / "model.safetensors").read_bytes()
    with ModelServer(local, served_name="gen-1") as srv:
        reply = ModelClient(srv.endpoint, ctx.spec.model.sampling, timeout_s=60, retries=0).chat(
            [{"role": "user", "content": "hi"}], seed=1, max_tokens=4
        )
    assert reply["role"] == "assistant" and reply["usage"]["completion_tokens"] == 4
