"""`mass search --spec S --gen G --task T [--iteration K]`: the workflow search of one task.

Without --iteration the whole loop runs (resuming what is stored); with it exactly iteration K runs
and one JSON line {"continue": bool, "next": K+1|null, ...} is printed for Argo's bounded recursion.
The model is the one at --endpoint (e.g. the generation's InferenceService), or, without it, the
generation's model served here by the embedded server.
"""

from __future__ import annotations

import contextlib
import json
import sys


def add_common(parser) -> None:
    parser.add_argument("--spec", required=True, help="run spec: a path or an s3:// URI")
    parser.add_argument("--gen", type=int, required=True, help="generation g (the model L_g does the work)")
    parser.add_argument("--task", required=True, help="task id")


def add_model(parser) -> None:
    parser.add_argument("--endpoint", help="OpenAI-compatible base URL (…/v1) of the generation's model; "
                        "default: serve the generation's model here")
    parser.add_argument("--served-model", default="mass", help="model name at --endpoint (default: mass)")
    parser.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")


def add_arguments(parser) -> None:
    add_common(parser)
    add_model(parser)
    parser.add_argument("--iteration", type=int, help="run only this iteration (0..search.iterations)")


def open_run(args):
    """(spec, RunContext) or raise SpecError."""
    from mass_jobs.context import RunContext
    from mass_jobs.spec import load_spec
    from mass_jobs.store import open_store

    spec = load_spec(args.spec)
    spec.task(args.task)  # KeyError names the task
    return spec, RunContext(spec, open_store(spec.store))


def model_location(ctx, gen: int) -> str:
    """Where generation g's model lives: gen-0 may be the base; later ones are in the store."""
    key = ctx.model(gen)
    if ctx.store.list(key + "/"):
        return f"{ctx.spec.store.uri.rstrip('/')}/{key}"
    if gen == 0:
        return ctx.spec.model.base
    raise FileNotFoundError(f"no model for generation {gen} at {key}/ (run `mass merge --gen {gen - 1}` first)")


@contextlib.contextmanager
def model_endpoint(args, ctx):
    from mass_jobs.llm import Endpoint

    if args.endpoint:
        yield Endpoint(base_url=args.endpoint, model=args.served_model, api_key_env=args.api_key_env)
        return
    from mass_jobs.modelio import resolve_model
    from mass_jobs.serve import ModelServer

    opts = {k: v for k, v in {"endpoint_url": ctx.spec.store.endpoint_url, "region": ctx.spec.store.region}.items() if v}
    with ModelServer(resolve_model(model_location(ctx, args.gen), store_options=opts)) as srv:
        yield srv.endpoint


def client_for(spec, endpoint):
    from mass_jobs.llm import ModelClient

    lim = spec.execution.limits
    return ModelClient(endpoint, spec.model.sampling, timeout_s=lim.request_timeout_s, retries=lim.request_retries)


def run_guarded(fn) -> int:
    """Exit codes of the CLI table: 2 bad input, 1 failure, 0 ok."""
    from mass_jobs.spec import SpecError

    try:
        return fn()
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(args) -> int:
    def go() -> int:
        from mass_jobs.steps.search import episode_executor, run_search

        spec, ctx = open_run(args)
        with model_endpoint(args, ctx) as endpoint:
            out = run_search(ctx, args.gen, args.task, client_for(spec, endpoint), episode_executor(spec, endpoint),
                             iteration=args.iteration)
        print(json.dumps(out, sort_keys=True))
        return 0

    return run_guarded(go)
