"""`mass egress-serve SPEC`: the run's egress proxy on a cluster (a Deployment of each cycle).

The allow-list is the spec's `execution.network` (off: every request refused, and logged); a
request counts for the rollout whose key (in the run's store, written by prepare) made its token.
See `mass_jobs.sandbox.egress_service`. Serves until killed (the cycle deletes its Deployment when it ends).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec (path or s3:// URI)")
    parser.add_argument("--listen", default=":3128", metavar="[HOST]:PORT",
                        help="where agent pods reach it; no HOST: $POD_IP (a pod's own address), else 0.0.0.0")


def main(args) -> int:
    import os
    import sys
    import threading

    from mass_jobs.commands.common import open_run
    from mass_jobs.episodes import proof
    from mass_jobs.sandbox.egress_service import EgressService

    host, colon, port = args.listen.rpartition(":")
    if not colon or not port.isdigit():
        print(f"mass egress-serve --listen: expected [HOST]:PORT, got {args.listen!r}", file=sys.stderr)
        return 2
    host = host or os.environ.get("POD_IP") or "0.0.0.0"
    ctx = open_run(args.spec, check_spec=False)
    network = ctx.spec.execution.network
    allow = [] if network == "off" else list(network)

    def key(rollout: str) -> bytes | None:
        where = ctx.agent_input(ctx.under_run(rollout), proof.KEY)
        return ctx.store.get_bytes(where) if ctx.store.exists(where) else None

    with EgressService(allow, key, (host, int(port))) as service:
        run = ctx.run
        print(f"egress proxy for run {run} on {service.address[0]}:{service.address[1]}; "
              f"allowed: {', '.join(allow) or 'nothing (execution.network: off)'}", flush=True)
        threading.Event().wait()
    return 0
