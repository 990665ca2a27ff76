"""The proof that an agent pod's outputs are the harness's: an HMAC that no sidecar can compute.

In an agent pod the sidecars run model-written code, and Argo's emissary mounts /var/run/argo into
every container with 0777 directories and umask 0: a sidecar can touch the main container's
exit-code file, and the wait container then uploads whatever /out holds at that moment (or stage
archives of its own for outputs outside a volume). So ingest trusts no uploaded byte by itself.

The prepare phase writes a fresh random key per rollout beside the pod's inputs. Argo mounts input
artifacts into the main container only, so the harness reads the key and no sidecar can. The
harness writes `proof.json` last: the SHA-256 of every output it wrote (None for one it did not)
and their HMAC-SHA256 under the key. Ingest recomputes the digests from the uploaded bytes and
refuses any set the key did not sign: a truncated upload, a file from elsewhere or a forged one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from pathlib import Path

KEY = "episode.key"  # an input of the pod, beside episode.json
PROOF = "proof.json"  # an output of the pod, written after every other one
# what an episode's pod signs; network.jsonl only where its shell commands had the egress proxy
EPISODE_OUTPUTS = ("workspace.tar.gz", "trace.jsonl", "network.jsonl", "status.json")
CHECK_OUTPUTS = ("checks.json",)  # what a guard's checks pod signs


def new_key() -> bytes:
    return secrets.token_hex(32).encode()


def _mac(key: bytes, digests: dict[str, str | None]) -> str:
    return hmac.new(key.strip(), json.dumps(digests, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def digests_of(files: dict[str, bytes | None]) -> dict[str, str | None]:
    return {name: None if blob is None else hashlib.sha256(blob).hexdigest() for name, blob in files.items()}


def sign_outputs(key: bytes, out_dir: Path, names: tuple[str, ...]) -> dict:
    """Write OUT/proof.json over the outputs `names` as they are now (call it last)."""
    files = {n: (out_dir / n).read_bytes() if (out_dir / n).is_file() else None for n in names}
    digests = digests_of(files)
    doc = {"files": digests, "hmac": _mac(key, digests)}
    (out_dir / PROOF).write_text(json.dumps(doc, sort_keys=True) + "\n")
    return doc


def refusal(key: bytes, proof: bytes | None, files: dict[str, bytes | None]) -> str | None:
    """Why the uploaded `files` (name -> bytes, None where absent) are not the ones the key signed,
    or None when they are."""
    if proof is None:
        return f"no {PROOF}: the harness did not finish writing its outputs, or they were cut short"
    try:
        doc = json.loads(proof)
        signed, mac = doc["files"], doc["hmac"]
        if not isinstance(signed, dict) or not isinstance(mac, str):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        return f"{PROOF} is not a proof"
    if not hmac.compare_digest(_mac(key, signed), mac):
        return f"{PROOF} was not signed with this rollout's key"
    actual = digests_of(files)
    differ = sorted(n for n in set(signed) | set(actual) if signed.get(n) != actual.get(n))
    if differ:
        return f"uploaded {', '.join(differ)} differ from what the harness signed"
    return None
