"""One agent episode through vLLM itself (its CPU build, `make vllm-env`), started with the engine
arguments the cluster's InferenceService passes: the tool-call parser, the reasoning parser, the
context length and the dtype of the spec, under the served name the roles call.

The paper's model (multimodal Qwen3.6) cannot be served by the CPU build here: vLLM's class for it
imports torchvision, which does not load beside the CPU torch (docs/paper.md). The dense tiny model
(Qwen3, JSON tool calls, `hermes`) is served instead; vLLM's parsers on the paper layout's XML calls
are tests/test_paper_layout.py's.
"""

from __future__ import annotations

import json

import pytest

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.episodes.episode import EpisodeRequest
from mass_jobs.episodes.rollouts import episode_runner, run_here
from mass_jobs.k8s.serving import runtime_args
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.serving.backends import VllmServer, serve_model, spec_engine_args
from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, workflow_prompt_parts
from mass_jobs.tiny.warm_check import DEMO_PROMPTS
from tests.fixtures.inner_loop import spec_document


@pytest.mark.slow(cost=150)
def test_an_episode_runs_through_vllm_started_as_the_inference_service_starts_it(
    warm_tiny_model_dir, vllm_python, tmp_path, monkeypatch
):
    monkeypatch.setenv("VLLM_PYTHON", str(vllm_python))
    # The CPU build reserves 92% of the machine's memory for its KV cache unless told a size, and
    # refuses to start while other tests hold more than 8%; 1 GiB serves the tiny model. (The CPU
    # build's own setting, not an engine argument: the arguments stay the InferenceService's.)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    doc = spec_document(
        f"file://{tmp_path}/store",
        execution={
            "serving": "vllm",
            "harness": "builtin",
            "vllm": {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"},
            "limits": {
                "turns_per_agent": 3,
                "tool_calls": 6,
                "wall_s": 300,
                "request_timeout_s": 120,
                "request_retries": 0,
            },
        },
    )
    doc["model"] = {
        "base": str(warm_tiny_model_dir),
        "dtype": "float32",
        "sampling": {"max_output_tokens": 128, "context_length": 4096},
    }
    spec = RunSpec.model_validate(doc)
    args = spec_engine_args(spec)
    # the InferenceService's runtime passes the same engine arguments for this spec
    settings = ClusterSettings(tool_call_parser="hermes", reasoning_parser="qwen3", max_model_len=4096)
    assert [a for a in runtime_args(settings, "tiny", "float32") if a in args] == args
    assert VllmServer(warm_tiny_model_dir, "tiny", args, launcher=["python"]).command()[-len(args) :] == args

    prompt = workflow_prompt_parts(DEMO_PROMPTS[0], DEFAULT_WORKFLOW).text
    with serve_model(spec, warm_tiny_model_dir, "tiny", log_path=tmp_path / "vllm.log") as endpoint:
        execute = episode_runner(spec, endpoint, executor_role=False)
        with run_here(execute, EpisodeRequest(prompt=prompt, files={}, seed=0)) as ran:
            status, trace = ran.status, ran.trace
    log = (tmp_path / "vllm.log").read_text(errors="replace")
    assert "tool_call_parser" in log and "'hermes'" in log  # vLLM's own record of its arguments
    records = [json.loads(line) for line in trace.decode().splitlines() if line.strip()]
    replies = [r["response"]["message"] for r in records if r.get("response")]
    assert replies and all(r["request"]["model"] == "tiny" for r in records), records[:2]
    assert status["outcome"] != "infra_error", status
    # the warm model delegates under a workflow prompt: vLLM's hermes parser made its call a tool call
    calls = [c["function"]["name"] for m in replies for c in (m.get("tool_calls") or [])]
    assert "delegate" in calls, replies[:2]
