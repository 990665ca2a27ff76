"""Training checkpoints: adapter, optimizer, RNG of every rank and a manifest, written atomically.

A checkpoint dir `step-<n>/` holds:
  adapter_model.safetensors, adapter_config.json   the full LoRA (peft format, loadable by PeftModel), DDP or FSDP
  optimizer.pt                                     AdamW state: DDP's (identical on every rank, keyed by
                                                   position) or FSDP's gathered full state (keyed by name)
  rng.pt                                           torch/python RNG state of every rank
  checkpoint.json                                  schemas/checkpoint-manifest.schema.json, written last
A directory without checkpoint.json is incomplete and never resumed from.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

MANIFEST = "checkpoint.json"


def step_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / f"step-{step}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict:
    import torch

    # Only the generators training draws from (dropout): the window order comes from the sampler's
    # own seeded Random, and the global `random` state depends on whatever else ran in the process
    # (S3 clients, tempfile), so keeping it would make checkpoints differ between executors.
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(
    out_dir: Path,
    step: int,
    adapter_model,
    adapter_state: dict,
    optimizer_state: dict,
    rng_states: list[dict],
    meta: dict,
) -> Path:
    """Write step-<n>/ beside its final place, then rename (called on rank 0 only)."""
    import torch
    from safetensors.torch import save_file

    final = step_dir(out_dir, step)
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in adapter_state.items()}, tmp / "adapter_model.safetensors")
    # Byte-identical for one spec on any executor: no local base path (merge names its base itself)
    # and sets (target modules) in sorted order, not the process's hash-seed order.
    config = copy.copy(adapter_model.peft_config["default"])
    config.base_model_name_or_path = None
    for name, value in vars(config).items():
        if isinstance(value, set):
            setattr(config, name, sorted(value))
    config.save_pretrained(tmp)
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(rng_states, tmp / "rng.pt")
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
    (tmp / MANIFEST).write_text(json.dumps({**meta, "step": step, "files": files}, indent=2, sort_keys=True))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def read_checkpoint(path: Path) -> dict:
    """The manifest of a complete checkpoint; raises ValueError when a file does not match its hash."""
    path = Path(path)
    meta = json.loads((path / MANIFEST).read_text())
    for name, digest in meta["files"].items():
        if _sha256(path / name) != digest:
            raise ValueError(f"checkpoint {path}: {name} does not match its sha256 in {MANIFEST}")
    return meta


def latest_checkpoint(out_dir: Path) -> Path | None:
    done = [p for p in Path(out_dir).glob("step-*") if (p / MANIFEST).exists() and p.name[5:].isdigit()]
    return max(done, key=lambda p: int(p.name[5:]), default=None)


def load_adapter_state(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(Path(path) / "adapter_model.safetensors")


def check_resumable(path: Path, meta: dict, world: int, grad_accum: int, fingerprint: str, parallel: str) -> None:
    """A checkpoint resumes exactly only in the run that wrote it: the same world and accumulation,
    the same windows, the same parallel mode (ValueError naming what differs)."""
    if meta["world_size"] != world or meta["grad_accum"] != grad_accum:
        raise ValueError(
            f"checkpoint {path.name} was written by world_size={meta['world_size']} grad_accum="
            f"{meta['grad_accum']}; this run has {world}/{grad_accum}: exact resume needs the same"
        )
    if meta["sampler"]["fingerprint"] != fingerprint:
        raise ValueError(f"checkpoint {path.name} was trained on other windows (sampler fingerprint differs)")
    if meta["parallel"] != parallel:
        raise ValueError(
            f"checkpoint {path.name} was written with sft.parallel {meta['parallel']}, this run uses "
            f"{parallel}: their optimizer states differ in layout, resume with the same"
        )


def adapter_digest(state: dict) -> str:
    """sha256 over the adapter tensors' names and raw bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
