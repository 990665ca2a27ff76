"""What `make bench` writes of the SFT bench: the table beside the library a user would otherwise
pick (sft.md, sft.json), the loss curves' fall, the profile and the long-window rows."""

from __future__ import annotations

import json
from pathlib import Path

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}
FALL_STEPS = 10  # the loss fall compares the mean of the first and of the last this many steps


PAPER_TOKENS_PER_S_PER_GPU = 39.47e6 / (19 * 3600 * 6)  # 39.47M supervised tokens, about 19 h on 6 H100s


def loss_fall(losses: list[float], k: int = FALL_STEPS) -> tuple[float, float, float]:
    """(mean of the first k losses, mean of the last k, the share by which the loss fell)."""
    first, last = sum(losses[:k]) / len(losses[:k]), sum(losses[-k:]) / len(losses[-k:])
    return first, last, 1 - last / first


def write_results(out: Path, results: dict, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    trl = results["trl SFTTrainer"]
    recipe = meta["recipe"]
    lora, opt, scale = recipe["lora"], recipe["optimizer"], recipe["embed_scale"]
    peak_flops = next((v for k, v in PEAK_BF16_FLOPS.items() if k in meta["device_name"]), None)
    for r in results.values():
        r["tokens_per_s"] = r["tokens"] / r["wall_s"] if r["wall_s"] else 0.0
        r["first_loss"], r["last_loss"], r["loss_fall"] = loss_fall(r["losses"])
        r["model_tflops_per_s"] = meta["flops_per_token"] * r["processed_tokens"] / r["wall_s"] / 1e12
        r["mfu"] = r["model_tflops_per_s"] * 1e12 / peak_flops if peak_flops else None
    rows = []
    for name, r in results.items():
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "–"
        rows.append(
            f"| {name} | {r['tokens']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | "
            f"{r['tokens_per_s'] / trl['tokens_per_s']:.2f}x | {r['peak_mb']:.0f} | {r['peak_mb'] / trl['peak_mb']:.2f}x | "
            f"{r['first_loss']:.3f} | {r['last_loss']:.3f} | {100 * r['loss_fall']:.0f}% | "
            f"{r['model_tflops_per_s']:.3f} | {mfu} |"
        )
    a, b = results["mass train"]["losses"], trl["losses"]
    gap = max(abs(x - y) for x, y in zip(a, b)) if a and b else float("nan")
    mean_gap = sum(abs(x - y) for x, y in zip(a, b)) / min(len(a), len(b)) if a and b else float("nan")
    unit = "tokens/s/GPU" if meta["device"] == "cuda" else "tokens/s"
    paper = (
        f" The paper's run: about {PAPER_TOKENS_PER_S_PER_GPU:.0f} supervised tokens/s/GPU (39.47M tokens in about "
        "19 h on 6 H100s, 27B model, 49,152-token windows)."
        if meta["device"] == "cuda"
        else ""
    )
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "results": results, "max_loss_gap": gap, "mean_loss_gap": mean_gap}, indent=2)
    )
    (out / "results.md").write_text(
        "\n".join(
            [
                "# mass train vs TRL SFTTrainer",
                "",
                f"The tiny model (embedding x{scale:g}), {meta['windows']} windows of the last {meta['window_tokens']} tokens of "
                f"warm-corpus harness conversations (the template's masks), the same {meta['steps']} sampled windows in the same "
                f"order, LoRA r={lora['r']} alpha={lora['alpha']}, AdamW (0.9, 0.95) lr {opt['lr']:g}, warmup {opt['warmup_steps']} "
                f"+ cosine to {opt['min_lr_ratio']}x, clip 1.0, gradient checkpointing, batch 1. "
                f"Device: {meta['device_name']} (torch {meta['torch']}, {meta['threads']} threads).",
                "",
                f"| trainer | supervised tokens | wall s | {unit} | vs TRL | peak memory MB | vs TRL | loss, first {FALL_STEPS} "
                f"| loss, last {FALL_STEPS} | fall | model TFLOP/s | MFU |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                *rows,
                "",
                f"Per-step loss difference between the two: largest {gap:.4f}, mean {mean_gap:.4f} (the same windows in the same "
                "order; the schedules differ by how each counts warmup steps). mass train's wall time includes its validation "
                "passes and its checkpoint. Model FLOPs per processed token: "
                f"{meta['flops_per_token'] / 1e6:.2f} M (`model_flops_per_token`); MFU against the GPU's dense bf16 peak.{paper}",
                "Regenerate: `make bench`.",
            ]
        )
        + "\n"
    )
    loss_plot(out / "loss.png", results)


def loss_plot(path: Path, results: dict) -> None:
    """Each trainer's window loss by step (matplotlib is optional here)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for name, r in results.items():
            ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=name, linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("window loss")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    except ImportError:
        pass


def write_profile(out: Path, results: dict, meta: dict) -> None:
    parts = [
        "# Where the time goes: mass train and TRL SFTTrainer under torch.profiler",
        "",
        f"The bench's {meta['steps']} steps (see results.md), each trainer in its own process, top ops by self "
        f"time. Device: {meta['device_name']}. Profiled runs are slower than the timed ones.",
        "",
    ]
    for name, r in results.items():
        parts += [f"## {name}", "", "```", r.pop("profile").rstrip(), "```", ""]
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.md").write_text("\n".join(parts))


def write_long_rows(out: Path, rows: list[dict], meta: dict) -> None:
    """Append the long-window table to results.md and results.json."""
    doc = json.loads((out / "results.json").read_text())
    doc["long_window"] = rows
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    vocabs = sorted({r["vocab"] for r in rows})
    peak = {(r["trainer"], r["vocab"]): r["peak_mb"] for r in rows}
    lines = [
        "",
        f"## One window of {rows[0]['window']} tokens, vocabulary widened",
        "",
        f"The same model with its output layer widened to each vocabulary (new rows random), {meta['long_steps']} "
        f"steps on the same window, gradient checkpointing. mass train's loss chunk: "
        f"{meta['loss_chunk'] or 'none (whole-window logits)'}.",
        "",
        "| trainer | " + " | ".join(f"peak MB, vocab {v}" for v in vocabs) + " | growth MB |",
        "|---|" + "---|" * (len(vocabs) + 1),
    ]
    for trainer in dict.fromkeys(r["trainer"] for r in rows):
        vals = [peak[(trainer, v)] for v in vocabs]
        lines.append(f"| {trainer} | " + " | ".join(f"{x:.0f}" for x in vals) + f" | {vals[-1] - vals[0]:.0f} |")
    with open(out / "results.md", "a") as f:
        f.write("\n".join(lines) + "\n")
