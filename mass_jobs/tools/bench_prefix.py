"""What a shared prompt prefix costs the serving backends: the first request against later ones.

Every qwen-code request carries the same system prompt and tool list (about 28k tokens). This sends,
to each backend, one request with a `--prefix-tokens` system prompt, then later requests that share
it: two other questions (the system prompt shared) and the first conversation's next turn (all of the
first prompt shared). Per request: wall time (prefill-dominated: `--max-tokens` new tokens), prompt
tokens, prompt tokens reused from the cache (the embedded server's `/prefix_cache` counters; vLLM's
`usage.prompt_tokens_details.cached_tokens`) and prefill tokens/s (new tokens over wall time).

Backends: the embedded server with its prefix cache, the same with the cache off
(`--prefix-cache-gib 0`: same block-cut prefill, nothing kept), and `vllm serve` with automatic
prefix caching when vLLM is installed here or in `VLLM_PYTHON`. Every request is seeded; the table
says whether each reply with the cache on is byte-identical to the same request with it off.

Run: `make bench` (also writes the training table) or `python -m mass_jobs.tools.bench_prefix --out bench/`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from mass_jobs.serving.backends import REASONING_PARSER, TOOL_CALL_PARSER, VllmServer, engine_args, vllm_launcher
from mass_jobs.serving.serve import ModelServer
from mass_jobs.tools.bench_serve import grouped_bars

# What vLLM documents for automatic prefix caching (docs.vllm.ai, "Automatic Prefix Caching"): a new
# request that shares a prefix with an earlier one reuses its KV blocks and skips their prefill; it
# does not change decoding speed, and it is on by default in the V1 engine.
VLLM_NOTE = (
    "vLLM documents automatic prefix caching as skipping the prefill of blocks an earlier request "
    "computed (hash of the block's tokens and everything before it), leaving decoding unchanged"
)
QUESTIONS = (
    "Which files must the summary cover?",
    "List the checks that run after each edit.",
    "What is the first step of the plan?",
)


def system_prompt(tokenizer, tokens: int) -> str:
    """A system prompt of about `tokens` tokens of the model's tokenizer (rules, as a harness writes them)."""
    line = "Rule {i}: run the tests after every edit of src/, keep logs under logs/, and report numbers exactly.\n"
    per = len(tokenizer(line.format(i=10), add_special_tokens=False)["input_ids"])
    return "".join(line.format(i=i) for i in range(tokens // per + 1))


def conversations(system: str) -> list[tuple[str, list[dict]]]:
    first = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[0]}]
    follow = first + [
        {"role": "assistant", "content": "src/ and logs/ both."},
        {"role": "user", "content": "Then write the summary to out/summary.md."},
    ]
    return [
        ("first", first),
        ("other question", [first[0], {"role": "user", "content": QUESTIONS[1]}]),
        ("other question", [first[0], {"role": "user", "content": QUESTIONS[2]}]),
        ("next turn", follow),
    ]


def ask(base_url: str, messages: list[dict], max_tokens: int, seed: int | None) -> dict:
    import httpx

    body = {"model": "bench", "messages": messages, "max_tokens": max_tokens, "temperature": 0.7, "seed": seed}
    if seed is None:
        body["temperature"] = 0.0
        del body["seed"]
    t0 = time.perf_counter()
    r = httpx.post(f"{base_url}/chat/completions", json=body, timeout=1800)
    r.raise_for_status()
    wall = time.perf_counter() - t0
    data = r.json()
    usage = data.get("usage") or {}
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return {
        "wall_s": wall,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "cached_tokens": cached,
        "text": data["choices"][0]["message"].get("content") or "",
    }


def run_backend(label: str, server, convos, max_tokens: int, seeded: bool = True) -> dict:
    """`seeded=False` decodes greedily: vLLM's CPU build fails a seeded request whose prompt is
    prefilled in chunks ("CPU Generator does not use offset"), and a 28k-token prompt is."""
    import httpx

    rows = []
    with server as srv:
        ask(srv.base_url + "/v1", [{"role": "user", "content": "hi"}], 2, 0)  # warm up outside the timing
        for i, (kind, messages) in enumerate(convos):
            before = httpx.get(f"{srv.base_url}/prefix_cache").json() if isinstance(server, ModelServer) else None
            try:
                row = ask(srv.base_url + "/v1", messages, max_tokens, seed=100 + i if seeded else None)
            except Exception as exc:
                raise RuntimeError(f"{label}: {exc}\n{srv.log_tail()}") from exc
            if before is not None:
                after = httpx.get(f"{srv.base_url}/prefix_cache").json()
                row["cached_tokens"] = after["reused_tokens"] - before["reused_tokens"]
            new = row["prompt_tokens"] - row["cached_tokens"]
            row.update(kind=kind, new_tokens=new, prefill_tokens_per_s=row["prompt_tokens"] / row["wall_s"])
            rows.append(row)
            print(
                f"bench-prefix: {label} {kind}: {row['wall_s']:.2f} s, {row['cached_tokens']}/"
                f"{row['prompt_tokens']} prompt tokens reused",
                file=sys.stderr,
                flush=True,
            )
    return {"backend": label, "requests": rows, "seeded": seeded}


def summary(b: dict) -> dict:
    first, later = b["requests"][0], b["requests"][1:]
    mean = sum(r["wall_s"] for r in later) / len(later)
    return {
        "first_s": first["wall_s"],
        "later_s": mean,
        "speedup": first["wall_s"] / mean,
        "first_tps": first["prompt_tokens"] / first["wall_s"],
        "later_tps": sum(r["prompt_tokens"] for r in later) / sum(r["wall_s"] for r in later),
        "reused": sum(r["cached_tokens"] for r in later),
        "prompt": sum(r["prompt_tokens"] for r in later),
    }


def write(out: Path, results: list[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefix.json").write_text(json.dumps({"meta": meta, "backends": results}, indent=2))
    off = next((b for b in results if b["backend"] == "embedded, cache off"), None)
    lines = [
        "# A shared prompt prefix: the first request against later ones",
        "",
        f"The tiny model on {meta['device']} ({meta['cpus']} CPU cores, OMP_NUM_THREADS={meta['threads']}), a "
        f"system prompt of {meta['prompt_tokens']} tokens, {meta['max_tokens']} new tokens per request "
        f"(seeded sampling{'' if all(b.get('seeded', True) for b in results) else '; greedy for vLLM, see below'}). "
        "Later requests: two other questions under the same system prompt, and the first "
        f"conversation's next turn. vLLM: {meta['vllm']}. Regenerate: `make bench`.",
        "",
        "| backend | first request s | later requests s (mean) | later vs first | prefill tokens/s, first "
        "| prefill tokens/s, later | prompt tokens reused, later | replies = cache off |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for b in results:
        s = summary(b)
        same = "–"
        if off is not None and b["backend"].startswith("embedded"):
            same = "yes" if [r["text"] for r in b["requests"]] == [r["text"] for r in off["requests"]] else "NO"
        lines.append(
            f"| {b['backend']} | {s['first_s']:.2f} | {s['later_s']:.2f} | {s['speedup']:.1f}x faster | "
            f"{s['first_tps']:.0f} | {s['later_tps']:.0f} | {s['reused']}/{s['prompt']} | {same} |"
        )
    lines += [
        "",
        f"Prefill tokens/s counts every prompt token over the request's wall time. {VLLM_NOTE}; "
        "the embedded server's cache does the same at 256-token blocks, on one generate() at a time, and "
        "cuts every prompt's prefill at those blocks with or without it, which is why its replies are the "
        "same with the cache off (the 'cache off' row: the same cut prefill, nothing kept).",
    ]
    if not all(b.get("seeded", True) for b in results):
        lines += [
            "",
            "vLLM's CPU build decodes greedily here: it fails a seeded request whose prompt it prefills "
            "in chunks ('CPU Generator does not use offset'), which a 28k-token prompt is.",
        ]
    (out / "prefix.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    grouped_bars(
        ax,
        [r["kind"] for r in results[0]["requests"]],
        {b["backend"]: [r["wall_s"] for r in b["requests"]] for b in results},
    )
    ax.set_ylabel("request wall s")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "prefix.png", dpi=110)
    plt.close(fig)


def backends(model: str, dtype: str, tmp: Path, prompt_tokens: int, launcher) -> dict:
    """The servers compared: the embedded one with its prefix cache and without, and vLLM's where it
    is installed."""
    servers = {
        "embedded, prefix cache": ModelServer(model, served_name="bench", dtype=dtype, log_path=tmp / "on.log"),
        "embedded, cache off": ModelServer(
            model, served_name="bench", dtype=dtype, prefix_cache_gib=0, log_path=tmp / "off.log"
        ),
    }
    if launcher is not None:
        args = engine_args(
            tool_call_parser=TOOL_CALL_PARSER,
            reasoning_parser=REASONING_PARSER,
            max_model_len=prompt_tokens + 4096,
            dtype=dtype,
        )
        servers["vllm, prefix caching"] = VllmServer(
            model,
            "bench",
            [*args, "--enable-prefix-caching", "--enable-prompt-tokens-details"],
            launcher=launcher,
            log_path=tmp / "vllm.log",
        )
    return servers


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/")
    p.add_argument("--model", help="model dir (default: the tiny model, built in a temp dir)")
    p.add_argument("--prefix-tokens", type=int, default=28_000)
    p.add_argument("--max-tokens", type=int, default=8)
    args = p.parse_args(argv)
    launcher = vllm_launcher()
    if not torch.cuda.is_available():  # vLLM's CPU build would otherwise reserve 92% of memory for its KV cache
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from mass_jobs.tiny.build import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "model", seed=0))
        tokenizer = AutoTokenizer.from_pretrained(model)
        convos = conversations(system_prompt(tokenizer, args.prefix_tokens))
        prompt_tokens = len(
            tokenizer.apply_chat_template(convos[0][1], add_generation_prompt=True, return_dict=True)["input_ids"]
        )
        servers = backends(model, dtype, Path(tmp), prompt_tokens, launcher)
        results = [
            run_backend(
                label, server, convos, args.max_tokens, seeded=torch.cuda.is_available() or not label.startswith("vllm")
            )
            for label, server in servers.items()
        ]
    meta = {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpus": os.cpu_count(),
        "threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "prompt_tokens": prompt_tokens,
        "max_tokens": args.max_tokens,
        "vllm": "measured" if launcher else "not installed, so not measured (VLLM_PYTHON, or pip install '.[vllm]')",
    }
    write(Path(args.out), results, meta)
    print((Path(args.out) / "prefix.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
