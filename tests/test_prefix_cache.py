"""The embedded server's prefix cache (mass_jobs.serving.prefix_cache), on the tiny models in process.

What it must hold: the replies are byte-identical with the cache on and off, whatever order the
prompts come in and whatever the cache holds (greedy and seeded sampling); the shared prefix is
really reused (the counters); memory stays within the bound; recurrent models reuse only whole
states and keep one where conversations fork.
"""

from __future__ import annotations

import threading

import pytest

from mass_jobs.serving.prefix_cache import PrefixCache, common_prefix, croppable, install, state_bytes

pytestmark = pytest.mark.unit

BLOCK = 64
SYSTEM = 700  # tokens of the shared "system prompt and tools"


def load(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def conversations(vocab: int):
    """Prompts as an agent harness sends them: a shared system prefix, three tasks, and later turns
    that extend an earlier prompt (its reply and a tool result appended)."""
    import torch

    rand = lambda n, seed: torch.randint(20, vocab - 20, (1, n), generator=torch.Generator().manual_seed(seed))  # noqa: E731
    system = rand(SYSTEM, 0)
    first = [torch.cat([system, rand(90 + 40 * i, 10 + i)], 1) for i in range(3)]
    later = [torch.cat([first[0], rand(150, 20)], 1), torch.cat([first[1], rand(260, 21)], 1)]
    later.append(torch.cat([later[0], rand(70, 22)], 1))
    return first + later


def replies(model, prompts, *, sample: bool):
    """{prompt index: generated token ids}; sampled replies seeded per prompt, as the server seeds a request."""
    import torch

    out = {}
    for i, p in prompts:
        if sample:
            torch.manual_seed(1000 + i)
        ids = model.generate(
            input_ids=p,
            attention_mask=torch.ones_like(p),
            max_new_tokens=12,
            do_sample=sample,
            top_k=50,
            temperature=1.0,
            eos_token_id=None,
        )
        out[i] = ids[0, p.shape[1] :].tolist()
    return out


def with_cache(model, cache):
    install(model, cache)
    return model


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load(tiny_model_dir)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "seeded-sampling"])
def test_replies_are_byte_identical_with_and_without_the_cache_in_any_order(tiny_model_dir, sample):
    prompts = list(enumerate(conversations(load(tiny_model_dir).config.vocab_size)))
    off = PrefixCache(0, block=BLOCK)
    reference = replies(with_cache(load(tiny_model_dir), off), prompts, sample=sample)
    assert off.stats.reused_tokens == 0 and not off.entries
    assert len({tuple(r) for r in reference.values()}) > 1  # the prompts give different replies
    for order in (prompts, prompts[::-1], prompts[3:] + prompts[:3]):
        on = PrefixCache(2**30, block=BLOCK)
        assert replies(with_cache(load(tiny_model_dir), on), order, sample=sample) == reference
        assert on.stats.reused_tokens > 0
    # The in-order pass: each first turn after the first reuses the shared system blocks, each
    # later turn the whole of the turn it extends (cut at a block boundary).
    on = PrefixCache(2**30, block=BLOCK)
    replies(with_cache(load(tiny_model_dir), on), prompts, sample=sample)
    shared = SYSTEM - SYSTEM % BLOCK
    lengths = [p.shape[1] for _, p in prompts]
    blocks = lambda n: (n - 1) // BLOCK * BLOCK  # noqa: E731  (what a prompt of n tokens stores)
    expected = 2 * shared + blocks(lengths[0]) + blocks(lengths[1]) + blocks(lengths[3])
    assert on.stats.reused_tokens == expected
    assert on.stats.prefilled_tokens == sum(blocks(n) for n in lengths) - expected


def test_a_stored_state_is_cut_back_to_where_a_prompt_leaves_it(tiny):
    import torch

    cache = PrefixCache(2**30, block=BLOCK)
    a, b = conversations(tiny.config.vocab_size)[:2]
    state = cache.prefill(tiny, a)
    assert croppable(state) and state.get_seq_length() == (a.shape[1] - 1) // BLOCK * BLOCK
    cut = cache.prefill(tiny, b)  # shares the system prompt only
    assert cache.stats.reused_tokens == SYSTEM - SYSTEM % BLOCK
    fresh = PrefixCache(0, block=BLOCK).prefill(tiny, b)
    for mine, theirs in zip(cut.layers, fresh.layers):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    assert common_prefix(a[0], b[0]) == SYSTEM


def test_memory_stays_within_its_bound_least_recently_used_first(tiny):
    prompts = conversations(tiny.config.vocab_size)
    one = state_bytes(PrefixCache(0, block=BLOCK).prefill(tiny, prompts[0]))
    cache = PrefixCache(int(2.5 * one), block=BLOCK)  # room for about two first turns
    for p in prompts[:3]:
        cache.prefill(tiny, p)
        assert cache.bytes <= cache.budget_bytes
        assert cache.bytes == sum(state_bytes(e.state) for e in cache.entries.values())
    assert cache.stats.evicted >= 1
    holds = lambda p: any(common_prefix(e.ids, p[0]) == e.ids.shape[0] > SYSTEM for e in cache.entries.values())  # noqa: E731
    # The third prompt reused the first's system blocks, so the second was the least recently used.
    assert holds(prompts[0]) and not holds(prompts[1]) and holds(prompts[2])
    assert PrefixCache(one - 1, block=BLOCK).prefill(tiny, prompts[0]) is not None  # too big: computed, not kept
    too_small = PrefixCache(one - 1, block=BLOCK)
    too_small.prefill(tiny, prompts[0])
    assert not too_small.entries and too_small.bytes == 0


def test_a_later_turn_replaces_the_turn_it_extends(tiny):
    cache = PrefixCache(2**30, block=BLOCK)
    prompts = conversations(tiny.config.vocab_size)
    cache.prefill(tiny, prompts[0])
    cache.prefill(tiny, prompts[3])  # extends prompts[0]: one state serves both now
    assert len(cache.entries) == 1 and next(iter(cache.entries.values())).ids.shape[0] > prompts[0].shape[1] - BLOCK


def test_concurrent_requests_get_the_replies_they_get_alone(tiny_model_dir):
    prompts = list(enumerate(conversations(load(tiny_model_dir).config.vocab_size)))
    alone = replies(with_cache(load(tiny_model_dir), PrefixCache(0, block=BLOCK)), prompts, sample=False)
    model = with_cache(load(tiny_model_dir), PrefixCache(2**30, block=BLOCK))
    got, errors = {}, []

    def worker(items):
        try:
            got.update(replies(model, items, sample=False))
        except Exception as exc:  # surfaced below with the thread's own error
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(prompts[k::3],)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == alone


def test_recurrent_layers_reuse_whole_states_and_keep_the_fork(hybrid_dir):
    model = load(hybrid_dir)
    vocab = model.config.get_text_config().vocab_size
    prompts = conversations(vocab)
    cache = PrefixCache(2**30, block=BLOCK)
    install(model, cache)
    first = cache.prefill(model, prompts[0])
    assert not croppable(first)  # linear-attention layers: no cutting back
    cache.prefill(model, prompts[1])  # shares only the system prompt: nothing reusable yet ...
    assert cache.stats.reused_tokens == 0
    forks = [e.ids.shape[0] for e in cache.entries.values()]
    assert SYSTEM - SYSTEM % BLOCK in forks  # ... but the state where it forks is kept
    cache.prefill(model, prompts[2])  # the third task starts from that fork
    assert cache.stats.reused_tokens == SYSTEM - SYSTEM % BLOCK
    indexed = list(enumerate(prompts))
    reference = replies(with_cache(load(hybrid_dir), PrefixCache(0, block=BLOCK)), indexed, sample=True)
    assert replies(model, indexed[::-1], sample=True) == reference
