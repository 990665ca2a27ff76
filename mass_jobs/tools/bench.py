"""Benchmark `mass train` against TRL's SFTTrainer on the same model, windows, masks and hardware.

Both trainers see the same window sequence (the MASS sampler's draws), the same LoRA, AdamW
betas, warmup + cosine to the same floor, gradient clip and gradient checkpointing, one window
per step. Each side runs in its own process so peak memory (CPU: max RSS; GPU: max allocated)
is its own. Reported: supervised tokens/s (per GPU on a GPU host), peak memory, model FLOPs
utilisation on a GPU of known peak, the loss per step and how far it fell.

The windows can be learned: each is the last `--window-tokens` tokens of a harness conversation
from the warm-up corpus (`tiny.warm_corpus.warm_corpus`: the four roles' system prompts, tools, tool calls
and results, rendered and masked with the model's own template). The model is the tiny model
with its tied embedding scaled by `EMBED_SCALE`: at the stock 0.02 init a frozen random head spans
about 2.5 nats of logits, so no adapter can move the loss far; scaled, LoRA alone takes the loss
down by half within the bench's steps.

A second table trains one long window (`--long-window`, 8,192 tokens by default) on the same model
with its vocabulary widened (`--vocabs`): with the chunked loss (`sft.loss_chunk`) mass train's
peak stays flat in the vocabulary, while full-window logits grow with window x vocabulary.
`--profile` adds `profile.md`: each trainer's top ops by self time under `torch.profiler`.

Run: `make bench` (= `python -m mass_jobs.tools.bench --out bench/`); not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mass_jobs.config.run_spec import LoraSpec, OptimizerSpec, SftSpec
from mass_jobs.tiny.build import build_tiny_model, build_tokenizer
from mass_jobs.tiny.warm import encode
from mass_jobs.tiny.warm_corpus import warm_corpus
from mass_jobs.tools.bench_report import write_long_rows, write_profile, write_results
from mass_jobs.training.loop import Trainer
from mass_jobs.training.sampler import WindowSampler

LORA = {"r": 16, "alpha": 32, "dropout": 0.0}
OPT = {"lr": 1e-3, "warmup_steps": 5, "min_lr_ratio": 0.1}
EMBED_SCALE = 3.0
# Dense bf16 peak of the GPUs the bench knows, for model FLOPs utilisation (vendor datasheets).


def corpus_windows(n: int, length: int, seed: int) -> list[dict]:
    """`n` windows: the last `length` tokens of warm-corpus conversations, their template's masks."""

    roles = ("orchestrator", "orchestrator", "worker", "auxiliary", "auxiliary")  # warm_corpus's order
    examples = encode(build_tokenizer(), warm_corpus(seed, per_kind=-(-n // len(roles))))[:n]
    out = []
    for i, (ids, labels) in enumerate(examples):
        ids, labels = ids[-length:], labels[-length:]
        out.append(
            {
                "task": f"t{i % 3}",
                "role": roles[i % len(roles)],
                "input_ids": ids,
                "labels": labels,
                "n_supervised": sum(1 for x in labels[1:] if x != -100),
            }
        )
    return out


def bench_model(out: Path) -> Path:
    """The tiny model (seed 0) with its tied embedding scaled by EMBED_SCALE (see the docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = build_tiny_model(out / "tiny", seed=0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMBED_SCALE)
    model.save_pretrained(out / "bench")
    AutoTokenizer.from_pretrained(base).save_pretrained(out / "bench")
    return out / "bench"


def model_flops_per_token(model_dir: Path, window: int) -> float:
    """Model FLOPs per processed token of a LoRA step. Linear layers and the head: 2 x parameters
    forward and the same again backward for the input gradient (frozen weights get none; the
    adapters' own are negligible). Causal attention: 2 x layers x window x query width forward and
    twice that backward. Checkpointing's recompute is not counted (MFU counts model work only)."""
    import json as _json

    cfg = _json.loads((Path(model_dir) / "config.json").read_text())
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]  # noqa: E741
    q = cfg["num_attention_heads"] * cfg.get("head_dim", H // cfg["num_attention_heads"])
    kv = cfg["num_key_value_heads"] * cfg.get("head_dim", H // cfg["num_attention_heads"])
    linear = L * (H * q + 2 * H * kv + q * H + 3 * H * I)
    return 2 * 2 * (linear + H * V) + 3 * 2 * L * window * q


def make_windows(n: int, length: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(20, 5900) for _ in range(length)]
        header = rng.randrange(length // 4, length // 2)
        out.append(
            {
                "task": f"t{i % 3}",
                "role": ("orchestrator", "worker", "auxiliary")[i % 3],
                "input_ids": ids,
                "labels": [-100] * header + ids[header:],
                "n_supervised": length - header,
            }
        )
    return out


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _peak_memory_mb(device) -> float:
    import resource

    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_mass(model_dir: Path, windows: list[dict], steps: int, out: Path) -> dict:
    import torch

    sft = SftSpec(
        window=max(4096, *(len(w["input_ids"]) for w in windows)),
        context=0,
        steps=steps,
        val_every=10**6,
        save_every=10**6,
        seed=0,
        gradient_checkpointing=True,
        lora=LoraSpec(**LORA),
        optimizer=OptimizerSpec(**OPT),
    )
    trainer = Trainer(model_dir, windows, windows[:1], sft, out, progress=False)
    trainer.setup()
    t0 = time.perf_counter()
    with _maybe_profile() as prof:
        result = trainer.train()
    wall = time.perf_counter() - t0
    prof.write()
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return {
        "losses": [r["loss"] for r in log if r["kind"] == "train"],
        "tokens": result.processed_tokens,
        "wall_s": wall,
        "peak_mb": _peak_memory_mb("cuda" if torch.cuda.is_available() else "cpu"),
        "processed_tokens": sum(len(windows[trainer.sampler.draw(s, 0)]["input_ids"]) for s in range(1, steps + 1)),
    }


def _trl_config(out: Path, steps: int):
    """(SFTConfig, LoraConfig) of the TRL baseline: the same recipe as mass train's (LORA, OPT)."""
    import torch
    from peft import LoraConfig
    from trl import SFTConfig

    cfg = SFTConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=1,
        learning_rate=OPT["lr"],
        adam_beta1=0.9,
        adam_beta2=0.95,
        weight_decay=0.0,
        max_grad_norm=1.0,
        warmup_steps=OPT["warmup_steps"],
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": OPT["min_lr_ratio"]},
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        completion_only_loss=True,
        max_length=None,
        gradient_checkpointing=True,
        bf16=torch.cuda.is_available(),
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    lora = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=LORA["dropout"],
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    return cfg, lora


def run_trl(model_dir: Path, windows: list[dict], steps: int, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTTrainer

    sampler = WindowSampler(windows, SftSpec().orchestrator_share, seed=0)
    drawn = [windows[sampler.draw(s, 0)] for s in range(1, steps + 1)]  # the exact sequence mass train sees
    data = Dataset.from_list(
        [{"input_ids": w["input_ids"], "completion_mask": [int(x != -100) for x in w["labels"]]} for w in drawn]
    )
    losses: list[float] = []

    class Losses(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    class InOrder(SFTTrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    cfg, lora = _trl_config(out, steps)
    trainer = InOrder(
        model=model,
        args=cfg,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=lora,
        callbacks=[Losses()],
    )
    t0 = time.perf_counter()
    with _maybe_profile() as prof:
        trainer.train()
    wall = time.perf_counter() - t0
    prof.write()
    tokens = sum(sum(w["completion_mask"][1:]) for w in data)
    return {
        "losses": losses,
        "tokens": tokens,
        "wall_s": wall,
        "peak_mb": _peak_memory_mb("cuda" if torch.cuda.is_available() else "cpu"),
        "processed_tokens": sum(len(w["input_ids"]) for w in data),
    }


class _maybe_profile:
    """torch.profiler around a trainer's run when MASS_BENCH_PROFILE names a file (--profile)."""

    def __init__(self):
        import os

        self.target = os.environ.get("MASS_BENCH_PROFILE")
        self.prof = None

    def __enter__(self):
        if self.target:
            import torch
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=acts)
            self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self.prof is not None:
            self.prof.__exit__(*exc)
        return False

    def write(self) -> None:
        if self.prof is not None:
            table = self.prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=48
            )
            Path(self.target).write_text(table)


def _child(args) -> int:
    windows = json.loads(Path(args.windows_file).read_text())
    fn = run_mass if args.child == "mass" else run_trl
    res = fn(Path(args.model), windows, args.steps, Path(args.scratch))
    Path(args.result).write_text(json.dumps(res))
    return 0


def widen_vocab(model_dir: Path, vocab: int, out: Path) -> Path:
    """The same model and tokenizer with `vocab` output rows (new rows random): a bigger head only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def run_pair(model: str, windows_path: Path, steps: int, tmp: Path, tag: str, profile: bool = False) -> dict:
    """Both trainers, each in its own process (its own peak memory), on the same windows."""
    import os

    results = {}
    for label, child in (("mass train", "mass"), ("trl SFTTrainer", "trl")):
        res = tmp / f"{child}-{tag}.json"
        env = {**os.environ, **({"MASS_BENCH_PROFILE": str(tmp / f"profile-{child}.txt")} if profile else {})}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "mass_jobs.tools.bench",
                "--child",
                child,
                "--model",
                model,
                "--windows-file",
                str(windows_path),
                "--steps",
                str(steps),
                "--scratch",
                str(tmp / f"scratch-{child}-{tag}"),
                "--result",
                str(res),
            ],
            check=True,
            env=env,
        )
        results[label] = json.loads(res.read_text())
        if profile:
            results[label]["profile"] = (tmp / f"profile-{child}.txt").read_text()
    return results


def long_window_rows(model: str, window: int, vocabs: list[int], steps: int, tmp: Path) -> list[dict]:
    path = tmp / "long-windows.json"
    path.write_text(json.dumps(make_windows(2, window, seed=1)))
    rows = []
    for v in vocabs:
        wide = str(widen_vocab(Path(model), v, tmp / f"model-v{v}"))
        for label, r in run_pair(wide, path, steps, tmp, f"v{v}").items():
            rows.append(
                {
                    "trainer": label,
                    "vocab": v,
                    "window": window,
                    "peak_mb": r["peak_mb"],
                    "tokens": r["tokens"],
                    "wall_s": r["wall_s"],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/")
    p.add_argument("--model", help="model dir (default: the bench model, built in a temp dir)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--windows", type=int, default=24)
    p.add_argument("--window-tokens", type=int, default=512)
    p.add_argument("--long-window", type=int, default=8192, help="tokens of the long-window row (0: skip it)")
    p.add_argument("--vocabs", default="6000,24000", help="vocabulary sizes of the long-window row")
    p.add_argument("--long-steps", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="also profile both trainers (profile.md)")
    p.add_argument("--child", choices=["mass", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--windows-file", help=argparse.SUPPRESS)
    p.add_argument("--scratch", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args)
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model or str(bench_model(tmp / "model"))
        windows_path = tmp / "windows.json"
        windows_path.write_text(json.dumps(corpus_windows(args.windows, args.window_tokens, seed=7)))
        meta = {
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "device_name": _device_name(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "steps": args.steps,
            "windows": args.windows,
            "window_tokens": args.window_tokens,
            "long_steps": args.long_steps,
            "loss_chunk": SftSpec().loss_chunk,
            "flops_per_token": model_flops_per_token(Path(model), args.window_tokens),
            "recipe": {"lora": LORA, "optimizer": OPT, "embed_scale": EMBED_SCALE},  # what both trainers ran
        }
        results = run_pair(model, windows_path, args.steps, tmp, "short")
        if args.profile:
            write_profile(
                Path(args.out), run_pair(model, windows_path, args.steps, tmp, "profiled", profile=True), meta
            )
        vocabs = [int(v) for v in args.vocabs.split(",")]
        long_rows = long_window_rows(model, args.long_window, vocabs, args.long_steps, tmp) if args.long_window else []
    write_results(Path(args.out), results, meta)
    if long_rows:
        write_long_rows(Path(args.out), long_rows, meta)
    print((Path(args.out) / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
