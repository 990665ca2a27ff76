"""Which weights serve L1+: the block-FP8 export where vLLM on a GPU reads it, BF16 with the reason
elsewhere, on both executors; `mass validate` says which; a local run records what it served."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mass_jobs.run.generation_model import model_uri
from mass_jobs.serving import precision as sp
from tests.fixtures.inner_loop import spec_document

ROOT = Path(__file__).resolve().parents[1]


def spec_with(tmp_path, **sections):
    """A typed spec (the environment checks, e.g. vLLM installed for serving vllm, are not this test's)."""
    from mass_jobs.config.run_spec import RunSpec

    return RunSpec.model_validate(spec_document(f"file://{tmp_path}/store", **sections))


def example(name: str):
    import yaml

    from mass_jobs.config.run_spec import RunSpec

    return RunSpec.model_validate(yaml.safe_load((ROOT / "examples" / name).read_text()))


def test_cluster_serves_fp8_on_a_gpu_and_says_why_not_elsewhere(tmp_path):
    paper = example("paper.yaml")
    assert sp.for_cluster(paper, 0).weights == "serve"  # model.serve: the official FP8 checkpoint
    assert model_uri(paper, 0, "b", "runs/paper") == "hf://Qwen/Qwen3.6-27B-FP8"
    assert sp.for_cluster(paper, 1).weights == "fp8" and sp.for_cluster(paper, 2).weights == "fp8"
    assert model_uri(paper, 1, "b", "runs/paper") == "s3://b/runs/paper/gen-1/model-fp8/"
    mini = example("paper-mini.yaml")
    c = sp.for_cluster(mini, 1)
    assert c.weights == "bf16" and "execution.resources.server.gpu is 0" in c.reason
    assert model_uri(mini, 1, "b", "runs/mini") == "s3://b/runs/mini/gen-1/model/"
    no_copy = spec_with(tmp_path, sft={"fp8_export": False}, execution={"mode": "argo"})
    assert sp.for_cluster(no_copy, 1) == sp.Choice("bf16", "sft.fp8_export is false: the merge writes no FP8 copy")
    off = spec_with(tmp_path, sft={"fp8_export": True, "serve_fp8": False})
    assert sp.for_cluster(off, 1).weights == "bf16" and "sft.serve_fp8 is false" in sp.for_cluster(off, 1).reason


@pytest.mark.parametrize(
    "capability, weights, words",
    [
        (None, "bf16", "no CUDA GPU"),
        ((7, 0), "bf16", "compute capability 7.0, under the 7.5"),
        ((8, 0), "fp8", "weight-only W8A16"),
        ((9, 0), "fp8", "9.0) serves the block-FP8 export, W8A8"),
    ],
)
def test_local_vllm_choice_follows_the_gpu(tmp_path, capability, weights, words):
    spec = spec_with(tmp_path, sft={"fp8_export": True}, execution={"serving": "vllm"})
    c = sp.for_local(spec, 1, capability)
    assert c.weights == weights and words in c.reason


def test_local_embedded_and_external(tmp_path):
    embedded = spec_with(tmp_path, sft={"fp8_export": True})
    assert sp.for_local(embedded, 1, (9, 0)).weights == "bf16"
    assert "transformers' server serves the BF16 weights" in sp.for_local(embedded, 1, (9, 0)).reason
    assert sp.for_local(embedded, 0, (9, 0)).weights == "base"


def test_validate_says_which_weights_serve(tmp_path):
    def said(path):
        out = subprocess.run(
            [sys.executable, "-m", "mass_jobs.commands.cli", "validate", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines() if line.startswith("serving:")]

    assert said(ROOT / "examples/paper.yaml") == [
        "serving: generation 0 from model.serve (Qwen/Qwen3.6-27B-FP8): KServe's vLLM runtime on a GPU serves "
        "generation 0 from model.serve (Qwen/Qwen3.6-27B-FP8), as the paper does",
        "serving: generations 1+ from the FP8 weights: KServe's vLLM runtime on a GPU serves the block-FP8 export "
        "(W8A8 from compute capability 8.9, weight-only from 7.5)",
    ]
    doc = spec_document(f"file://{tmp_path}/s", sft={"fp8_export": True})
    doc["model"]["base"] = "org/name"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    assert said(path) == [
        "serving: generations 1+ from the BF16 weights: execution.serving is embedded: "
        "transformers' server serves the BF16 weights; the block-FP8 export is served by vLLM on "
        "a CUDA GPU"
    ]
    vllm = spec_with(tmp_path, sft={"fp8_export": True}, execution={"serving": "vllm"})
    assert "compute capability >= 7.5" in sp.summary(vllm) and "serving.json" in sp.summary(vllm)
    # a float32 model is served as float32: the summary names its dtype, not BF16
    doc["model"]["dtype"] = "float32"
    path.write_text(json.dumps(doc))
    assert said(path) == [
        "serving: generations 1+ from the FP32 weights: execution.serving is embedded: "
        "transformers' server serves the FP32 weights; the block-FP8 export is served by vLLM on "
        "a CUDA GPU"
    ]


def test_a_local_server_serves_the_recorded_weights(tmp_path, tiny_model_dir, monkeypatch):
    """A stored merge (BF16 + its real block-FP8 export): the vLLM backend on an FP8-capable GPU gets
    the FP8 dir, anything else the BF16 one, and gen-1/serving.json says which and why."""
    from mass_jobs.run.context import RunContext
    from mass_jobs.run.generation_model import served_model_dir
    from mass_jobs.serving.fp8 import export_fp8
    from mass_jobs.serving.model_dirs import store_model_dir
    from mass_jobs.store import open_store

    store = open_store(f"file://{tmp_path}/store")
    export_fp8(tiny_model_dir, tmp_path / "fp8")
    vllm = RunContext(spec_with(tmp_path, sft={"fp8_export": True}, execution={"serving": "vllm"}), store)
    store_model_dir(store, vllm.model(1), tiny_model_dir)
    store_model_dir(store, vllm.model_fp8(1), tmp_path / "fp8")

    monkeypatch.setattr(sp, "local_capability", lambda: (9, 0))  # this machine has no GPU to ask
    served = served_model_dir(vllm, 1, tmp_path / "cache")
    assert json.loads((served / "config.json").read_text())["quantization_config"]["weight_block_size"] == [128, 128]
    rec = store.get_json(vllm.serving(1))
    assert rec["weights"] == "fp8" and rec["capability"] == [9, 0] and rec["backend"] == "vllm"

    monkeypatch.setattr(sp, "local_capability", lambda: None)
    served = served_model_dir(vllm, 1, tmp_path / "cache")
    assert "quantization_config" not in json.loads((served / "config.json").read_text())
    assert store.get_json(vllm.serving(1)) == {
        "weights": "bf16",
        "backend": "vllm",
        "capability": None,
        "reason": "this machine has no CUDA GPU: vLLM's CPU backend has no block-FP8 kernels",
    }
    embedded = RunContext(spec_with(tmp_path, sft={"fp8_export": True}), store)
    served = served_model_dir(embedded, 1, tmp_path / "cache")
    assert "quantization_config" not in json.loads((served / "config.json").read_text())
    assert store.get_json(vllm.serving(1))["backend"] == "embedded"
    # an FP8 choice without a stored export falls back, saying so
    store2 = open_store(f"file://{tmp_path}/store2")
    bare = RunContext(vllm.spec, store2)
    store_model_dir(store2, bare.model(1), tiny_model_dir)
    monkeypatch.setattr(sp, "local_capability", lambda: (9, 0))
    served_model_dir(bare, 1, tmp_path / "cache2")
    assert "no FP8 export is stored" in store2.get_json(bare.serving(1))["reason"]


@pytest.mark.parametrize(
    "section, capability, weights, words",
    [
        ({"mode": "argo"}, None, "serve", "serves generation 0 from model.serve (org/name-FP8)"),
        ({"mode": "argo", "resources": {"server": {"gpu": 0}}}, None, "base", "server.gpu is 0"),
        ({"serving": "embedded"}, (9, 0), "base", "transformers' server cannot serve model.serve"),
        ({"serving": "vllm"}, (9, 0), "serve", "(compute capability 9.0) serves model.serve, W8A8 for generation 0"),
        ({"serving": "vllm"}, (7, 0), "base", "under the 7.5 vLLM's FP8 kernels need, so generation 0 is model.base"),
        ({"serving": "vllm"}, None, "base", "no CUDA GPU"),
    ],
)
def test_generation_0_is_served_from_model_serve_where_fp8_runs(tmp_path, section, capability, weights, words):
    """The paper serves L0 from the official FP8 checkpoint: model.serve, where vLLM on a GPU serves;
    model.base elsewhere, with why. Without model.serve, L0 is model.base everywhere."""
    store = "s3://b/runs" if section.get("mode") == "argo" else f"file://{tmp_path}/s"
    doc = spec_document(store, execution=section)
    doc["model"]["serve"] = "org/name-FP8"
    from mass_jobs.config.run_spec import RunSpec

    spec = RunSpec.model_validate(doc)
    c = sp.for_cluster(spec, 0) if section.get("mode") == "argo" else sp.for_local(spec, 0, capability)
    assert c.weights == weights and words in c.reason, c
    if section.get("mode") == "argo":  # what KServe downloads
        assert ("FP8" in model_uri(spec, 0, "b", "runs/x")) is (weights == "serve")
    del doc["model"]["serve"]
    plain = RunSpec.model_validate(doc)
    assert (
        sp.for_cluster(plain, 0) if section.get("mode") == "argo" else sp.for_local(plain, 0, capability)
    ) == sp.BASE


def test_a_local_vllm_serves_l0_from_model_serve_and_records_it(tmp_path, paper_layout_dirs, monkeypatch):
    from mass_jobs.run.context import RunContext
    from mass_jobs.run.generation_model import model_ref, served_model_dir
    from mass_jobs.store import open_store

    base, reference = paper_layout_dirs
    doc = spec_document(f"file://{tmp_path}/store", execution={"serving": "vllm"})
    doc["model"].update(base=str(base), serve=str(reference))
    from mass_jobs.config.run_spec import RunSpec

    ctx = RunContext(RunSpec.model_validate(doc), open_store(f"file://{tmp_path}/store"))
    monkeypatch.setattr(sp, "local_capability", lambda: (9, 0))
    assert served_model_dir(ctx, 0, tmp_path / "cache") == reference
    assert ctx.store.get_json(ctx.serving(0))["weights"] == "serve"
    monkeypatch.setattr(sp, "local_capability", lambda: None)
    assert served_model_dir(ctx, 0, tmp_path / "cache") == base
    assert ctx.store.get_json(ctx.serving(0))["weights"] == "base"
    assert model_ref(ctx, 0) == f"base:{base}|serve:{reference}"  # the serving weights are in L0's identity
