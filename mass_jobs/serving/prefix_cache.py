"""Prefix reuse for the embedded server: the KV state of prompts already seen, reused by later ones.

Every qwen-code request repeats the same system prompt and tool list (about 28k tokens of the
paper's tokenizer) and, within an episode, every earlier turn. `PrefixCache` keeps the model's
cache state of recent prompts and hands a later prompt the longest stored prefix of it, so only
the new tokens are prefilled.

Replies do not depend on what the cache holds. A prompt is always prefilled in blocks of
`block` tokens at fixed offsets (0, block, 2*block, ...), cache or no cache, and only whole blocks
are stored or reused: the state after block k is computed from the same tokens by the same
forward passes whether it was computed now or for an earlier request, so the bits are the same,
and so are the replies (the test compares them byte for byte with the cache off).

- Attention-only models (Qwen3): a stored state is cut back to the block where a new prompt first
  differs, so episodes that share only the system prompt share its state.
- Models with recurrent layers (Qwen3.5/3.6's linear attention) cannot be cut back: a stored state
  is reused only when all of it is a prefix of the new prompt (the turns of one conversation).

Bounded by bytes: least recently used states go first; a state larger than the bound is not kept.
Continuous batching (`--continuous-batching`) does not go through `generate()` and is not cached.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

DEFAULT_BLOCK = 256
DEFAULT_BUDGET_GIB = 2.0


@dataclass
class Stats:
    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose state came from the cache
    prefilled_tokens: int = 0  # prompt tokens computed in blocks here (the tail is left to generate())
    stored: int = 0
    evicted: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Entry:
    ids: object  # 1-D LongTensor, the tokens whose state `state` holds
    state: object  # a transformers Cache
    nbytes: int = field(default=0)


def _tensors(state):
    """Every tensor a cache object holds (its layers' keys, values and recurrent states)."""
    import torch

    seen, out, stack = set(), [], [state]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("transformers"):
            stack.extend(vars(obj).values())
    return out


def state_bytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(state))


def croppable(state) -> bool:
    """Whether the state can be cut back to an earlier length: plain attention layers only."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(state, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two 1-D token tensors."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return n if diff.numel() == 0 else int(diff[0])


class PrefixCache:
    """Cache states of prompt prefixes at block boundaries, least recently used evicted first."""

    def __init__(self, budget_bytes: int, block: int = DEFAULT_BLOCK):
        if block < 1:
            raise ValueError("prefix cache block must be a positive number of tokens")
        self.budget_bytes, self.block = int(budget_bytes), block
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.bytes = 0
        self.stats = Stats()
        self._next = 0
        self._lock = threading.Lock()

    def _lookup(self, ids, limit: int):
        """(entry key, usable length, fork) for ids[:limit]: the entry sharing the longest usable
        prefix, and the longest block-aligned prefix shared with any entry (where a recurrent
        state worth keeping for the next prompt that forks there would be)."""
        best, best_len, fork = None, 0, 0
        for key, entry in self.entries.items():
            n = common_prefix(entry.ids, ids[:limit])
            n -= n % self.block
            fork = max(fork, n)
            if n < entry.ids.shape[0] and not croppable(entry.state):
                continue  # a recurrent state is usable only whole
            if n > best_len:
                best, best_len = key, n
        return best, best_len, fork

    def _take(self, key, length: int):
        """A private copy of entry `key`'s state, cut back to `length` tokens."""
        entry = self.entries[key]
        self.entries.move_to_end(key)
        state = copy.deepcopy(entry.state)
        extra = entry.ids.shape[0] - length
        if extra:
            state.crop(-extra)
        return state

    def _store(self, ids, state) -> None:
        nbytes = state_bytes(state)
        if nbytes > self.budget_bytes:
            return
        # A stored prefix of the new state is redundant where states can be cut back.
        if croppable(state):
            for key in [
                k
                for k, e in self.entries.items()
                if e.ids.shape[0] <= ids.shape[0] and common_prefix(e.ids, ids) == e.ids.shape[0]
            ]:
                self.bytes -= self.entries.pop(key).nbytes
        while self.entries and self.bytes + nbytes > self.budget_bytes:
            self.bytes -= self.entries.popitem(last=False)[1].nbytes
            self.stats.evicted += 1
        self.entries[self._next] = _Entry(ids.clone(), copy.deepcopy(state), nbytes)
        self._next += 1
        self.bytes += nbytes
        self.stats.stored += 1

    def prefill(self, model, input_ids):
        """A cache state covering the whole blocks of input_ids[0] before its last token (None when
        the prompt is shorter than one block); generate() then prefills only the rest."""
        import torch

        ids = input_ids[0]
        end = ((ids.shape[0] - 1) // self.block) * self.block  # generate() needs at least one token
        with self._lock:
            self.stats.requests += 1
            self.stats.prompt_tokens += int(ids.shape[0])
            if end == 0:
                return None
            key, start, fork = self._lookup(ids, end) if self.budget_bytes > 0 else (None, 0, 0)
            state = self._take(key, start) if key is not None else None
            self.stats.reused_tokens += start
        if state is None:
            from transformers import DynamicCache

            state = DynamicCache(config=model.config)
        with torch.no_grad():  # not inference_mode: generate() updates recurrent states in place
            for s in range(start, end, self.block):
                if s == fork and s > start and not croppable(state):
                    # Where this prompt leaves a stored one (the end of a shared system prompt):
                    # keep the state there too, since a recurrent state cannot be cut back to it.
                    with self._lock:
                        self._store(ids[:s], state)
                model(input_ids=input_ids[:, s : s + self.block], cache=state, use_cache=True, logits_to_keep=1)
        with self._lock:
            self.stats.prefilled_tokens += end - start
            if self.budget_bytes > 0 and end > start:
                self._store(ids[:end], state)
        return state


def install(model, cache: PrefixCache) -> None:
    """Route model.generate() through `cache` for single prompts (the embedded server's requests)."""
    if getattr(model, "_mass_prefix_cache", None) is not None:
        return
    upstream = model.generate

    def generate(*args, **kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        config = kwargs.get("generation_config")
        if (
            input_ids is not None
            and input_ids.dim() == 2
            and input_ids.shape[0] == 1
            and kwargs.get("cache") is None
            and getattr(config, "cache_implementation", None) in (None, "dynamic")
        ):
            state = cache.prefill(model, input_ids)
            if state is not None:
                kwargs["cache"] = state
        return upstream(*args, **kwargs)

    model.generate = generate
    model._mass_prefix_cache = cache
