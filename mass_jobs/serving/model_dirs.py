"""Model locations -> local directories, and loading models and tokenizers from them.

A location is one of:
- a local directory (or `file:///abs/dir`): used as is;
- `s3://bucket/key`: either a directory of objects under `key/` or one `put_dir` archive at `key`
  (how steps store model dirs), downloaded into a cache dir keyed by the URI and used again while
  the objects there are the ones it holds (their sizes and versions; a re-upload is fetched anew);
- a Hugging Face Hub id (`org/name`, optionally `org/name@revision`): `huggingface_hub.snapshot_download`.

Used by every step that needs weights (`mass serve`, train, merge, evaluate).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from mass_jobs.store import open_store

DEFAULT_CACHE = Path(os.environ.get("MASS_MODEL_CACHE", Path.home() / ".cache" / "mass-jobs" / "models"))
COMPLETE_MARKER = ".mass-complete"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class ModelLocationError(ValueError):
    """A model location that is neither an existing directory, an s3:// URI nor a hub id."""


def looks_like_hub_id(location: str) -> bool:
    """'org/name' or 'org/name@rev', and not a path ('./x', '/x', '~/x')."""
    return not location.startswith(("/", ".", "~")) and bool(_HUB_ID.match(location))


def cache_path(location: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory for a remote location: readable tail + hash of the full URI."""
    digest = hashlib.sha256(location.encode("utf-8")).hexdigest()[:16]
    tail = re.sub(r"[^\w.-]+", "_", location.rstrip("/").rsplit("/", 1)[-1])[:40] or "model"
    return Path(cache_dir or DEFAULT_CACHE) / f"{tail}-{digest}"


def resolve_model(location, cache_dir=None, store_options: dict | None = None) -> Path:
    """Return a local directory holding the model at `location` (see the module docstring).

    `store_options` go to `mass_jobs.store.open_store` for s3:// (endpoint_url, region, ...).
    A cached s3 copy is used again while the objects at the URI are unchanged (`stored_version`).
    """
    loc = str(location)
    if loc.startswith("file://"):
        loc = loc[len("file://") :]
    if loc.startswith("s3://"):
        return _download_s3(loc, cache_path(loc, cache_dir), store_options or {})
    path = Path(loc).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLocationError(f"model location {loc!r}: expected a directory, found a file")
    if not looks_like_hub_id(loc):
        raise ModelLocationError(
            f"model location {loc!r}: no such directory, and not an s3:// URI or a hub id like 'org/name[@rev]'"
        )
    from huggingface_hub import snapshot_download

    repo_id, _, revision = loc.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=cache_dir))
    except Exception as exc:  # offline, no such repo, gated: say which location and why, in one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ModelLocationError(
            f"model location {loc!r}: no such directory ({Path(loc).resolve()}), so it was taken for a hub id, "
            f"and fetching it from the Hugging Face Hub failed: {type(exc).__name__}: {first}"
        ) from exc


def _download_s3(uri: str, dest: Path, store_options: dict) -> Path:
    bucket, _, key = uri[len("s3://") :].partition("/")
    key = key.strip("/")
    if not bucket or not key:
        raise ModelLocationError(f"model location {uri!r}: expected s3://bucket/key")
    store = open_store(f"s3://{bucket}", **store_options)
    # A location outside a run's store can be overwritten (a model re-uploaded to the same path, or
    # another server's bucket of the same name): the cache holds only while the objects are its own.
    return fetch_stored_model(store, key, dest, label=uri, version=stored_version(store, key))


def stored_version(store, key: str) -> str:
    """A digest of what is stored at `key` (each object's name, size and version): it changes when any
    object is rewritten, added or removed. Empty when nothing is there (the fetch then says so)."""
    keys = store.list(key + "/") or ([key] if store.exists(key) else [])
    if not keys:
        return ""
    rows = [f"{k}\t{size}\t{version}" for k in keys for size, version in [store.stat(k)]]
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


# ---------------------------------------------------------------- model dirs in a run's store


def store_model_dir(store, key: str, directory) -> list[str]:
    """Upload a model dir as plain objects under `key/` (the layout KServe's storage initializer
    downloads from s3://); returns the object keys, sorted."""
    root = Path(directory)
    keys = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER):
        keys.append(f"{key}/{path.relative_to(root).as_posix()}")
        store.put_file(keys[-1], path)
    if not keys:
        raise ModelLocationError(f"{root}: an empty model directory cannot be stored at {key!r}")
    return keys


def has_stored_model(store, key: str) -> bool:
    """Objects under `key/`, or one `put_dir` archive at `key`."""
    return bool(store.list(key + "/")) or store.exists(key)


def fetch_stored_model(store, key: str, dest, label: str | None = None, version: str | None = None) -> Path:
    """Download the model stored at `key` (objects under `key/`, else an archive at `key`) into `dest`
    once: a complete download leaves a marker, and a crash never leaves a half model behind it. With
    `version` (`stored_version`), a copy whose marker records another version is fetched again."""
    dest = Path(dest)
    label = label or key
    marker = dest / COMPLETE_MARKER
    if marker.exists() and (version is None or marker.read_text().splitlines()[1:2] == [version]):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        keys = store.list(key + "/")
        if keys:
            for k in keys:
                store.get_file(k, tmp / k[len(key) + 1 :])
        elif store.exists(key):
            from mass_jobs.store import MODEL_LIMITS

            store.get_dir(key, tmp, MODEL_LIMITS)
        else:
            raise ModelLocationError(
                f"model location {label!r}: no objects under {key + '/'!r} and no archive at {key!r}"
            )
        (tmp / COMPLETE_MARKER).write_text(label + "\n" + (f"{version}\n" if version is not None else ""))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def load_tokenizer(location, **resolve_kwargs):
    """AutoTokenizer for the model at `location`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(location, **resolve_kwargs))


def load_model(location, dtype="auto", **resolve_kwargs):
    """AutoModelForCausalLM at `location`; `dtype` is a torch.dtype, its name ('bfloat16') or 'auto'."""
    import torch
    from transformers import AutoModelForCausalLM

    if isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype {dtype!r}: expected 'auto' or a torch dtype name like 'bfloat16'")
        dtype = getattr(torch, dtype)
    return AutoModelForCausalLM.from_pretrained(resolve_model(location, **resolve_kwargs), dtype=dtype)
