"""`make gpu-check` on a machine without a GPU: it runs what it can (the paper-layout build and FP8
export, one FSDP step under torchrun), skips the rest naming why, and a failed check fails it."""

from __future__ import annotations

import json

import pytest

from mass_jobs.tools import gpu_check


@pytest.mark.slow(cost=20)  # builds the paper-layout model and runs torchrun: the slow tier
@pytest.mark.skipif(gpu_check.cuda(), reason="asserts the CPU machine's skips; a GPU machine runs them")
def test_without_a_gpu_it_runs_what_it_can_and_says_what_it_skipped(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    rows = {r["check"]: r for r in json.loads((tmp_path / "gpu-check.json").read_text())["checks"]}
    assert rows["device"]["detail"].startswith("cpu only")
    assert rows["build: paper-layout model and FP8 export"]["result"] == "passed"
    fsdp = rows["training: one FSDP step under torchrun"]
    assert fsdp["result"] == "passed" and "one FSDP step on cpu" in fsdp["detail"], fsdp
    skipped = [r for r in rows.values() if r["result"] == "skipped"]
    assert {r["check"] for r in skipped} == {
        "vLLM: bf16 with the InferenceService's arguments",
        "vLLM: the FP8 export",
        "episode through vLLM (builtin harness, sandboxed)",
        "make bench on CUDA",
    }
    assert all(r["detail"].startswith("no CUDA device: ") for r in skipped)
    table = (tmp_path / "gpu-check.md").read_text()
    assert table.count("| skipped |") == 4 and table.count("| passed |") == 2
    assert "| make bench on CUDA | skipped |" in capsys.readouterr().out


def test_the_engine_arguments_are_the_inference_services_for_the_papers_model():
    args = gpu_check.vllm_args("m")
    assert "--tool-call-parser=qwen3_coder" in args and "--reasoning-parser=qwen3" in args
    assert "--enable-auto-tool-choice" in args and "--dtype=bfloat16" in args
    assert not [a for a in args if a.startswith(("--model_name", "--backend"))]  # KServe's, not vLLM's


def test_a_failed_check_fails_the_command_and_what_needs_it_says_so(tmp_path, monkeypatch):
    def broken(work):
        raise OSError("disk full")

    monkeypatch.setattr(gpu_check, "build", broken)
    monkeypatch.setattr(gpu_check, "cuda", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    rows = {r["check"]: r for r in json.loads((tmp_path / "gpu-check.json").read_text())["checks"]}
    assert rows["build: paper-layout model and FP8 export"] == {
        **rows["build: paper-layout model and FP8 export"],
        "result": "failed",
        "detail": "OSError: disk full",
    }
    assert rows["training: one FSDP step under torchrun"]["result"] == "skipped"
    assert "were not built" in rows["training: one FSDP step under torchrun"]["detail"]
