"""`mass egress-serve SPEC`: the run's egress proxy on a cluster (a Deployment of each cycle).

The allow-list of a rollout is the one its prepared episode.json holds (in the run's store, which
no agent pod can write: the spec's `execution.network` and its task's hosts), else the spec's
(off: every request refused, and logged); a request counts for the rollout whose key (written by
prepare beside it) made its token.
See `mass_jobs.sandbox.egress_service`. Serves until killed (the cycle deletes its Deployment when it ends).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec (path or s3:// URI)")
    parser.add_argument(
        "--listen",
        default=":3128",
        metavar="[HOST]:PORT",
        help="where agent pods reach it; no HOST: $POD_IP (a pod's own address), else 0.0.0.0",
    )


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

    def allow_of(rollout: str) -> list[str] | None:
        where = ctx.agent_input(ctx.under_run(rollout), "episode.json")
        doc = ctx.store.get_json(where) if ctx.store.exists(where) else None
        hosts = doc.get("network") if isinstance(doc, dict) else None
        return [str(h) for h in hosts] if isinstance(hosts, list) else None

    with EgressService(allow, key, (host, int(port)), allow_of=allow_of) as service:
        run = ctx.run
        print(
            f"egress proxy for run {run} on {service.address[0]}:{service.address[1]}; "
            f"allowed: {', '.join(allow) or 'nothing (execution.network: off)'}",
            flush=True,
        )
        threading.Event().wait()
    return 0
