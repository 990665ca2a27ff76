"""Step manifests: written LAST, they mark a step done for one input hash and pin its outputs' sha256."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from mass_jobs.store.base import MissingKey, Store, check_key

MANIFEST_NAME = "_manifest.json"


class CorruptObject(Exception):
    """An object's content no longer matches the sha256 its manifest recorded."""


def hash_inputs(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj` (sorted keys, no whitespace): the step's identity."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest_key(prefix: str) -> str:
    return f"{check_key(prefix)}/{MANIFEST_NAME}"


def read_manifest(store: Store, prefix: str) -> dict | None:
    """The step manifest under `prefix`, or None when the step never finished."""
    try:
        return store.get_json(manifest_key(prefix))
    except MissingKey:
        return None


def verify_manifest(store: Store, prefix: str) -> dict:
    """Re-hash every output the manifest lists; raise CorruptObject on a missing or changed object."""
    manifest = read_manifest(store, prefix)
    if manifest is None:
        raise MissingKey(f"{store.uri}: no manifest at {manifest_key(prefix)!r}")
    for key, expected in manifest["outputs"].items():
        try:
            found = store.sha256(key)
        except MissingKey:
            found = "missing"
        if found != expected:
            raise CorruptObject(f"{store.uri}: object {key!r} expected sha256 {expected}, found {found}")
    return manifest


class Step:
    """One resumable step: done when its manifest exists with the same input hash."""

    def __init__(self, store: Store, prefix: str, inputs: Any, *, name: str | None = None):
        self.store, self.prefix, self.inputs = store, check_key(prefix), inputs
        self.name = name or prefix
        self.input_hash = hash_inputs(inputs)
        self.manifest_key = manifest_key(prefix)

    @property
    def done(self) -> bool:
        manifest = read_manifest(self.store, self.prefix)
        return manifest is not None and manifest.get("input_hash") == self.input_hash

    def start(self) -> None:
        """Drop a manifest of other inputs, so a crash while rewriting outputs never looks done."""
        self.store.delete(self.manifest_key)

    def finish(self, outputs: list[str], extra: dict | None = None) -> dict:
        """Hash every output (they must exist), then write the manifest last; return it."""
        hashes = {}
        for key in sorted(outputs):
            try:
                hashes[key] = self.store.sha256(key)
            except MissingKey as err:
                raise MissingKey(f"step {self.name!r} finished without its output {key!r}") from err
        manifest = {"step": self.name, "input_hash": self.input_hash, "outputs": hashes, "extra": extra or {}}
        self.store.put_json(self.manifest_key, manifest)
        return manifest
