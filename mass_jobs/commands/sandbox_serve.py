"""`mass sandbox-serve --socket PATH --workspace DIR`: the sandbox container of an agent pod.

Serves the episode's workspace, its tools and shell commands to `mass episode --sandbox PATH` in
the pod's main container until the pod ends (see `mass_jobs.episodes.sandbox_service`). With `--qwen-only`
it is the pod's qwen-code container instead: it starts qwen-code on the shared workspace volume,
its shell commands sent to `--shell-socket`. Each runs as a uid of its own, with no credential
and no view of the main container's files.
"""

from __future__ import annotations

from mass_jobs.episodes.sandbox_service import serve


def add_arguments(parser) -> None:
    parser.add_argument(
        "--socket", required=True, metavar="PATH", help="Unix socket to serve (in a volume both containers mount)"
    )
    parser.add_argument(
        "--workspace", required=True, metavar="DIR", help="where the episode's workspace lives (missing or empty)"
    )
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="DIR is the episode's workspace, already seeded (one machine: no archive is handed over)",
    )
    parser.add_argument(
        "--qwen-only",
        action="store_true",
        help="serve qwen-code runs only, on the workspace another container seeds (an agent pod's "
        "qwen-code container); needs --shell-socket",
    )
    parser.add_argument(
        "--shell-socket",
        metavar="PATH",
        default=None,
        help="a shell-only service that runs qwen-code's shell commands (one machine: the harness's); "
        "default: this service runs them",
    )


def main(args) -> int:
    import os
    import sys
    from pathlib import Path

    workspace = Path(args.workspace)
    if not args.in_place:  # an agent pod's container: its uid, seccomp profile and NetworkPolicy bound what it runs
        from mass_jobs.sandbox.run import declare_outer_boundary

        declare_outer_boundary("pod")
    # files the other container of the pod must change are group-writable (the pod's fsGroup)
    os.umask(0o002)
    if args.qwen_only:
        if not args.shell_socket:
            print(
                "mass sandbox-serve --qwen-only: expected --shell-socket (where its shell commands run)",
                file=sys.stderr,
            )
            return 2
        print(f"sandbox (qwen-code): serving {args.socket}", flush=True)
        serve(
            Path(args.socket),
            workspace,
            reap=True,
            shell_socket=Path(args.shell_socket),
            routes=frozenset({"qwen", "health", "shutdown"}),
        )
        return 0
    if args.in_place and not workspace.is_dir():
        print(
            f"mass sandbox-serve --workspace: expected the episode's workspace folder, got {workspace}", file=sys.stderr
        )
        return 2
    if not args.in_place and workspace.exists() and (not workspace.is_dir() or any(workspace.iterdir())):
        print(f"mass sandbox-serve --workspace: expected a missing or empty folder, got {workspace}", file=sys.stderr)
        return 2
    print(f"sandbox: serving {args.socket}", flush=True)
    serve(
        Path(args.socket),
        workspace,
        reap=True,  # its own process: it may kill all below it
        shell_socket=Path(args.shell_socket) if args.shell_socket else None,
    )
    return 0
