"""The checks that need an accelerator, in one command and one table: `make gpu-check`.

On one H100-class GPU, within about 10 minutes:

1. the tiny model in the paper's checkpoint layout and its block-FP8 export (`export_like`, the
   paper's rule against the official checkpoint's layout), built here;
2. vLLM serving each with the InferenceService's engine arguments (`qwen3_coder` tool calls,
   `qwen3` reasoning, the context length, bf16): health, and a chat request with a tool whose reply
   parses;
3. one agent episode (builtin harness, sandboxed) through the bf16 server;
4. one training step with the model sharded by FSDP, under torchrun;
5. `make bench` on CUDA: the trainer against TRL, and a 28k-token shared prefix per serving backend.

What cannot run here is skipped with the reason (no GPU, vLLM not installed, no sandbox), never
counted as passed. Writes `gpu-check.md` and `gpu-check.json` under --out; exit 1 when a check that
ran failed.

Run: `make gpu-check` (= `python -m mass_jobs.tools.gpu_check --out bench/`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]
MAX_MODEL_LEN = 8192


class Skip(Exception):
    """A check that cannot run on this machine; the message says why."""


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def device_line() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"cpu only (torch {torch.__version__}, {os.cpu_count()} cores)"
    p = torch.cuda.get_device_properties(0)
    return f"{p.name}, {p.total_memory / 2**30:.0f} GiB (torch {torch.__version__}, CUDA {torch.version.cuda})"


def build(work: Path) -> dict:
    from mass_jobs.serving.fp8 import export_like
    from mass_jobs.tiny.paper_layout import build_fp8_reference, build_paper_layout_model

    bf16 = build_paper_layout_model(work / "bf16")
    reference = build_fp8_reference(bf16, work / "fp8-reference")
    report = export_like(bf16, reference, work / "fp8")
    return {
        "bf16": bf16,
        "fp8": work / "fp8",
        "detail": f"bf16 and its FP8 export ({report['tensors']} tensors, largest error over bound "
        f"{report['max_error_over_bound']:.2f})",
    }


def vllm_args(name: str) -> list[str]:
    """The InferenceService's runtime arguments for the paper's model, as the chart renders them."""
    from mass_jobs.k8s.serving import runtime_args
    from mass_jobs.k8s.settings import ClusterSettings

    settings = ClusterSettings(tool_call_parser="qwen3_coder", reasoning_parser="qwen3", max_model_len=MAX_MODEL_LEN)
    args = runtime_args(settings, name, "bfloat16")
    return [a for a in args if not a.startswith(("--model_name", "--backend"))]  # KServe's own, not vLLM's


def needs_vllm() -> list[str]:
    from mass_jobs.serving.backends import vllm_launcher, vllm_missing_reason

    if not cuda():
        raise Skip(
            "no CUDA device: vLLM's CPU build cannot load Qwen3.5/3.6's class (it imports torchvision, "
            "which does not load beside the CPU torch) nor run block-FP8 weights"
        )
    launcher = vllm_launcher()
    if launcher is None:
        raise Skip(vllm_missing_reason())
    return launcher


def serve_and_ask(model_dir: Path, log: Path) -> str:
    import httpx

    from mass_jobs.serving.backends import VllmServer

    with VllmServer(model_dir, "gpu-check", vllm_args("gpu-check"), launcher=needs_vllm(), log_path=log) as srv:
        body = {
            "model": "gpu-check",
            "max_tokens": 64,
            "temperature": 0.7,
            "seed": 1,
            "tools": TOOLS,
            "messages": [{"role": "user", "content": "What is in a.txt?"}],
        }
        r = httpx.post(f"{srv.endpoint.base_url}/chat/completions", json=body, timeout=300)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        usage = r.json()["usage"]
    return (
        f"served with {' '.join(vllm_args('gpu-check'))}; a reply of {usage['completion_tokens']} tokens, "
        f"finish_reason {choice['finish_reason']}, {len(choice['message'].get('tool_calls') or [])} tool calls parsed"
    )


def episode(model_dir: Path, work: Path) -> str:
    from mass_jobs.config.run_spec import RunSpec
    from mass_jobs.episodes.episode import EpisodeRequest
    from mass_jobs.episodes.rollouts import episode_runner, run_here
    from mass_jobs.sandbox.run import bwrap_refusal
    from mass_jobs.serving.backends import VllmServer

    launcher = needs_vllm()
    refusal = bwrap_refusal()
    if refusal:
        raise Skip(refusal)
    spec = RunSpec.model_validate(
        {
            "name": "gpu-check",
            "generations": 1,
            "model": {
                "base": str(model_dir),
                "dtype": "bfloat16",
                "sampling": {"max_output_tokens": 256, "context_length": MAX_MODEL_LEN},
            },
            "tasks": [{"id": "t1", "split": "train", "prompt": "Write report.md.", "deliverables": ["report.md"]}],
            "store": {"uri": f"file://{work}/store"},
            "execution": {
                "harness": "builtin",
                "serving": "vllm",
                "vllm": {"tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3"},
                "limits": {
                    "turns_per_agent": 2,
                    "tool_calls": 4,
                    "wall_s": 300,
                    "request_timeout_s": 120,
                    "request_retries": 0,
                },
            },
        }
    )
    with VllmServer(
        model_dir, "gpu-check", vllm_args("gpu-check"), launcher=launcher, log_path=work / "episode-vllm.log"
    ) as srv:
        run_episode = episode_runner(spec, srv.endpoint, executor_role=False)
        with run_here(run_episode, EpisodeRequest(prompt="Write report.md with one line.", files={}, seed=0)) as ran:
            status = ran.status
    if status.get("outcome") == "infra_error":
        raise RuntimeError(f"the episode ended infra_error: {status.get('error') or status}")
    return f"outcome {status.get('outcome')}, {status.get('model_calls', '?')} model calls"


FSDP_STEP = """
import json, sys, torch, torch.distributed as dist
from mass_jobs.config.run_spec import LoraSpec, SftSpec
from mass_jobs.training.loop import Trainer
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
ids = list(range(20, 276))
windows = [{"task": "t", "role": "orchestrator", "input_ids": ids, "labels": [-100] * 64 + ids[64:],
            "n_supervised": 192}] * 4
sft = SftSpec(window=256, context=0, steps=1, val_every=1, save_every=1, gradient_checkpointing=True,
              lora=LoraSpec(r=4, alpha=8, dropout=0.0))
t = Trainer(sys.argv[1], windows, windows[:1], sft, sys.argv[2], parallel="fsdp", progress=False)
t.setup()
t.train()
print(json.dumps({"device": str(t.device), "steps": 1}))
dist.destroy_process_group()
"""


def fsdp_step(model_dir: Path, work: Path) -> str:
    script = work / "fsdp_step.py"
    script.write_text(FSDP_STEP)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "1", str(script), str(model_dir), str(work / "fsdp")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}: {proc.stderr[-1500:]}")
    log = [json.loads(line) for line in (work / "fsdp" / "log.jsonl").read_text().splitlines() if line.strip()]
    losses = [round(r["loss"], 3) for r in log if "loss" in r]
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    return f"one FSDP step on {done['device']} in {time.perf_counter() - t0:.0f} s (with start-up), loss {losses[:1]}"


def bench(out: Path) -> str:
    if not cuda():
        raise Skip("no CUDA device: `make bench` measures this machine's CPU (bench/results.md, bench/prefix.md)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for module in ("mass_jobs.tools.bench", "mass_jobs.tools.bench_prefix"):
        subprocess.run([sys.executable, "-m", module, "--out", str(out)], check=True, env=env, timeout=420)
    return f"wrote {out / 'results.md'} and {out / 'prefix.md'}"


def run_checks(out: Path, work: Path) -> list[dict]:
    rows: list[dict] = []
    built: dict = {}

    def check(name: str, fn) -> None:
        t0 = time.perf_counter()
        print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
        try:
            detail, result = fn(), "passed"
        except Skip as exc:
            detail, result = str(exc), "skipped"
        except Exception as exc:  # one failed check must not hide the others
            detail, result = f"{type(exc).__name__}: {exc}".strip()[-2000:], "failed"
            traceback.print_exc()
        rows.append({"check": name, "result": result, "seconds": round(time.perf_counter() - t0, 1), "detail": detail})
        print(f"gpu-check: {name}: {result} ({detail[:200]})", file=sys.stderr, flush=True)

    def do_build():
        built.update(build(work))
        return built["detail"]

    def model(key):
        if key not in built:
            raise Skip("the paper-layout models were not built (see the build row)")
        return built[key]

    check("device", device_line)
    check("build: paper-layout model and FP8 export", do_build)
    check("vLLM: bf16 with the InferenceService's arguments", lambda: serve_and_ask(model("bf16"), work / "bf16.log"))
    check("vLLM: the FP8 export", lambda: serve_and_ask(model("fp8"), work / "fp8.log"))
    check("episode through vLLM (builtin harness, sandboxed)", lambda: episode(model("bf16"), work))
    check("training: one FSDP step under torchrun", lambda: fsdp_step(model("bf16"), work))
    check("make bench on CUDA", lambda: bench(out))
    return rows


def write(out: Path, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps({"checks": rows}, indent=2))
    lines = [
        "# GPU check",
        "",
        f"Device: {rows[0]['detail'] if rows else '?'}. Regenerate: `make gpu-check`.",
        "",
        "| check | result | s | detail |",
        "|---|---|---:|---|",
    ]
    for r in rows[1:]:
        detail = r["detail"].replace("|", "/").replace("\n", " ")
        lines.append(f"| {r['check']} | {r['result']} | {r['seconds']:.0f} | {detail[:400]} |")
    (out / "gpu-check.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_checks(Path(args.out), Path(tmp))
    write(Path(args.out), rows)
    print((Path(args.out) / "gpu-check.md").read_text())
    return 1 if any(r["result"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
