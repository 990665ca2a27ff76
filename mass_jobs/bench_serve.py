"""Throughput of the embedded model server: completed chat requests/s and generated tokens/s at
concurrency 1, 2, 4 and 8 on the tiny model (or --model), written to bench/serve.md with a plot.

Each level sends the same number of chat requests (`--requests`), at most `concurrency` in flight,
with at most `--max-tokens` new tokens each (the tiny model rarely stops early;
the tokens actually generated are read from each reply's usage). The server is the one runs use
(`mass_jobs.serve.ModelServer`, GPU when there is one).

Run: `make bench-serve` (= `python -m mass_jobs.bench_serve --out bench/`); not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LEVELS = (1, 2, 4, 8)


def one_request(url: str, model: str, i: int, max_tokens: int) -> int:
    import httpx

    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": i,
            "messages": [{"role": "user", "content": f"Write a short Python function number {i} that sums a list."}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def measure(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = list(pool.map(lambda i: one_request(url, model, i, max_tokens), range(requests)))
    wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "requests": requests, "wall_s": wall, "requests_per_s": requests / wall,
            "tokens": sum(tokens), "tokens_per_s": sum(tokens) / wall}


def write(out: Path, rows: list[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["# Embedded server throughput", "",
             f"{meta['requests']} chat requests per level, up to {meta['max_tokens']} new tokens each, the tiny "
             f"model on {meta['device']} ({meta['cpus']} CPU cores). Regenerate: `make bench-serve`.", "",
             "| concurrency | wall s | requests/s | generated tokens | tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['wall_s']:.1f} | {r['requests_per_s']:.2f} | {r['tokens']} | "
              f"{r['tokens_per_s']:.1f} |" for r in rows]
    gain = rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    lines += ["", f"Tokens/s at {rows[-1]['concurrency']} in flight vs 1: {gain:.2f}x."]
    (out / "serve.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([r["concurrency"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("generated tokens/s")
    fig.tight_layout()
    fig.savefig(out / "serve.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import os

    import torch

    from mass_jobs.serve import ModelServer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/")
    p.add_argument("--model", help="model dir (default: the tiny model, built in a temp dir)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from mass_jobs.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "model", seed=0))
        with ModelServer(model, served_name="bench") as srv:
            one_request(srv.base_url, "bench", -1, 4)  # warm up: first-call compilation and caches
            rows = [measure(srv.base_url, "bench", c, args.requests, args.max_tokens) for c in LEVELS]
    meta = {"device": "cuda" if torch.cuda.is_available() else "cpu", "cpus": os.cpu_count(),
            "requests": args.requests, "max_tokens": args.max_tokens}
    write(Path(args.out), rows, meta)
    print((Path(args.out) / "serve.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
