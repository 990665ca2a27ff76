"""Where a generation's model is, in one place: its identity in input hashes (`model_ref`), its
the local directory a step loads or serves it from (`local_model_dir`, `served_model_dir`) and
the URI the cluster's InferenceService downloads it from (`model_uri`).

L0 is the spec's `model.base` (unless the store holds a generation-0 model); L1+ is what the
merge stored at `RunContext.model(g)` (and its FP8 export at `model_fp8(g)`). Every reader goes
through the run's store options, so an S3 base on a non-AWS endpoint resolves like the store.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from mass_jobs.run.base_model import base_model_dir
from mass_jobs.run.context import RunContext
from mass_jobs.serving import precision as sp
from mass_jobs.serving.model_dirs import fetch_stored_model, has_stored_model, resolve_model
from mass_jobs.serving.precision import for_cluster
from mass_jobs.serving.servers import local_servers
from mass_jobs.store import read_manifest


def model_ref(ctx: RunContext, g: int) -> str:
    """What identifies generation g's weights in input hashes: the base, or a digest of the stored model."""
    if g == 0 and not has_stored_model(ctx.store, ctx.model(0)):
        # the weights that serve L0 are part of what made its data (only when set: earlier hashes stay)
        return f"base:{ctx.spec.model.base}" + (f"|serve:{ctx.spec.model.serve}" if ctx.spec.model.serve else "")
    return f"gen-{g}:{model_digest(ctx, g)}"


def model_digest(ctx: RunContext, g: int) -> str:
    """sha256 over the stored model's objects: their hashes from the merge manifest when it lists
    them (no re-reading of the weights), else hashed here; a single archive is hashed as is."""
    key, store = ctx.model(g), ctx.store
    if store.exists(key):
        return store.sha256(key)
    merge = read_manifest(store, ctx.merge_step(g - 1)) if g > 0 else None
    listed = {k: v for k, v in ((merge or {}).get("outputs") or {}).items() if k.startswith(key + "/")}
    objects = store.list(key + "/")
    if sorted(listed) != objects:
        listed = {k: store.sha256(k) for k in objects}
    return hashlib.sha256(json.dumps(listed, sort_keys=True).encode()).hexdigest()


def local_model_dir(ctx: RunContext, g: int, cache_root: Path | None = None) -> Path:
    """A local directory holding L_g: the base model for g = 0 (unless the store has one), else the
    merged model the merge step stored at `<run>/gen-<g>/model`, extracted once into a cache under
    its content digest, so a cache never outlives the model it holds (a run redone after its store
    was deleted). The spec's chat template applies to the base as to every generation's server."""
    if not has_stored_model(ctx.store, ctx.model(g)):
        if g == 0:
            return base_model_dir(ctx, cache_root)
        raise FileNotFoundError(
            f"no model for generation {g} at store key {ctx.model(g)!r} (run `mass merge --gen {g - 1}` first)"
        )
    root = Path(cache_root or Path(tempfile.gettempdir()) / "mass-models")
    return fetch_stored_model(ctx.store, ctx.model(g), root / ctx.run / f"gen-{g}-{model_digest(ctx, g)[:16]}")


def served_model_dir(ctx: RunContext, g: int, cache_root: Path | None = None) -> Path:
    """The local directory a local server serves L_g from: the FP8 export (for L0 `model.serve`) where
    this machine's server reads it, else `local_model_dir`; the choice and its reason recorded at
    `ctx.serving(g)` (for L0 when `model.serve` is set)."""

    capability = sp.local_capability() if ctx.spec.execution.serving == "vllm" else None
    choice = sp.for_local(ctx.spec, g, capability)
    if choice.weights == "fp8" and not has_stored_model(ctx.store, ctx.model_fp8(g)):
        choice = sp.Choice(
            "bf16", f"no FP8 export is stored under {ctx.model_fp8(g)!r} (merged before sft.fp8_export was set?)"
        )
    if g > 0 or ctx.spec.model.serve:
        ctx.store.put_json(
            ctx.serving(g),
            {
                **choice.as_dict(),
                "backend": ctx.spec.execution.serving,
                "capability": list(capability) if capability else None,
            },
        )
    if choice.weights == "serve":
        return resolve_model(ctx.spec.model.serve, store_options=ctx.store_options())
    if choice.weights != "fp8":
        return local_model_dir(ctx, g, cache_root)
    root = Path(cache_root or Path(tempfile.gettempdir()) / "mass-models")
    # the same merge wrote both copies: the BF16 digest names the FP8 one too
    return fetch_stored_model(ctx.store, ctx.model_fp8(g), root / ctx.run / f"gen-{g}-fp8-{model_digest(ctx, g)[:16]}")


def model_uri(spec, gen: int, bucket: str, run_prefix: str) -> str:
    """The storageUri KServe downloads L_gen from: the FP8 export where `serving_precision.for_cluster`
    says so, else the BF16 model.

    S3 dirs end in '/': KServe lists objects by plain key prefix, so `.../gen-1/model` would also
    download `.../gen-1/model-fp8/` (kserve python/storage/kserve_storage/kserve_storage.py,
    Storage._download_s3, v0.20.0). Hub ids become `hf://org/name[:revision]`: KServe's
    Storage._download_hf splits on exactly one '/' and takes the revision after ':'.
    """
    if gen == 0:
        base = spec.model.serve if for_cluster(spec, 0).weights == "serve" else spec.model.base
        if base.startswith("s3://"):
            return base.rstrip("/") + "/"
        repo, _, revision = base.partition("@")
        return f"hf://{repo}" + (f":{revision}" if revision else "")

    ctx = RunContext.template(run_prefix)
    key = ctx.model_fp8(gen) if for_cluster(spec, gen).weights == "fp8" else ctx.model(gen)
    return f"s3://{bucket}/{key}/"


def generation_servers(ctx: RunContext, cache_root: Path | None = None, log_dir: Path | None = None):
    """(serve_model, serve_judge) started here per use: L_g from `served_model_dir`, under the name
    its InferenceService has on the cluster (serving/servers.py)."""
    return local_servers(
        ctx.spec,
        lambda g: served_model_dir(ctx, g, cache_root),
        ctx.served_model,
        store_options=ctx.store_options(),
        log_dir=log_dir,
    )
