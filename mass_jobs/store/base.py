"""Store primitives shared by both backends: keys, hashing, atomic local writes, the Store interface."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, BinaryIO

from mass_jobs.config.run_spec import StoreSpec
from mass_jobs.store.archive import WORKSPACE_LIMITS, ArchiveLimits, extract_dir_archive, write_dir_archive

TMP_PREFIX = ".tmp-"  # in-flight files of the file backend; never listed, never valid in keys
CHUNK = 1 << 20


class MissingKey(LookupError):
    """The store has no object under this key."""


class UnreadableObject(ValueError):
    """An object that is not what its reader expects (JSON that does not parse); names the key."""


MAX_KEY_BYTES = 1024


def check_key(key: str, *, allow_empty: bool = False) -> str:
    """Return `key` if it is a clean relative '/'-separated key, else raise ValueError saying why."""
    if not isinstance(key, str):
        raise ValueError(f"store key must be a string, got {type(key).__name__}")
    if key == "" and allow_empty:
        return key
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:  # S3's own limit; deeper nests recursed locally
        raise ValueError(
            f"store key {key[:80]!r}... is {len(key.encode('utf-8', 'surrogatepass'))} bytes, "
            f"over the {MAX_KEY_BYTES} bytes S3 allows a key"
        )
    if key.startswith("/"):
        raise ValueError(f"store key {key!r} must be relative (no leading '/')")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"store key {key!r} must use '/' separators and no NUL bytes")
    for part in key.split("/"):
        if part == "":
            raise ValueError(f"store key {key!r} has an empty segment (leading, trailing or doubled '/')")
        if part in (".", ".."):
            raise ValueError(f"store key {key!r} must not contain '.' or '..' segments")
        if part.startswith(TMP_PREFIX):
            raise ValueError(f"store key {key!r}: segments starting with {TMP_PREFIX!r} are reserved")
    return key


def check_prefix(prefix: str) -> str:
    """A list prefix is a key, a key ending in '/', or empty (everything)."""
    check_key(prefix[:-1] if prefix.endswith("/") else prefix, allow_empty=True)
    return prefix


def sha256_stream(stream: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def replace_atomically(dest: Path, write) -> None:
    """Call write(tmp_path) next to `dest`, then rename over it: readers see all or nothing."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}-{dest.name}"
    try:
        write(tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


class Store(ABC):
    """Bytes, files, JSON and directories under relative keys. Subclasses implement the primitives."""

    uri: str

    # primitives
    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str:
        """Store `data`; return its sha256 hex."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store `data` only when no object is at `key`, atomically (an exclusive create locally, a
        conditional PUT on S3): True when this call created it, False when one was already there."""

    @abstractmethod
    def put_file(self, key: str, path: str | os.PathLike) -> str:
        """Stream a local file into the store (multipart on S3 when large); return its sha256 hex."""

    @abstractmethod
    def get_file(self, key: str, path: str | os.PathLike) -> Path:
        """Stream an object to a local file, atomically replacing it; return the path."""

    @abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A readable binary stream of the object (caller closes it)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys starting with `prefix` (a plain string prefix, as on S3: use 'dir/' for a folder)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def stat(self, key: str) -> tuple[int, str]:
        """(size in bytes, version): one stat / HEAD. The version changes whenever the object is rewritten."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""

    def delete_if_version(self, key: str, version: str) -> bool:
        """Remove the object only while it is the one `stat` gave `version` for; False when it was
        rewritten or is gone. Backends make this one operation; this fallback checks, then deletes."""
        try:
            if self.stat(key)[1] != version:
                return False
        except MissingKey:
            return False
        self.delete(key)
        return True

    @property
    @abstractmethod
    def spec(self) -> StoreSpec:
        """A StoreSpec that opens this same store (e.g. in a child process)."""

    # built on the primitives
    def put_json(self, key: str, obj: Any) -> str:
        text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a model's cut emoji): escaped, the object stays valid UTF-8 JSON
            data = (json.dumps(obj, indent=2) + "\n").encode("utf-8")
        return self.put_bytes(key, data)

    def create_json(self, key: str, obj: Any) -> bool:
        """put_if_absent of a JSON object: True when this call created it."""
        return self.put_if_absent(key, (json.dumps(obj, indent=2) + "\n").encode("utf-8"))

    def get_json(self, key: str) -> Any:
        data = self.get_bytes(key)
        try:
            return json.loads(data)
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError: say which object
            raise UnreadableObject(f"{self.uri.rstrip('/')}/{key}: expected JSON, {err}") from None

    def sha256(self, key: str) -> str:
        with self.open_read(key) as stream:
            return sha256_stream(stream)

    def put_dir(self, key: str, directory: str | os.PathLike) -> str:
        """Store a directory as one deterministic .tar.gz object; return its sha256 hex."""
        check_key(key)
        with tempfile.TemporaryDirectory(prefix="mass-put-dir-") as tmp:
            archive = Path(tmp) / "dir.tar.gz"
            with open(archive, "wb") as out:
                write_dir_archive(Path(directory), out)
            return self.put_file(key, archive)

    def get_dir(self, key: str, directory: str | os.PathLike, limits: ArchiveLimits = WORKSPACE_LIMITS) -> Path:
        """Extract a put_dir object into `directory` (missing or empty), all or nothing.

        Raises UnsafeArchive (and leaves nothing behind) on a member escaping the target or an
        expansion past `limits`; pass MODEL_LIMITS for our own large checkpoints and models.
        """
        with tempfile.TemporaryDirectory(prefix="mass-get-dir-") as tmp:
            archive = self.get_file(key, Path(tmp) / "dir.tar.gz")
            with open(archive, "rb") as f:
                extract_dir_archive(f, Path(directory), limits)
        return Path(directory)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
