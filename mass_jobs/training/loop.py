"""The LoRA SFT loop: one window per rank and micro-step, DDP (or FSDP) over ranks, exact resume.

Loss per window = mean over its supervised tokens, computed in `sft.loss_chunk`-token chunks with
the output layer outside the forward pass (training/loss.py); a step's loss = mean over the windows
of the global batch (world size x grad_accum windows), which is what averaged DDP gradients optimise.
Validation runs every `sft.val_every` steps and at the last; checkpoints are saved every
`sft.save_every` steps and at the last, and only those with a validation loss can be selected (the
paper: validation every 150, checkpoints every 50 steps).
FSDP (`parallel="fsdp"`, FSDP2 `fully_shard`, one unit per decoder layer) runs the same math on
sharded parameters; its checkpoints hold the same full adapter as DDP's. Only rank 0 reads the
parent's weights: the other ranks build the model on the meta device and receive its weights, LoRA
init and buffers (DDP's wrap broadcasts them; under FSDP each rank takes its shard of rank 0's state),
so a pod holds one copy of the model in host memory, not one per rank.
Validation loss is token-weighted (sum of token losses / supervised tokens), overall, per role
and per task. Processed supervised tokens are counted per step over every rank's windows.

Run under torchrun by `mass train`; without a process group it trains on one process.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mass_jobs.config.composition import WINDOW_ROLES as ROLES
from mass_jobs.config.composition import composition_of
from mass_jobs.config.run_spec import SftSpec
from mass_jobs.training.checkpoint import (
    adapter_digest,
    check_resumable,
    latest_checkpoint,
    load_adapter_state,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from mass_jobs.training.dist import Dist, autocast, decoder_layers, fsdp_mixed_precision, local_device
from mass_jobs.training.lora import adapted_summary, attach_lora, resolve_targets, trainable_named_parameters
from mass_jobs.training.loss import chunked_loss_sum, logits_loss_sum, split_head
from mass_jobs.training.sampler import WindowSampler
from mass_jobs.training.schedule import lr_at


@dataclass
class TrainResult:
    steps: int
    processed_tokens: int
    checkpoints: list[int]
    val_losses: dict[int, float] = field(default_factory=dict)
    log_path: Path | None = None
    param_share: float = 1.0  # share of the model's parameters this rank holds (1/world under FSDP)
    lora: dict = field(default_factory=dict)  # what the adapter covers (training/lora.py adapted_summary)


class Trainer:
    """setup -> train -> save; one instance per rank."""

    def __init__(
        self,
        parent_dir: Path,
        train_windows: list[dict],
        val_windows: list[dict],
        sft: SftSpec,
        out_dir: Path,
        *,
        parallel: Literal["ddp", "fsdp"] = "ddp",
        on_checkpoint: Callable[[int, Path], None] | None = None,
        progress: bool = True,
        steps: int | None = None,
    ):
        self.parent_dir, self.sft, self.out_dir = Path(parent_dir), sft, Path(out_dir)
        self.train_windows, self.val_windows = train_windows, val_windows
        self.parallel, self.on_checkpoint, self.progress = parallel, on_checkpoint, progress
        self.total_steps = steps or sft.steps
        self.dist = Dist.current()
        self.device = local_device(self.dist)

        self.sampler = WindowSampler(train_windows, composition_of(sft).orchestrator_share, sft.seed)
        self.log_path = self.out_dir / "log.jsonl"
        self.timing_path = self.out_dir / "timing.jsonl"

    # ------------------------------------------------------------ setup
    def setup(self) -> None:
        import torch

        torch.manual_seed(self.sft.seed)  # same LoRA init on every rank (rank 0's is broadcast anyway)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        base = self._load_base(dtype)
        base.config.use_cache = False
        if self.sft.gradient_checkpointing:
            # non-reentrant: works with DDP, with FSDP and with frozen inputs (LoRA leaves embeddings frozen)
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        targets = resolve_targets(base, self.sft.lora)
        # The output layer leaves the forward pass and the loss applies it in chunks (training/loss.py),
        # unless the spec adapts the head itself: then the head stays and the logits are full.
        adapts_head = any(n == "lm_head" or n.endswith(".lm_head") for n in targets.modules)
        self.head_weight = None if adapts_head else self._from_rank0(split_head(base))
        self.peft_model = attach_lora(base, self.sft.lora, targets)
        self.lora_summary = adapted_summary(self.peft_model, targets)
        full = self.peft_model.state_dict() if self.sharded and self.dist.rank == 0 else {}
        if not self.sharded:
            if self.holds_weights:
                self.peft_model.to(self.device)
            else:  # DDP broadcasts rank 0's parameters and buffers as it wraps the model
                self.peft_model.to_empty(device=self.device)
        self.model = self._wrap(self.peft_model)
        if self.sharded:
            self._load_shards(full)
        del full
        params = list(trainable_named_parameters(self.peft_model).values())
        opt = self.sft.optimizer
        self.optimizer = torch.optim.AdamW(
            params,
            lr=lr_at(1, self.total_steps, opt),
            betas=tuple(opt.betas),
            eps=opt.eps,
            weight_decay=opt.weight_decay,
        )
        self.params = params
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in self.model.parameters())
        self.param_share = local / sum(p.numel() for p in self.model.parameters())

    @property
    def sharded(self) -> bool:
        return self.parallel == "fsdp" and self.dist.world > 1

    @property
    def holds_weights(self) -> bool:
        """Only rank 0 reads the parent's weights: every other rank builds the model on the meta device
        and receives them, so a pod of n ranks holds one copy of the model in host memory, not n."""
        return self.dist.rank == 0

    def _load_base(self, dtype):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        if self.holds_weights:
            return AutoModelForCausalLM.from_pretrained(self.parent_dir, dtype=dtype)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.parent_dir), dtype=dtype)

    def _from_rank0(self, tensor):
        """`tensor` on this rank's device with rank 0's values (the others built it on meta)."""
        import torch
        import torch.distributed as dist

        if self.dist.world == 1:
            return tensor.to(self.device)
        out = tensor.to(self.device) if self.holds_weights else torch.empty_like(tensor, device=self.device)
        dist.broadcast(out, src=0)
        return out

    def _load_shards(self, full: dict) -> None:
        """FSDP: the ranks that built the model on meta allocate their shards, every rank takes its
        shard of rank 0's full state, and buffers outside the state dict (rotary frequencies) come
        from rank 0 too."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if not self.holds_weights:
            self.model.to_empty(device=self.device)
        set_model_state_dict(
            self.model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )
        for buffer in self.model.buffers():
            dist.broadcast(buffer, src=0)

    def _wrap(self, model):
        if self.dist.world == 1:
            return model
        if self.sharded:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(self.device.type, (self.dist.world,))
            policy = fsdp_mixed_precision(self.device)
            # One unit per decoder layer, so only one layer's full weights exist at a time; the root
            # unit takes the rest (embeddings, final norm, a tied LM head together with its embedding).
            for layer in decoder_layers(model):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            return fully_shard(model, mesh=mesh, mp_policy=policy)
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DDP(model, device_ids=ids)

    # ------------------------------------------------------------ state
    def _adapter_state(self) -> dict:
        from peft import get_peft_model_state_dict

        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            # Every rank gathers the full LoRA tensors (small); the frozen parent stays sharded.
            full = get_model_state_dict(
                self.model, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
            )
            return get_peft_model_state_dict(self.peft_model, state_dict=full, save_embedding_layers=False)
        # LoRA never changes the (frozen) embeddings, even when it adapts a tied LM head
        return get_peft_model_state_dict(self.peft_model, save_embedding_layers=False)

    def _optimizer_state(self) -> dict:
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            # The full state keyed by parameter name, on rank 0 (the only rank that writes it).
            return get_optimizer_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        return self.optimizer.state_dict()

    def resume(self) -> tuple[int, int]:
        """Restore the latest complete checkpoint in out_dir; returns (step, processed tokens)."""
        import torch
        from peft import set_peft_model_state_dict

        path = latest_checkpoint(self.out_dir)
        steps = self.dist.gather(int(path.name[5:]) if path else 0)
        if len(set(steps)) != 1:  # they would wait on each other's collectives for ever
            raise ValueError(
                f"ranks would resume from different checkpoints (steps by rank: {steps}); "
                "each must hold the newest stored one"
            )
        if path is None:
            return 0, 0
        meta = read_checkpoint(path)
        check_resumable(path, meta, self.dist.world, self.sft.grad_accum, self.sampler.fingerprint, self.parallel)
        adapter = load_adapter_state(path)
        if self.sharded:
            from torch.distributed.tensor.experimental import implicit_replication

            with implicit_replication():  # the full tensors count as replicated: each rank keeps its shard
                set_peft_model_state_dict(self.peft_model, adapter)
        else:
            set_peft_model_state_dict(self.peft_model, adapter)
        opt_state = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=False)
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(
                self.model, self.optimizer, opt_state, options=StateDictOptions(full_state_dict=True)
            )
        else:
            self.optimizer.load_state_dict(opt_state)
        set_rng_state(torch.load(path / "rng.pt", weights_only=False)[self.dist.rank])
        if self.dist.rank == 0 and self.log_path.exists():
            # Lines a killed run wrote after its last checkpoint are replayed, so drop them.
            kept = [
                ln for ln in self.log_path.read_text().splitlines() if ln and json.loads(ln)["step"] <= meta["step"]
            ]
            self.log_path.write_text("".join(ln + "\n" for ln in kept))
        self.dist.barrier()
        return meta["step"], meta["processed_tokens"]

    def save(self, step: int, processed: int, val_loss: float | None) -> None:
        rngs = self.dist.gather(rng_state())
        adapter, opt_state = self._adapter_state(), self._optimizer_state()
        # Every rank's digest of its own adapter: replicas that drifted apart are a bug, caught here.
        digests = self.dist.gather(adapter_digest(adapter))
        if self.dist.rank == 0:
            if len(set(digests)) != 1:
                raise RuntimeError(f"step {step}: data-parallel ranks hold different adapters: {digests}")
            meta = {
                "adapter_sha256_by_rank": digests,
                "processed_tokens": processed,
                "val_loss": val_loss,
                "world_size": self.dist.world,
                "grad_accum": self.sft.grad_accum,
                "total_steps": self.total_steps,
                "parallel": self.parallel,
                "sampler": self.sampler.state(),
                "lora": self.sft.lora.model_dump(),
                "optimizer": self.sft.optimizer.model_dump(),
                "lr": lr_at(step, self.total_steps, self.sft.optimizer),
            }
            path = save_checkpoint(self.out_dir, step, self.peft_model, adapter, opt_state, rngs, meta)
            if self.on_checkpoint:
                self.on_checkpoint(step, path)
        self.dist.barrier()

    # ------------------------------------------------------------ loop
    def _batch(self, window: dict):
        import torch

        ids = torch.tensor([window["input_ids"]], dtype=torch.long, device=self.device)
        labels = torch.tensor([window["labels"]], dtype=torch.long, device=self.device)
        return ids, labels

    def window_loss(self, window: dict):
        """(summed token loss of one window, its supervised tokens), through the wrapped model."""
        ids, labels = self._batch(window)
        out = self.model(input_ids=ids).logits  # last hidden states when the head was split off
        if self.head_weight is None:
            return logits_loss_sum(out, labels)
        return chunked_loss_sum(out, self.head_weight, labels, self.sft.loss_chunk, labels_host=window["labels"])

    def validate(self) -> dict:
        import torch

        self.model.eval()
        tasks = sorted({str(w["task"]) for w in self.val_windows})
        keys = ["all"] + [f"role:{r}" for r in ROLES] + [f"task:{t}" for t in tasks]
        sums = [0.0] * (2 * len(keys))
        mine = self.val_windows[self.dist.rank :: self.dist.world]
        # FSDP gathers weights collectively in every forward, so all ranks run as many forwards;
        # a rank short of windows repeats one and discards its loss.
        rounds = -(-len(self.val_windows) // self.dist.world) if self.sharded else len(mine)
        with torch.no_grad(), autocast(self.device):
            for i in range(rounds):
                w = mine[i] if i < len(mine) else self.val_windows[0]
                loss, n = self.window_loss(w)
                if i >= len(mine):
                    continue
                for key in ("all", f"role:{w['role']}", f"task:{w['task']}"):
                    k = keys.index(key)
                    sums[2 * k] += float(loss)
                    sums[2 * k + 1] += n
        sums = self.dist.all_sum(sums, self.device)
        self.model.train()
        mean = {k: (sums[2 * i] / sums[2 * i + 1] if sums[2 * i + 1] else None) for i, k in enumerate(keys)}
        return {
            "val_loss": mean["all"],
            "val_tokens": int(sums[1]),
            "val_by_role": {r: mean[f"role:{r}"] for r in ROLES if mean[f"role:{r}"] is not None},
            "val_by_task": {t: mean[f"task:{t}"] for t in tasks},
        }

    def _log(self, record: dict, console) -> None:
        if self.dist.rank != 0:
            return
        timing = {k: record[k] for k in TIMING_FIELDS if k in record}
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({k: v for k, v in record.items() if k not in timing}, sort_keys=True) + "\n")
        if timing:  # wall-clock numbers differ run to run: never in the hashed log
            with open(self.timing_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": record["step"], **timing}, sort_keys=True) + "\n")
        if console is not None:
            if record["kind"] == "train":
                console.print(
                    f"step {record['step']}/{self.total_steps} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                    f"tokens {record['tokens']} ({record['tokens_per_s']:.0f}/s) processed {record['processed_tokens']}"
                )
            else:
                console.print(f"[bold]val[/bold] step {record['step']} loss {record['val_loss']:.4f}")

    def _grad_sync(self, sync: bool):
        """Reduce gradients over ranks only on a step's last micro-step (the others accumulate locally)."""
        if self.sharded:
            self.model.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        if sync or not hasattr(self.model, "no_sync"):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def _optimise(self, step: int) -> tuple[float, object, object, object]:
        """One optimiser step over `grad_accum` windows per rank: (lr, summed loss, tokens, grad norm)."""
        import torch

        accum = self.sft.grad_accum
        lr = lr_at(step, self.total_steps, self.sft.optimizer)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        losses, tokens = [], 0  # the losses stay on the device: one host sync per step, at the sum
        for micro in range(accum):
            window = self.train_windows[self.sampler.draw(step, self.dist.rank, micro)]
            with self._grad_sync(micro == accum - 1), autocast(self.device):
                loss, n = self.window_loss(window)
                loss = loss / max(n, 1)
            (loss / accum).backward()
            losses.append(loss.detach())
            tokens += n
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.sft.optimizer.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, tokens_total = self.dist.all_sum([torch.stack(losses).double().sum(), tokens], self.device)
        return lr, loss_total, tokens_total, grad_norm

    def train(self, resume: bool = False) -> TrainResult:

        self.out_dir.mkdir(parents=True, exist_ok=True)
        console = None
        if self.progress and self.dist.rank == 0:
            from rich.console import Console

            console = Console(stderr=True)
        start, processed = self.resume() if resume else (0, 0)
        if start == 0 and self.dist.rank == 0:
            self.log_path.write_text("")
            self.timing_path.write_text("")
        val_steps = {self.total_steps} | set(range(self.sft.val_every, self.total_steps + 1, self.sft.val_every))
        save_steps = {self.total_steps} | set(range(self.sft.save_every, self.total_steps + 1, self.sft.save_every))
        result = TrainResult(
            steps=self.total_steps,
            processed_tokens=processed,
            checkpoints=[],
            log_path=self.log_path,
            param_share=self.param_share,
            lora=self.lora_summary,
        )
        if start == 0:
            v = self.validate()
            self._log({"kind": "val", "step": 0, **v}, console)
            result.val_losses[0] = v["val_loss"]
        self.model.train()
        accum = self.sft.grad_accum
        for step in range(start + 1, self.total_steps + 1):
            t0 = time.perf_counter()
            lr, loss_total, tokens_total, grad_norm = self._optimise(step)
            processed += int(tokens_total)
            elapsed = time.perf_counter() - t0
            self._log(
                {
                    "kind": "train",
                    "step": step,
                    "loss": loss_total / (self.dist.world * accum),
                    "lr": lr,
                    "tokens": int(tokens_total),
                    "processed_tokens": processed,
                    "grad_norm": float(grad_norm),
                    "step_s": elapsed,
                    "tokens_per_s": tokens_total / elapsed if elapsed > 0 else 0.0,
                },
                console,
            )
            val_loss = None
            if step in val_steps:  # a checkpoint saved between validations has no val loss: not selectable
                v = self.validate()
                val_loss = v["val_loss"]
                result.val_losses[step] = val_loss
                self._log({"kind": "val", "step": step, **v}, console)
            if step in save_steps:
                self.save(step, processed, val_loss)
                result.checkpoints.append(step)
        result.processed_tokens = processed
        return result


TIMING_FIELDS = ("step_s", "tokens_per_s")  # written to timing.jsonl, not log.jsonl


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)
