"""One object store behind one interface: a local directory (`file://`) or S3 (`s3://`).

Every step reads its inputs from and writes its outputs to a `Store`, then writes a step manifest
LAST (`<prefix>/_manifest.json`: input hash + sha256 and size of every output). A step whose
manifest has the same input hash and whose outputs are intact is skipped on rerun, so a run
resumes where it crashed:

    store = open_store("file:///tmp/run")        # or open_store(spec.store), "s3://bucket/prefix"
    step = Step(store, "run/gen-0/rank/t1", inputs={"episodes": [...]})
    if not step.done:
        step.start()                              # drops a stale manifest before rewriting outputs
        store.put_json("run/gen-0/rank/t1.json", result)
        step.finish(["run/gen-0/rank/t1.json"])

Keys are relative '/'-separated strings, the same on disk and on S3. S3 settings come from the
spec or the standard AWS environment (credentials chain, AWS_ENDPOINT_URL, AWS_REGION).
"""

from __future__ import annotations

from mass_jobs.config.run_spec import StoreSpec
from mass_jobs.store.archive import MODEL_LIMITS, WORKSPACE_LIMITS, ArchiveLimits, UnsafeArchive
from mass_jobs.store.base import MissingKey, Store, UnreadableObject, check_key
from mass_jobs.store.local import FileStore
from mass_jobs.store.manifest import (
    CorruptObject,
    Step,
    StepTakenOver,
    Waiting,
    formed,
    hash_inputs,
    manifest_key,
    read_manifest,
    verify_manifest,
)
from mass_jobs.store.s3 import S3Store

__all__ = [
    "MODEL_LIMITS",
    "WORKSPACE_LIMITS",
    "ArchiveLimits",
    "CorruptObject",
    "FileStore",
    "MissingKey",
    "S3Store",
    "Step",
    "StepTakenOver",
    "Store",
    "UnreadableObject",
    "UnsafeArchive",
    "Waiting",
    "check_key",
    "formed",
    "hash_inputs",
    "manifest_key",
    "open_store",
    "read_manifest",
    "verify_manifest",
]


def open_store(
    where: StoreSpec | Store | str, *, endpoint_url: str | None = None, region: str | None = None, **s3_options
) -> Store:
    """Open a store from a StoreSpec or a URI (`file:///abs`, `file://rel`, `s3://bucket/prefix`).

    `s3_options` (multipart_threshold, max_attempts, connect_timeout, read_timeout) tune S3Store.
    """
    if isinstance(where, Store):
        return where
    if isinstance(where, StoreSpec):
        uri, endpoint_url, region = where.uri, endpoint_url or where.endpoint_url, region or where.region
    else:
        uri = where
    if uri.startswith("file://"):
        root = uri[len("file://") :]
        if not root:
            raise ValueError(f"store uri {uri!r}: expected file:///abs/dir or file://relative/dir")
        return FileStore(root)
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"store uri {uri!r}: expected s3://bucket[/prefix]")
        return S3Store(bucket, prefix.strip("/"), endpoint_url=endpoint_url, region=region, **s3_options)
    raise ValueError(f"store uri {uri!r}: expected a file:// or s3:// URI")
