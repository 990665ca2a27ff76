"""The chunked token loss equals the full-logits loss, in value and gradients, keeps no
window x vocabulary tensor for the backward pass and never applies the head in it.

Tolerances (float32 throughout, CPU): losses to a relative 1e-6; gradients to an absolute 1e-5
where they reach 5 (measured differences up to 2.2e-6: the order of summation is the only
difference); the model's adapter gradients to 1e-6 + 1e-5 relative.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mass_jobs.config.run_spec import LoraSpec, OptimizerSpec, SftSpec
from mass_jobs.training.loop import Trainer
from mass_jobs.training.lora import attach_lora, resolve_targets
from mass_jobs.training.loss import chunked_loss_sum, split_head
from tests.fixtures.training_data import synthetic_windows

IGNORE = -100


def full_loss_sum(hidden, weight, labels):
    """The reference: logits for every position at once, then one cross-entropy."""
    logits = F.linear(hidden[:, :-1], weight).float()
    y = labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE, reduction="sum")


def random_case(seed, T=300, H=32, V=1000):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, T, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H**0.5
    labels = torch.randint(0, V, (1, T), generator=g)
    labels[0, : T // 3] = IGNORE  # a masked prompt, then supervised tokens with masked tool outputs
    labels[0, 2 * T // 3 : 2 * T // 3 + 40] = IGNORE
    return hidden, weight, labels


@pytest.mark.parametrize("chunk", [1, 7, 64, 299, 512])
def test_chunked_equals_full_loss_and_gradient(chunk):
    hidden, weight, labels = random_case(chunk)
    h_full = hidden.clone().requires_grad_()
    w_full = weight.clone().requires_grad_()
    ref = full_loss_sum(h_full, w_full, labels)
    ref.backward()
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    loss, n = chunked_loss_sum(h, w, labels, chunk)
    loss.backward()
    assert n == int((labels[:, 1:] != IGNORE).sum()) == 160
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(h.grad, h_full.grad, atol=1e-5, rtol=0)
    assert torch.allclose(w.grad, w_full.grad, atol=1e-5, rtol=0)
    assert h.grad[0, : 300 // 3 - 1].abs().max() == 0  # positions predicting masked tokens get no gradient


def saved_for_backward(fn):
    """The largest tensor (elements) autograd keeps for the backward pass while fn runs."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def test_no_window_by_vocabulary_tensor_is_kept():
    hidden, weight, labels = random_case(0, T=2048, V=4000)
    h = hidden.requires_grad_()
    T, V = 2048, 4000
    full = saved_for_backward(lambda: full_loss_sum(h, weight, labels))
    chunked = saved_for_backward(lambda: chunked_loss_sum(h, weight, labels, 512))
    assert full >= (T - 1) * V  # the full loss keeps the logits of the whole window (the test can fail)
    assert chunked <= max(V * 32, T * 32)  # chunked keeps its inputs only: hidden and weight, no logits


def vocabulary_wide_ops(fn, V):
    """Names of the ops run by fn whose output has a dimension of the vocabulary's size."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(isinstance(t, torch.Tensor) and V in t.shape for t in torch.utils._pytree.tree_leaves(out)):
                seen.append(str(func))
            return out

    with Log():
        fn()
    return seen


def test_the_backward_pass_never_applies_the_head_again():
    """The gradient is made while the chunk's logits exist: backward only scales it (no recompute)."""
    hidden, weight, labels = random_case(2, T=600, V=3001)
    h = hidden.requires_grad_()
    loss, _ = chunked_loss_sum(h, weight, labels, 128, labels_host=labels[0].tolist())
    assert vocabulary_wide_ops(loss.backward, 3001) == []
    assert h.grad.abs().max() > 0
    ref_h = hidden.detach().clone().requires_grad_()  # the check can fail: full logits do apply it again
    ref = full_loss_sum(ref_h, weight, labels)
    assert vocabulary_wide_ops(ref.backward, 3001) != []
    assert torch.allclose(h.grad, ref_h.grad, atol=1e-5, rtol=0)


def test_window_without_supervised_tokens_still_reaches_every_parameter():
    hidden, weight, labels = random_case(1)
    labels[:] = IGNORE
    h = hidden.requires_grad_()
    loss, n = chunked_loss_sum(h, weight, labels, 64)
    loss.backward()
    assert n == 0 and loss.item() == 0.0 and h.grad is not None and h.grad.abs().max() == 0
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_loss_sum(h, weight, labels, 0)


def test_trainer_loss_and_lora_gradients_equal_the_full_logits_model(tiny_model_dir, tmp_path):
    """Through the trainer (output layer split off, chunks of 48 tokens) and through the untouched
    model with the same LoRA (full logits): the same window loss and the same adapter gradients."""
    from transformers import AutoModelForCausalLM

    lora = LoraSpec(r=4, alpha=8, dropout=0.0)
    sft = SftSpec(
        window=256,
        context=0,
        steps=1,
        loss_chunk=48,
        gradient_checkpointing=False,
        seed=3,
        lora=lora,
        optimizer=OptimizerSpec(lr=1e-3, warmup_steps=0),
    )
    windows = synthetic_windows(2, 5)
    trainer = Trainer(tiny_model_dir, windows, windows, sft, tmp_path, progress=False)
    trainer.setup()

    torch.manual_seed(3)  # the trainer's LoRA init
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ref_model = attach_lora(base, lora, resolve_targets(base, lora))
    with torch.no_grad():  # non-zero B, so the gradients of A are non-zero too; the same in both
        for (n, p), (n2, p2) in zip(trainer.peft_model.named_parameters(), ref_model.named_parameters()):
            assert n == n2
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
                p2.copy_(p)
            assert torch.equal(p, p2)

    for w in windows:
        ids, labels = torch.tensor([w["input_ids"]]), torch.tensor([w["labels"]])
        ref = full_loss_sum(
            ref_model(input_ids=ids, output_hidden_states=True).hidden_states[-1],
            base.get_output_embeddings().weight,
            labels,
        )
        logits = ref_model(input_ids=ids).logits  # the model's own head: the same logits
        ref2 = F.cross_entropy(logits[0, :-1].float(), labels[0, 1:], ignore_index=IGNORE, reduction="sum")
        assert ref.item() == pytest.approx(ref2.item(), rel=1e-6)
        ref2.backward()
        loss, n = trainer.window_loss(w)
        loss.backward()
        assert n == w["n_supervised"] and loss.item() == pytest.approx(ref2.item(), rel=1e-6)
        grads = {n: p.grad for n, p in trainer.peft_model.named_parameters() if p.requires_grad}
        ref_grads = {n: p.grad for n, p in ref_model.named_parameters() if p.requires_grad}
        assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 14
        for name in grads:
            assert torch.allclose(grads[name], ref_grads[name], atol=1e-6, rtol=1e-5), name
        assert max(float(g.abs().max()) for g in grads.values()) > 1e-3
        trainer.peft_model.zero_grad()
        ref_model.zero_grad()


def test_split_head_keeps_the_weight_and_returns_hidden_states(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        weight = split_head(model)
        hidden = model(input_ids=ids).logits
    assert hidden.shape == (1, 4, model.config.hidden_size)
    assert torch.allclose(F.linear(hidden, weight), logits, atol=1e-5)
    assert model.get_input_embeddings().weight.shape == weight.shape  # tied: the embeddings stay
