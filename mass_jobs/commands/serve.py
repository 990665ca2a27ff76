"""`mass serve --model LOCATION [--port P] [--host 127.0.0.1] [--served-name NAME]`: serve a model over
the OpenAI chat-completions API (transformers' server) until Ctrl-C. LOCATION is a local dir, s3:// or a hub id.
Concurrent requests are served one after another (one generate() at a time) unless --continuous-batching.
Control tokens such as <|im_end|> never reach a client, streamed or not. The KV state of prompt prefixes
is reused across requests (--prefix-cache-gib) without changing any reply."""

from __future__ import annotations

from mass_jobs.serving.model_dirs import ModelLocationError, resolve_model
from mass_jobs.serving.prefix_cache import DEFAULT_BUDGET_GIB
from mass_jobs.serving.serve import build_app, default_served_name


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="model location: local dir, s3://bucket/key or hub id")
    parser.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1: loopback only)")
    parser.add_argument(
        "--served-name", default=None, help="model name clients send (default: the location's last part)"
    )
    parser.add_argument("--device", default="auto", help="torch device: auto, cpu, cuda:0 ...")
    parser.add_argument("--dtype", default="auto", help="weights dtype: auto (as saved), bfloat16, float32 ...")
    parser.add_argument(
        "--continuous-batching",
        action="store_true",
        help="batch concurrent requests (transformers' paged attention); the first request's sampling "
        "settings hold for the batch and per-request seeds are not applied",
    )
    parser.add_argument(
        "--prefix-cache-gib",
        type=float,
        default=DEFAULT_BUDGET_GIB,
        help=f"GiB of KV state of prompt prefixes kept for reuse by later requests (default "
        f"{DEFAULT_BUDGET_GIB:g}; 0: none); replies are the same either way",
    )
    parser.add_argument("--log-level", default="warning", help="server log level")


def main(args) -> int:
    import sys

    import uvicorn

    try:
        model_dir = resolve_model(args.model)
    except ModelLocationError as exc:
        print(f"mass serve --model: {exc}", file=sys.stderr)
        return 2
    name = args.served_name or default_served_name(args.model)
    app = build_app(
        model_dir,
        served_name=name,
        device=args.device,
        dtype=args.dtype,
        continuous_batching=args.continuous_batching,
        prefix_cache_gib=args.prefix_cache_gib,
    )
    print(f"serving {args.model} as {name!r} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
