"""Leases in the store: one writer at a time for a run (`mass_jobs/pipeline/run_lease.py`) or a step.

A lease is a small JSON object created atomically (`Store.create_json`: an exclusive create
locally, a conditional PUT on S3) naming its holder (host, pid, pid namespace, start) and a
token, renewed every `renew_s` by a thread of its own (one slow store never delays another's). It is stale, and may be taken over,
when it was not renewed for `ttl_s` (a killed or frozen writer anywhere) or when its holder is a
process of this host and pid namespace that is gone (or, for a `reentrant` lease, this very
process: a step's earlier attempt that raised, since one process runs a step once at a time).
`held()` says whether the stored lease still carries this holder's token: a
writer that was frozen past the TTL finds it taken over and must not publish what it wrote.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
import weakref

from mass_jobs.store.base import MissingKey, Store, UnreadableObject


class WriterBusy(RuntimeError):
    """Another live writer holds the lease (the CLI exits 2 with this message)."""


def pid_alive(pid) -> bool:
    """Whether a process of this host has this pid (0 / -1 would address process groups: never)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _renew_while_alive(ref: weakref.ref[Lease], stop: threading.Event, every: float) -> None:
    """A lease's renewing thread: it holds the lease only weakly, so a writer object dropped
    without release (a step that raised) stops renewing, and its lease goes stale by the TTL."""
    while not stop.wait(every):
        lease = ref()
        if lease is None or not lease.renew():
            return
        del lease


class Lease:
    def __init__(
        self,
        store: Store,
        key: str,
        what: str,
        *,
        ttl_s: float,
        renew_s: float,
        wait_s: float = 0.0,
        reentrant: bool = False,
    ):
        self.store, self.key, self.what = store, key, what
        self.ttl_s, self.renew_s, self.wait_s, self.reentrant = ttl_s, renew_s, wait_s, reentrant
        host, now = socket.gethostname(), time.time()
        self.record = {
            "holder": f"{host}:{os.getpid()}",
            "host": host,
            "pid": os.getpid(),
            "pidns": _pid_namespace(),
            "token": uuid.uuid4().hex,
            "started": now,
            "renewed": now,
        }
        self.renewed = now
        self.active = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a renewal never lands after the release that deleted the lease

    def stale(self, held: dict) -> bool:
        if time.time() - float(held.get("renewed", 0)) > self.ttl_s:
            return True
        if held.get("host") != self.record["host"] or held.get("pidns", self.record["pidns"]) != self.record["pidns"]:
            return False  # another machine or pod: only the TTL can tell
        if held.get("pid") == os.getpid():
            return self.reentrant  # this process again: a step's earlier attempt that raised
        return not pid_alive(held.get("pid"))

    def _read(self) -> dict | None:
        try:
            held = self.store.get_json(self.key)
        except (MissingKey, UnreadableObject, OSError):
            return None
        return held if isinstance(held, dict) else {}

    def _read_versioned(self) -> tuple[dict | None, str | None]:
        """(the stored lease, its version), (None, None) when it is gone or was rewritten while read."""
        try:
            _, version = self.store.stat(self.key)
            held = self.store.get_json(self.key)
            if self.store.stat(self.key)[1] != version:
                return None, None
        except (MissingKey, UnreadableObject, OSError):
            return None, None
        return (held if isinstance(held, dict) else {}), version

    def busy_message(self, held: dict) -> str:
        now = time.time()
        return (
            f"{self.what} is being written by {held.get('holder')} (started "
            f"{now - float(held.get('started', now)):.0f} s ago, lease renewed "
            f"{now - float(held.get('renewed', now)):.0f} s ago): wait for it to finish, or stop it; "
            f"a lease not renewed for {self.ttl_s:.0f} s is taken over"
        )

    def acquire(self) -> None:
        deadline, changes = time.monotonic() + self.wait_s, 0
        while True:
            if self.store.create_json(self.key, self.record):
                break
            held, version = self._read_versioned()
            if held is None:  # released between our create and our read
                changes += 1
            elif self.stale(held):
                # its writer is gone: delete that lease, never one a live writer took since we read it
                # (a holder that released and exited while we looked, its key then taken by another)
                self.store.delete_if_version(self.key, version)
                changes += 1
            elif time.monotonic() >= deadline:
                raise WriterBusy(self.busy_message(held))
            else:
                time.sleep(min(1.0, self.renew_s))
                continue
            if changes > 3:
                raise WriterBusy(
                    f"{self.what}: its writer lease changed hands {changes} times while this process tried to take it"
                )
        self.renewed, self.active = time.time(), True
        self._stop = threading.Event()
        threading.Thread(
            target=_renew_while_alive,
            args=(weakref.ref(self), self._stop, self.renew_s),
            name=f"lease {self.key}",
            daemon=True,
        ).start()

    def held(self) -> bool:
        """Whether the stored lease is still this holder's (not released, not taken over)."""
        held = self._read()
        return bool(held) and held.get("token") == self.record["token"]

    def renew(self) -> bool:
        """Renew the stored lease; False once it is no longer this holder's."""
        with self._lock:
            if not self.active:
                return False
            self.renewed = time.time()
            try:
                if not self.held():  # taken over (we were frozen past the TTL): the new holder's now
                    self.active = False
                    return False
                self.store.put_json(self.key, {**self.record, "renewed": self.renewed})
            except OSError:
                pass  # a store hiccup: the next round tries again, the TTL allows several misses
            return True

    def release(self) -> None:
        with self._lock:
            self.active = False
            self._stop.set()
            try:  # ours, and only the version we read: a lease taken over meanwhile stays its new holder's
                held, version = self._read_versioned()
                if held and held.get("token") == self.record["token"]:
                    self.store.delete_if_version(self.key, version)
            except OSError:
                pass

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
