"""Token loss of a window computed in chunks, so full-vocabulary logits never exist for the whole window.

The model's output layer is taken out of the forward pass (`split_head`: the model returns its last
hidden states) and applied here to `chunk` positions at a time. The loss is fused with its gradient:
while a chunk's logits exist, the gradient with respect to the hidden states (and to the head, when
it trains) is computed from them (softmax minus the one-hot target) and kept, and the logits are
dropped. The backward pass only scales what was kept, so the head's matmul and the softmax run once
per chunk instead of again in a recompute (the approach of Liger's fused linear cross-entropy and of
Cut Cross-Entropy). Peak logits memory is chunk x vocabulary instead of window x vocabulary: at a
152k vocabulary, 512 positions take 0.3 GB in fp32 where a 49,152-token window took 30 GB. The
paper's training script also uses 512-token chunks. Chunks without supervised tokens are skipped,
decided from the labels on the host so that no step waits on the device. A spec that adapts the LM
head itself (`sft.lora.target_modules` naming it) keeps the head in the model and the full logits
(`logits_loss_sum`).

Used by `mass train`; no command of its own.
"""

from __future__ import annotations

IGNORE = -100  # label of a position that carries no loss (the value torch's cross entropy skips)


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


def _fused_function():
    """The autograd Function, built on first use (this package imports torch inside functions)."""
    import torch

    class FusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, weight, y, chunks):
            want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.zeros_like(h) if want_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
            w = weight.to(h.dtype)
            # One fp32 chunk x vocab buffer for the whole window: every chunk's logits, softmax and
            # gradient live in it, so the allocator never holds two of them.
            buf = torch.empty(
                max((e - s for s, e in chunks), default=0), weight.size(0), dtype=torch.float32, device=h.device
            )
            for start, end in chunks:
                hc, yc = h[start:end], y[start:end]
                logits = buf[: end - start]
                if w.dtype == torch.float32:
                    torch.mm(hc, w.t(), out=logits)
                else:  # bf16 on GPU: the head's output, then fp32 for the softmax
                    logits.copy_(hc @ w.t())
                valid = yc != IGNORE
                target = yc.clamp(min=0)
                rows = torch.arange(len(yc), device=yc.device)
                picked = logits[rows, target]
                top = logits.amax(dim=-1, keepdim=True)
                probs = logits.sub_(top).exp_()  # softmax in the logits' own memory: one chunk x vocab tensor
                norm = probs.sum(dim=-1)
                total += torch.where(valid, norm.log() + top.squeeze(1) - picked, 0.0).sum()
                if want_h or want_w:
                    probs.div_(norm[:, None])
                    probs[rows, target] -= 1.0
                    probs *= valid[:, None]
                    if want_h:
                        grad_h[start:end] = probs.to(w.dtype) @ w
                    if want_w:
                        grad_w += probs.t() @ hc.float()
            ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
            ctx.wants, ctx.weight_dtype = (want_h, want_w), weight.dtype
            return total

        @staticmethod
        def backward(ctx, grad_out):
            saved = list(ctx.saved_tensors)
            grad_h = saved.pop(0) * grad_out if ctx.wants[0] else None
            grad_w = (saved.pop(0) * grad_out).to(ctx.weight_dtype) if ctx.wants[1] else None
            return grad_h, grad_w, None, None

    return FusedLinearCrossEntropy


_FUSED = []


def chunked_loss_sum(hidden, weight, labels, chunk: int = 512, labels_host: list[int] | None = None):
    """(sum of next-token losses over supervised positions in float32, their count).

    hidden: (batch, T, H) last hidden states; weight: (vocab, H) output layer; labels: (batch, T).
    `labels_host`: the same labels as a list (batch 1), so that choosing chunks needs no device sync."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if not _FUSED:
        _FUSED.append(_fused_function())
    h = hidden[:, :-1, :].reshape(-1, hidden.size(-1))
    y = labels[:, 1:].reshape(-1)
    flat = labels_host[1:] if labels_host is not None and labels.size(0) == 1 else y.tolist()
    chunks = [
        (s, min(s + chunk, len(flat)))
        for s in range(0, len(flat), chunk)
        if any(t != IGNORE for t in flat[s : s + chunk])
    ]
    n = sum(t != IGNORE for t in flat)
    total = _FUSED[0].apply(h, weight, y, chunks)
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
