"""Throughput of the serving backends: completed chat requests/s and generated tokens/s at
concurrency 1, 2, 4 and 8, and a whole collection step's wall time at `execution.concurrency` 1 vs 4,
on the tiny model (or --model), written to bench/serve.md with a plot.

Backends measured: the embedded server as runs use it (one generate() at a time), the embedded server
with continuous batching (`execution.continuous_batching`), and `vllm serve` when vLLM is installed
here or in the virtual environment `VLLM_PYTHON` names. Each chat level sends `--requests` requests,
at most `concurrency` in flight, with at most `--max-tokens` new tokens each (the tiny model rarely
stops early; tokens are read from each reply's usage). The collection step is `run_collect` with the
builtin harness over `--episodes` teacher episodes of one task, after a K=0 search, through the same
server; every step's requests carry their own seed.

Run: `make bench-serve` (= `python -m mass_jobs.tools.bench_serve --out bench/`); not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.run.context import RunContext
from mass_jobs.serving.backends import serve_model, vllm_launcher
from mass_jobs.serving.roles import client_for
from mass_jobs.spec.load import validate_document
from mass_jobs.steps.collect import run_collect
from mass_jobs.steps.search import run_search
from mass_jobs.store import open_store

LEVELS = (1, 2, 4, 8)
COLLECT_LEVELS = (1, 4)
# backend label -> execution section of the spec that serves it
BACKENDS = {
    "embedded": {"serving": "embedded"},
    "embedded + continuous batching": {"serving": "embedded", "continuous_batching": True},
    "vllm": {"serving": "vllm"},
}


def one_request(base_url: str, model: str, i: int, max_tokens: int) -> int:
    import httpx

    body = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": i,
        "messages": [{"role": "user", "content": f"Write a short Python function number {i} that sums a list."}],
    }
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def measure(base_url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = list(pool.map(lambda i: one_request(base_url, model, i, max_tokens), range(requests)))
    wall = time.perf_counter() - t0
    return {
        "concurrency": concurrency,
        "requests": requests,
        "wall_s": wall,
        "requests_per_s": requests / wall,
        "tokens": sum(tokens),
        "tokens_per_s": sum(tokens) / wall,
    }


def bench_spec(model_dir, store_uri: str, execution: dict, episodes: int, max_tokens: int, dtype: str):
    """A one-task spec whose collection step is small: `episodes` teacher episodes of short turns."""

    doc = {
        "name": "bench",
        "generations": 1,
        "model": {
            "base": str(model_dir),
            "dtype": dtype,
            "sampling": {"max_output_tokens": max_tokens, "context_length": 4096},
        },
        "tasks": [
            {
                "id": "t1",
                "split": "train",
                "prompt": "Write sum.py that prints the sum of 1..10.",
                "deliverables": ["sum.py"],
            }
        ],
        "search": {"iterations": 0},
        "collection": {"episodes": episodes, "train_ranks": 1, "validation_rank": 2, "require_beats_reference": False},
        "ranking": {"comparisons_per_episode": 1},
        "store": {"uri": store_uri},
        "execution": {
            **execution,
            "limits": {
                "turns_per_agent": 2,
                "tool_calls": 4,
                "wall_s": 300,
                "request_timeout_s": 300,
                "request_retries": 0,
            },
        },
    }
    return validate_document(doc)


def collection_walls(spec, endpoint) -> list[dict]:
    """Wall time of the whole collection step at each execution.concurrency (the same K=0 search first)."""

    store = open_store(spec.store.uri)
    run_search(RunContext(spec, store), 0, "t1", client_for(spec, endpoint), episode_runner(spec, endpoint))
    rows = []
    for c in COLLECT_LEVELS:
        s = spec.model_copy(update={"execution": spec.execution.model_copy(update={"concurrency": c})})
        ctx = RunContext(s, store)
        for key in store.list(ctx.collect(0, "t1") + "/"):
            store.delete(key)
        t0 = time.perf_counter()
        run_collect(ctx, 0, "t1", episode_runner(s, endpoint))
        wall = time.perf_counter() - t0
        rows.append(
            {
                "concurrency": c,
                "episodes": s.collection.episodes,
                "wall_s": wall,
                "episodes_per_s": s.collection.episodes / wall,
            }
        )
    return rows


def run_backend(label: str, model_dir, tmp: Path, args, dtype: str) -> dict:

    spec = bench_spec(
        model_dir, f"file://{tmp / label.replace(' ', '-')}", BACKENDS[label], args.episodes, args.max_tokens, dtype
    )
    with serve_model(spec, model_dir, "bench", log_path=tmp / f"{label.replace(' ', '-')}.log") as endpoint:
        one_request(endpoint.base_url, "bench", -1, 4)  # warm up: first-call compilation and caches
        chat = [measure(endpoint.base_url, "bench", c, args.requests, args.max_tokens) for c in LEVELS]
        collect = collection_walls(spec, endpoint)
    return {"backend": label, "chat": chat, "collect": collect}


def grouped_bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    """One bar per series side by side in each group, the group's label under the middle."""
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series.items()):
        ax.bar([i + k * width for i in range(len(groups))], values, width, label=label)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(groups))], groups)


def write(out: Path, results: list[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps({"meta": meta, "backends": results}, indent=2))
    lines = [
        "# Serving throughput",
        "",
        f"The tiny model on {meta['device']} ({meta['cpus']} CPU cores; 1-minute load average "
        f"{meta['load_avg_1m'][0]} at the start, {meta['load_avg_1m'][1]} at the end); vLLM: {meta['vllm']}. "
        f"Regenerate: `make bench-serve`.",
        "",
        f"## Chat requests ({meta['requests']} per level, up to {meta['max_tokens']} new tokens each)",
        "",
        "| backend | concurrency | wall s | requests/s | generated tokens | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for b in results:
        lines += [
            f"| {b['backend']} | {r['concurrency']} | {r['wall_s']:.1f} | {r['requests_per_s']:.2f} | "
            f"{r['tokens']} | {r['tokens_per_s']:.1f} |"
            for r in b["chat"]
        ]
    lines += [
        "",
        "Tokens/s at 8 in flight vs 1: "
        + ", ".join(
            f"{b['backend']} {b['chat'][-1]['tokens_per_s'] / b['chat'][0]['tokens_per_s']:.2f}x" for b in results
        )
        + ".",
        "",
        f"## A whole collection step ({meta['episodes']} teacher episodes of one task, builtin harness)",
        "",
        "| backend | execution.concurrency | wall s | episodes/s |",
        "|---|---|---|---|",
    ]
    for b in results:
        lines += [
            f"| {b['backend']} | {r['concurrency']} | {r['wall_s']:.1f} | {r['episodes_per_s']:.2f} |"
            for r in b["collect"]
        ]
    lines += [
        "",
        "Collection wall time at concurrency 4 vs 1: "
        + ", ".join(f"{b['backend']} {b['collect'][-1]['wall_s'] / b['collect'][0]['wall_s']:.2f}x" for b in results)
        + ".",
    ]
    (out / "serve.md").write_text("\n".join(lines) + "\n")
    plot(out / "serve.png", results)


def plot(path: Path, results: list[dict]) -> None:
    """Chat throughput by requests in flight, and a collection step's wall time by concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    for b in results:
        ax.plot(
            [r["concurrency"] for r in b["chat"]],
            [r["tokens_per_s"] for r in b["chat"]],
            marker="o",
            label=b["backend"],
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chat requests in flight")
    ax.set_ylabel("generated tokens/s")
    ax.legend(fontsize=7)
    grouped_bars(
        bx,
        [f"concurrency {c}" for c in COLLECT_LEVELS],
        {b["backend"]: [r["wall_s"] for r in b["collect"]] for b in results},
    )
    bx.set_ylabel("collection step wall s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/")
    p.add_argument("--model", help="model dir (default: the tiny model, built in a temp dir)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--episodes", type=int, default=8, help="teacher episodes of the timed collection step")
    args = p.parse_args(argv)
    launcher = vllm_launcher()
    load_before = os.getloadavg()[0]  # other work on the machine skews every number: say how much
    labels = [b for b in BACKENDS if b != "vllm" or launcher is not None]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from mass_jobs.tiny.build import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "model", seed=0))
        for label in labels:
            print(f"bench-serve: {label} ...", file=sys.stderr, flush=True)
            # bf16 on an accelerator (what runs serve with); fp32 on CPU, where bf16 matmuls are slow
            results.append(
                run_backend(label, model, Path(tmp), args, "bfloat16" if torch.cuda.is_available() else "float32")
            )
    meta = {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpus": os.cpu_count(),
        "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "episodes": args.episodes,
        "vllm": "measured" if launcher else "not installed, so not measured (VLLM_PYTHON, or pip install '.[vllm]')",
    }
    write(Path(args.out), results, meta)
    print((Path(args.out) / "serve.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
