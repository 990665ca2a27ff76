"""Run under torchrun: set a Trainer up on every rank and write what each rank holds afterwards.

argv: SPEC PARALLEL OUT_DIR. Writes OUT_DIR/rank-<r>.json: whether the rank read the parent's
weights, and a digest of the full model (every parameter, LoRA included, and every buffer, gathered
whole under FSDP) and of the output layer's weight.
"""

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def digest(named) -> str:
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda x: x[0]):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def state_digest(trainer) -> tuple[str, str]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if trainer.sharded:
        params = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True)).items()
    else:
        params = trainer.peft_model.state_dict().items()
    return digest(params), digest(trainer.peft_model.named_buffers())


def main() -> None:
    from mass_jobs.spec.load import load_spec
    from mass_jobs.training.loop import Trainer

    spec, parallel, out = load_spec(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    window = {
        "task": "a",
        "role": "orchestrator",
        "input_ids": [21, 22, 23, 24],
        "labels": [-100, -100, 23, 24],
        "n_supervised": 2,
    }  # the sampler needs one; setup never reads it
    trainer = Trainer(
        spec.model.base, [window], [], spec.sft, out / f"work-{dist.get_rank()}", parallel=parallel, progress=False
    )
    trainer.setup()
    params, buffers = state_digest(trainer)
    (out / f"rank-{dist.get_rank()}.json").write_text(
        json.dumps(
            {
                "read_weights": trainer.holds_weights,
                "params": params,
                "buffers": buffers,
                "head": digest([("head", trainer.head_weight)]),
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
