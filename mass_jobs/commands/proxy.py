"""`mass proxy --upstream URL --model NAME --trace FILE [--port P] [--api-key-env VAR]`: a recording proxy
in front of an OpenAI-compatible server until Ctrl-C; every chat call becomes one line of FILE."""

from __future__ import annotations

from mass_jobs.serving.llm import Endpoint, ModelError
from mass_jobs.serving.proxy import RecordingProxy


def add_arguments(parser) -> None:
    parser.add_argument(
        "--upstream", required=True, help="upstream API root, e.g. http://host:8000/v1 or .../openai/v1"
    )
    parser.add_argument("--model", required=True, help="model name served by the upstream")
    parser.add_argument("--trace", required=True, help="JSONL trace file to append to")
    parser.add_argument("--port", type=int, default=0, help="listen port on 127.0.0.1 (default: a free one, printed)")
    parser.add_argument("--api-key-env", default=None, help="environment variable holding the upstream API key")
    parser.add_argument("--timeout-s", type=float, default=600, help="upstream request timeout (default 600)")


def main(args) -> int:
    import signal
    import sys
    import threading

    upstream = Endpoint(base_url=args.upstream, model=args.model, api_key_env=args.api_key_env)
    if not args.upstream.startswith(("http://", "https://")):
        print(f"mass proxy --upstream: expected an http(s):// URL, got {args.upstream!r}", file=sys.stderr)
        return 2
    try:
        proxy = RecordingProxy(upstream, args.trace, port=args.port, timeout_s=args.timeout_s).start()
    except ModelError as exc:
        print(f"mass proxy --api-key-env: {exc}", file=sys.stderr)
        return 2
    print(f"recording {args.upstream} on {proxy.base_url} into {args.trace}", flush=True)
    # Ctrl-C or SIGTERM stop it, also when started from a script's background job, whose shell
    # hands it SIGINT ignored (Python then never installs its KeyboardInterrupt handler).
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    finally:
        proxy.stop()
    return 0
