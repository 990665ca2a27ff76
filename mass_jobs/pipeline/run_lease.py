"""One local writer per run: a lease in the run's store that a second `mass run` of the run meets.

    with RunLease(ctx):          # RunBusy (exit 2) naming the holder while another one is alive
        ... run the steps ...

The lease is `RunContext.writer()`, a `mass_jobs.store.lease.Lease`: created atomically with the
holder's host, pid and start, renewed every RENEW_S, taken over when not renewed for TTL_S or when
its holder is a dead process of this host, removed on exit. Argo needs none: one cycle per run
holds the run's mutex, and its steps are separate pods (each step's own lease still fences them).
"""

from __future__ import annotations

from mass_jobs.store.lease import Lease, WriterBusy

RENEW_S = 15.0
TTL_S = 60.0


class RunBusy(WriterBusy):
    """Another live writer holds the run (the CLI exits 2 with this message)."""


class RunLease(Lease):
    def __init__(self, ctx, ttl_s: float = TTL_S, renew_s: float = RENEW_S):
        super().__init__(ctx.store, ctx.writer(), f"run {ctx.run!r} in {ctx.store.uri}", ttl_s=ttl_s, renew_s=renew_s)
        self.ctx = ctx

    def acquire(self) -> None:
        try:
            super().acquire()
        except WriterBusy as err:
            raise RunBusy(str(err)) from None
