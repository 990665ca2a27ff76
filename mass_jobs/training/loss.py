"""Token loss of a window computed in chunks, so full-vocabulary logits never exist for the whole window.

The model's output layer is taken out of the forward pass (`split_head`: the model returns its last
hidden states) and applied here to `chunk` positions at a time; each chunk's logits are recomputed
in the backward pass (activation checkpointing) instead of being kept. Peak logits memory is
chunk x vocabulary instead of window x vocabulary: at a 152k vocabulary, 512 positions take 0.3 GB
in fp32 where a 49,152-token window took 30 GB. The paper's training script does the same with
512-token chunks. Chunks without supervised tokens are skipped. A spec that adapts the LM head
itself (`sft.lora.target_modules` naming it) keeps the head in the model and the full logits
(`logits_loss_sum`).

Used by `mass train`; no command of its own.
"""

from __future__ import annotations

from mass_jobs.steps.render_sft import IGNORE


def split_head(model):
    """Replace the model's output layer by the identity; return the layer's weight (detached, frozen).

    The forward then returns hidden states where it returned logits, and the loss applies the weight
    in chunks. A tied head's weight is copied, so the input embeddings stay as they are."""
    import torch.nn as nn

    head = model.get_output_embeddings()
    if head is None or not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear output layer to apply in chunks")
    if head.bias is not None:
        raise ValueError("the chunked loss supports output layers without bias only")
    weight = head.weight.detach().clone()
    model.set_output_embeddings(nn.Identity())
    return weight


def _chunk_loss(hidden, weight, labels):
    import torch.nn.functional as F

    logits = F.linear(hidden, weight.to(hidden.dtype)).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")


def chunked_loss_sum(hidden, weight, labels, chunk: int = 512):
    """(sum of next-token losses over supervised positions in float32, their count).

    hidden: (batch, T, H) last hidden states; weight: (vocab, H) output layer; labels: (batch, T)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    h = hidden[:, :-1, :].reshape(-1, hidden.size(-1))
    y = labels[:, 1:].reshape(-1)
    supervised = (y != IGNORE).tolist()
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, len(supervised), chunk):
        if any(supervised[start:start + chunk]):
            total = total + checkpoint(_chunk_loss, h[start:start + chunk], weight, y[start:start + chunk],
                                       use_reentrant=False)
    n = sum(supervised)
    if n == 0:  # keep the graph connected: every rank's backward must reach the same parameters
        total = total + hidden.sum().float() * 0.0
    return total, n


def logits_loss_sum(logits, labels):
    """(sum of next-token losses over supervised positions in float32, their count) from full logits."""
    import torch.nn.functional as F

    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    loss = F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return loss, int((shift_labels != IGNORE).sum())
