"""Step manifests: written LAST, they mark a step done for one input hash and pin its outputs.

A manifest records each output's sha256 and size. `Step.done` believes a manifest only when it is
a well-formed object of the same input hash and every output still exists with its recorded size
(and, for outputs up to `HASH_ON_DONE` bytes, its recorded hash): a corrupted, truncated or
deleted output, or a manifest that is not a manifest, means "not done", so the step reruns and
rewrites it. `verify_manifest` (and `mass verify RUN_OR_SPEC`) re-hashes every output.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from mass_jobs.config.errors import StepFailed
from mass_jobs.store.base import MissingKey, Store, check_key
from mass_jobs.store.lease import Lease, WriterBusy

log = logging.getLogger(__name__)

MANIFEST_NAME = "_manifest.json"
WRITER_NAME = "_writer.json"  # the step's writer lease, beside its manifest
STEP_RENEW_S, STEP_TTL_S = 5.0, 30.0
STEP_WAIT_S = STEP_TTL_S + 2 * STEP_RENEW_S  # long enough for a killed writer's lease to go stale
HASH_ON_DONE = 1 << 20  # outputs this small are re-hashed by Step.done; larger ones are checked by size
FINISH_ROUNDS = 50  # finish() re-pins while concurrent finishers keep rewriting outputs (they stop when they finish)


class CorruptObject(Exception):
    """An object's content no longer matches the sha256 its manifest recorded (or the manifest is broken)."""


class StepTakenOver(WriterBusy):
    """This writer's step lease was taken over (it was frozen past the TTL): what it wrote is not published."""


@dataclass(frozen=True)
class Waiting:
    """A step that cannot be formed yet because an input it hashes is not stored: a value, not an
    error. It is not done (so a done-check needs no exception handling) and says why; the step's
    core, which cannot run without that input, raises it (`formed`)."""

    reason: str

    @property
    def done(self) -> bool:
        return False


def formed(step: Step | Waiting, error: type[Exception] = StepFailed) -> Step:
    """The Step itself, or the Waiting's reason raised as `error` (the core's own error type)."""
    if isinstance(step, Waiting):
        raise error(step.reason)
    return step


def hash_inputs(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj` (sorted keys, no whitespace): the step's identity."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # a lone surrogate cannot be UTF-8: hashed as its escape, as put_json stores it
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()


def manifest_key(prefix: str) -> str:
    return f"{check_key(prefix)}/{MANIFEST_NAME}"


def _shape_problem(manifest: Any) -> str | None:
    """Why `manifest` is not a well-formed step manifest, or None."""
    if not isinstance(manifest, dict):
        return f"expected a JSON object, found {type(manifest).__name__}"
    if not isinstance(manifest.get("input_hash"), str):
        return "input_hash missing"
    outputs, sizes = manifest.get("outputs"), manifest.get("sizes", {})
    if not isinstance(outputs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in outputs.items()):
        return "outputs is not an object of key -> sha256"
    if not isinstance(sizes, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes.values()):
        return "sizes is not an object of key -> byte count"
    return None


def _load(store: Store, prefix: str) -> tuple[dict | None, str | None]:
    """(manifest, None), (None, None) when absent, or (None, why) when unreadable or malformed."""
    try:
        raw = store.get_bytes(manifest_key(prefix))
    except MissingKey:
        return None, None
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        return None, f"unreadable JSON ({err.__class__.__name__}: {err})"
    problem = _shape_problem(manifest)
    return (None, problem) if problem else (manifest, None)


def read_manifest(store: Store, prefix: str) -> dict | None:
    """The step manifest under `prefix`, or None when the step never finished (or its manifest is broken)."""
    manifest, problem = _load(store, prefix)
    if problem:
        log.warning(
            "%s: manifest %s is broken (%s): the step counts as not done", store.uri, manifest_key(prefix), problem
        )
    return manifest


def verify_manifest(store: Store, prefix: str) -> dict:
    """Re-hash every output the manifest lists; raise CorruptObject on a missing or changed object
    (other content or another size than pinned) or on a manifest that is not a manifest."""
    manifest, problem = _load(store, prefix)
    if problem:
        raise CorruptObject(f"{store.uri}: manifest {manifest_key(prefix)!r} is broken: {problem}")
    if manifest is None:
        raise MissingKey(f"{store.uri}: no manifest at {manifest_key(prefix)!r}")
    sizes = manifest.get("sizes", {})
    for key, expected in manifest["outputs"].items():
        try:
            found, (size, _) = store.sha256(key), store.stat(key)
        except MissingKey:
            found, size = "missing", None
        if found != expected:
            raise CorruptObject(f"{store.uri}: object {key!r} expected sha256 {expected}, found {found}")
        if key in sizes and size != sizes[key]:
            raise CorruptObject(f"{store.uri}: object {key!r} expected {sizes[key]} bytes, found {size}")
    return manifest


def outputs_intact(store: Store, manifest: dict, hash_limit: int = HASH_ON_DONE, depth: int = 3) -> str | None:
    """Why the manifest's outputs are no longer what it pinned (missing, other size, other hash), or None.

    Sizes are one stat/HEAD each; content is re-hashed for outputs up to `hash_limit` bytes. An
    output that is another step's manifest (evaluate pins its rollouts' manifests) is followed, so
    a damaged file of that step makes this one not intact either.
    """
    sizes = manifest.get("sizes", {})
    for key, expected in manifest["outputs"].items():
        try:
            size, _ = store.stat(key)
        except MissingKey:
            return f"output {key!r} is missing"
        if key in sizes and size != sizes[key]:
            return f"output {key!r} is {size} bytes, the manifest says {sizes[key]}"
        if (key not in sizes or size <= hash_limit) and store.sha256(key) != expected:
            return f"output {key!r} no longer has sha256 {expected}"
        if depth > 0 and key.endswith("/" + MANIFEST_NAME):
            try:
                nested = store.get_json(key)
                problem = outputs_intact(store, nested, hash_limit, depth - 1)
            except (ValueError, KeyError, TypeError, AttributeError):
                problem = "it is not a manifest"
            if problem:
                return f"output {key!r}: {problem}"
    return None


def foreign_outputs(owns: tuple[str, ...], outputs) -> list[str]:
    """Outputs that are not the step's own (under none of the key prefixes it owns); it may pin other
    steps' manifests (evaluate pins its rollouts': their damage shows)."""
    return sorted(k for k in outputs if not (k.startswith(owns) or k.endswith("/" + MANIFEST_NAME)))


class Step:
    """One resumable step: done when its manifest has the same input hash and its outputs are intact.

    One writer at a time: `start()` (or `finish()` when nothing was started) takes the step's lease
    (`<prefix>/_writer.json`), waiting up to STEP_WAIT_S for another holder to finish or go stale,
    else WriterBusy naming it. `finish()` publishes the manifest only while the lease is still
    this writer's, so a writer frozen past the TTL, whose step another one took over, never pins
    outputs that are partly the other's.
    """

    def __init__(self, store: Store, prefix: str, inputs: Any, *, name: str | None = None, owns: tuple[str, ...] = ()):
        self.store, self.prefix, self.inputs = store, check_key(prefix), inputs
        self.name = name or prefix
        # key prefixes its outputs may have: `prefix/...`, `prefix.<ext>` (a one-file step), `owns`
        self.owns = (self.prefix + "/", self.prefix + ".", *owns)
        self.input_hash = hash_inputs(inputs)
        self.manifest_key = manifest_key(prefix)
        self.lease = Lease(
            store,
            f"{self.prefix}/{WRITER_NAME}",
            f"step {self.name!r} in {store.uri}",
            ttl_s=STEP_TTL_S,
            renew_s=STEP_RENEW_S,
            wait_s=STEP_WAIT_S,
            reentrant=True,
        )
        self.started = False  # once started, a lost lease is never taken back: what was written may be mixed

    @property
    def done(self) -> bool:
        manifest = read_manifest(self.store, self.prefix)
        if manifest is None or manifest.get("input_hash") != self.input_hash:
            return False
        foreign = foreign_outputs(self.owns, manifest["outputs"])
        problem = (
            f"its manifest pins other steps' objects {foreign[:3]}" if foreign else outputs_intact(self.store, manifest)
        )
        if problem:
            log.warning("step %s: %s: rerunning it", self.name, problem)
        return problem is None

    def claim(self) -> None:
        """Take the step's lease (once; a lease lost since is never taken back)."""
        if not self.started:
            self.lease.acquire()
            self.started = True
        self._check_lease()

    def start(self) -> None:
        """Claim the step, then drop a manifest of other inputs, so a crash while rewriting outputs
        never looks done."""
        self.claim()
        self.store.delete(self.manifest_key)

    def _versions(self, outputs: list[str]) -> dict[str, tuple[int, str]]:
        versions = {}
        for key in sorted(outputs):
            try:
                versions[key] = self.store.stat(key)
            except MissingKey as err:
                raise MissingKey(f"step {self.name!r} finished without its output {key!r}") from err
        return versions

    def _pin(self, outputs: list[str]) -> tuple[dict, dict, dict]:
        """(versions, hashes, sizes); versions are read BEFORE hashing, so a rewrite in between shows."""
        versions = self._versions(outputs)
        hashes = {}
        for key in versions:
            try:
                hashes[key] = self.store.sha256(key)
            except MissingKey as err:
                raise MissingKey(f"step {self.name!r} finished without its output {key!r}") from err
        return versions, hashes, {key: size for key, (size, _) in versions.items()}

    def finish(self, outputs: list[str], extra: dict | None = None) -> dict:
        """Hash every output (they must exist), then write the manifest last; return it.

        A concurrent finisher of the same step may rewrite an output between our hashing and our
        manifest write. So after writing, each output's version (one stat / HEAD) is read again and,
        if any changed, the outputs are re-hashed and the manifest rewritten: whoever writes a
        manifest last has checked it against what is stored.
        """
        foreign = foreign_outputs(self.owns, outputs)
        if foreign:
            raise ValueError(f"step {self.name!r} cannot pin objects of other steps: {foreign}")
        self.claim()  # a step that only writes its outputs and manifest claims it here
        try:
            return self._publish(outputs, extra)
        finally:
            self.lease.release()

    def _publish(self, outputs: list[str], extra: dict | None) -> dict:
        versions, hashes, sizes = self._pin(outputs)
        for _ in range(FINISH_ROUNDS):
            self._check_lease()
            manifest = {
                "step": self.name,
                "input_hash": self.input_hash,
                "outputs": hashes,
                "sizes": sizes,
                "extra": extra or {},
            }
            self.store.put_json(self.manifest_key, manifest)
            self._written = self.store.stat(self.manifest_key)[1]
            if not self.lease.held():  # taken over while we wrote: withdraw ours, unless already replaced
                self._withdraw()
                self._check_lease()
            if self._versions(outputs) == versions:
                return manifest
            log.warning("step %s: an output changed while finishing (a concurrent finisher): re-pinning", self.name)
            versions, hashes, sizes = self._pin(outputs)
        self.store.delete(self.manifest_key)
        raise CorruptObject(f"step {self.name!r}: outputs kept changing while finishing; left not done")

    def _check_lease(self) -> None:
        if not self.lease.held():
            raise StepTakenOver(
                f"step {self.name!r} in {self.store.uri}: its writer lease was taken over by "
                "another writer while this one ran (it was stopped past the lease's "
                f"{STEP_TTL_S:.0f} s): nothing published; the other writer finishes the step"
            )

    def _withdraw(self) -> None:
        """Delete the manifest this writer just wrote; one the new holder rewrote since stays (a
        single store can only say "written in the last instant" by the object's version)."""
        try:
            _, version = self.store.stat(self.manifest_key)
        except MissingKey:
            return
        if version == self._written:
            self.store.delete(self.manifest_key)
