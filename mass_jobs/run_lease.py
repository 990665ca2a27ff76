"""One local writer per run: a lease in the run's store that a second `mass run` of the run meets.

    with RunLease(ctx):          # RunBusy (exit 2) naming the holder while another one is alive
        ... run the steps ...

The lease is `RunContext.writer()`, created atomically (`Store.create_json`: an exclusive create
locally, a conditional PUT on S3) with the holder's host, pid and start, and renewed every
RENEW_S by a thread. It is stale, and taken over, when it was not renewed for TTL_S (a killed or
frozen writer on any machine) or when its holder is a dead process of this host; it is removed on
exit. Argo needs none: one cycle per run holds the run's mutex, and its steps are separate pods.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

RENEW_S = 15.0
TTL_S = 60.0


class RunBusy(RuntimeError):
    """Another live writer holds the run (the CLI exits 2 with this message)."""


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


class RunLease:
    def __init__(self, ctx, ttl_s: float = TTL_S, renew_s: float = RENEW_S):
        self.ctx, self.store, self.key = ctx, ctx.store, ctx.writer()
        self.ttl_s, self.renew_s = ttl_s, renew_s
        now = time.time()
        self.record = {"holder": f"{socket.gethostname()}:{os.getpid()}", "host": socket.gethostname(),
                       "pid": os.getpid(), "token": uuid.uuid4().hex, "started": now, "renewed": now}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stale(self, held: dict) -> bool:
        if time.time() - float(held.get("renewed", 0)) > self.ttl_s:
            return True
        return held.get("host") == self.record["host"] and not pid_alive(held.get("pid"))

    def acquire(self) -> None:
        for _ in range(3):  # a lease may vanish between our create and our read: try again
            if self.store.create_json(self.key, self.record):
                break
            try:
                held = self.store.get_json(self.key)
            except LookupError:
                continue
            if not self.stale(held):
                age = time.time() - float(held.get("started", time.time()))
                raise RunBusy(f"run {self.ctx.run!r} in {self.store.uri} is being written by {held.get('holder')} "
                              f"(started {age:.0f} s ago, lease renewed {time.time() - float(held['renewed']):.0f} s "
                              f"ago): wait for it to finish, or stop it; a lease not renewed for {self.ttl_s:.0f} s "
                              "is taken over")
            self.store.delete(self.key)  # stale: its writer is gone
        else:
            raise RunBusy(f"run {self.ctx.run!r} in {self.store.uri}: its writer lease changed hands three times "
                          "while this process tried to take it")
        self._thread = threading.Thread(target=self._renew, name="run-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                held = self.store.get_json(self.key)
            except (LookupError, OSError, ValueError):
                held = None
            if held is not None and held.get("token") != self.record["token"]:
                return  # taken over (we were frozen past the TTL): the new holder's now
            self.store.put_json(self.key, {**self.record, "renewed": time.time()})

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if self.store.get_json(self.key).get("token") == self.record["token"]:
                self.store.delete(self.key)
        except (LookupError, OSError, ValueError):
            pass

    def __enter__(self) -> "RunLease":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
