"""The file:// backend: a local directory; keys are relative paths under it."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO

from mass_jobs.config.run_spec import StoreSpec
from mass_jobs.store.base import CHUNK, TMP_PREFIX, MissingKey, Store, check_key, check_prefix, replace_atomically


class FileStore(Store):
    """A local directory; keys are relative paths. Writes go to a temp file then os.replace."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.uri = f"file://{self.root}"

    @property
    def spec(self) -> StoreSpec:
        return StoreSpec(uri=self.uri)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _existing(self, key: str) -> Path:
        path = self._path(key)
        if not path.is_file():
            raise MissingKey(f"{self.uri}: no object at key {key!r}")
        return path

    def put_bytes(self, key: str, data: bytes) -> str:
        replace_atomically(self._path(key), lambda tmp: tmp.write_bytes(data))
        return hashlib.sha256(data).hexdigest()

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._existing(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # removed between the check and the read
            raise MissingKey(f"{self.uri}: no object at key {key!r}") from None

    def put_if_absent(self, key: str, data: bytes) -> bool:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}-{dest.name}"
        try:
            tmp.write_bytes(data)
            os.link(tmp, dest)  # fails if dest exists: readers never see a partial object
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def put_file(self, key: str, path: str | os.PathLike) -> str:
        digest = hashlib.sha256()

        def copy(tmp: Path) -> None:
            with open(path, "rb") as src, open(tmp, "wb") as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)

        replace_atomically(self._path(key), copy)
        return digest.hexdigest()

    def get_file(self, key: str, path: str | os.PathLike) -> Path:
        src = self._existing(key)
        try:
            replace_atomically(Path(path), lambda tmp: shutil.copyfile(src, tmp))
        except FileNotFoundError as err:
            if err.filename == str(src):  # removed between the check and the copy
                raise MissingKey(f"{self.uri}: no object at key {key!r}") from None
            raise
        return Path(path)

    def open_read(self, key: str) -> BinaryIO:
        try:
            return open(self._existing(key), "rb")
        except (FileNotFoundError, NotADirectoryError):  # removed between the check and the open
            raise MissingKey(f"{self.uri}: no object at key {key!r}") from None

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        # Walk only the deepest folder the prefix names, then filter by the string prefix.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / base if base else self.root
        if not start.is_dir():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(TMP_PREFIX)]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                key = name if rel == "." else f"{rel}/{name}"
                if not name.startswith(TMP_PREFIX) and key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def stat(self, key: str) -> tuple[int, str]:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKey(f"{self.uri}: no object at key {key!r}") from None
        return st.st_size, f"{st.st_ino}-{st.st_mtime_ns}"  # every write is a new file renamed into place

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_if_version(self, key: str, version: str) -> bool:
        """Moved aside in one rename (no one else can then delete or replace it), deleted if it is
        the version asked for, else put back unless a newer object took the key meanwhile."""
        dest = self._path(key)
        aside = dest.parent / f"{TMP_PREFIX}{uuid.uuid4().hex}-{dest.name}"
        try:
            os.rename(dest, aside)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            st = os.stat(aside)
            if f"{st.st_ino}-{st.st_mtime_ns}" == version:
                return True
            try:
                os.link(aside, dest)
            except FileExistsError:
                pass
            return False
        finally:
            aside.unlink(missing_ok=True)
