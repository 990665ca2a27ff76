"""A safetensors checkpoint read and written shard by shard, so no step holds a whole model.

A checkpoint directory holds one `model.safetensors`, or shards named in
`model.safetensors.index.json` (`weight_map`: tensor name -> shard file). The paper's model is 54 GB
in bfloat16; the merge and the FP8 export read one tensor at a time and hold one output shard, so
their memory is bounded by the largest shard, not the model (`largest_shard_bytes`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def weight_map(model_dir: Path) -> dict[str, str]:
    """{tensor name: shard file name} of a checkpoint directory."""
    model_dir = Path(model_dir)
    if (model_dir / INDEX).is_file():
        return dict(json.loads((model_dir / INDEX).read_text())["weight_map"])
    if (model_dir / SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(model_dir / SINGLE, framework="pt") as f:
            return {k: SINGLE for k in f.keys()}
    raise FileNotFoundError(f"{model_dir}: expected {INDEX} or {SINGLE}")


def by_shard(mapping: dict[str, str]) -> dict[str, list[str]]:
    """{shard: sorted tensor names}, shards in name order."""
    out: dict[str, list[str]] = {}
    for name, shard in sorted(mapping.items()):
        out.setdefault(shard, []).append(name)
    return dict(sorted(out.items()))


class TensorReader:
    """Reads tensors by name from a checkpoint, one open shard at a time (never a whole shard in RAM)."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        self.map = weight_map(self.dir)
        self._open: tuple[str, object] | None = None

    def __contains__(self, name: str) -> bool:
        return name in self.map

    def get(self, name: str):
        from safetensors import safe_open

        shard = self.map[name]
        if self._open is None or self._open[0] != shard:
            self._open = (shard, safe_open(self.dir / shard, framework="pt"))
        return self._open[1].get_tensor(name)

    def meta(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """{name: (dtype, shape)} read from the shard headers alone."""
        from safetensors import safe_open

        out = {}
        for shard, names in by_shard(self.map).items():
            with safe_open(self.dir / shard, framework="pt") as f:
                for n in names:
                    sl = f.get_slice(n)
                    out[n] = (sl.get_dtype(), tuple(sl.get_shape()))
        return out


def write_index(out_dir: Path, mapping: dict[str, str], total_size: int) -> None:
    """The index file of a sharded checkpoint (none for a single `model.safetensors`)."""
    if set(mapping.values()) == {SINGLE}:
        return
    doc = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(mapping.items()))}
    (Path(out_dir) / INDEX).write_text(json.dumps(doc, indent=2) + "\n")


def nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def largest_shard_bytes(model_dir: Path) -> int:
    """Bytes of the checkpoint's largest shard file: what a shard-by-shard step holds at once."""
    return max((Path(model_dir) / s).stat().st_size for s in set(weight_map(model_dir).values()))


def copy_side_files(src: Path, out: Path, skip=()) -> list[str]:
    """Copy every file of `src` that is not a weight shard or its index (config, tokenizer, template)."""
    copied = []
    for f in sorted(Path(src).iterdir()):
        if not f.is_file() or f.name.endswith(".safetensors") or f.name == INDEX or f.name.startswith("."):
            continue
        if f.name in skip:
            continue
        shutil.copy2(f, Path(out) / f.name)
        copied.append(f.name)
    return copied
