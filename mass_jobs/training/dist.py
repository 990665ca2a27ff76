"""Where a training rank runs: its place in the process group, its device, and the precision FSDP
and autocast use there (the same on one process, under torchrun, and in a PyTorchJob's pods)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def current(cls) -> Dist:
        import os

        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))

    def all_sum(self, values: list[float], device) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values])
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()

    def gather(self, obj) -> list:
        import torch.distributed as dist

        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            dist.barrier()


def local_device(dist_info: Dist):
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(dist_info.local_rank)
        return torch.device("cuda", dist_info.local_rank)
    if dist_info.world > 1:
        # One intra-op thread per rank, as torchrun gives processes sharing a node: a CPU kernel's
        # sums depend on its thread count, so every launcher (torchrun's several processes, or a
        # PyTorchJob's pods of one each) must agree for replicas to train the same weights.
        torch.set_num_threads(1)
    return torch.device("cpu")


def fsdp_mixed_precision(device):
    """FSDP's precision, matching the DDP path: on GPU bf16 compute (what autocast does there) with
    gradients reduced and kept in fp32 like DDP's fp32 LoRA grads; on CPU everything stays fp32."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def decoder_layers(model) -> list:
    """The transformer blocks, FSDP's units: modules of the classes the model declares unsplittable."""
    names = set(getattr(model.get_base_model(), "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"FSDP found no decoder layers to shard: the model's _no_split_modules is {sorted(names)}")
    return layers


def autocast(device):
    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()  # CPU trains in fp32: bf16 on CPU is slow and lossy
