"""Where a step's models and judges are served: here, by the spec's serving backend, or (the cluster)
at endpoints that already serve them. Each is a pair (serve_model, serve_judge) of context managers
that yield an Endpoint; a step or handler only enters them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from mass_jobs.serving import backends
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.model_dirs import resolve_model

# gen -> a context manager serving that generation's model (yields an Endpoint)
ServeModel = Callable[[int], AbstractContextManager[Any]]
# judge -> a context manager yielding an Endpoint for it ('local' judges get a server here)
ServeJudge = Callable[[Any], AbstractContextManager[Any]]


def local_servers(
    spec,
    model_dir_of: Callable[[int], Path],
    name_of: Callable[[int], str],
    *,
    store_options: dict | None = None,
    log_dir: Path | None = None,
) -> tuple[ServeModel, ServeJudge]:
    """Servers started here per use: L_g from `model_dir_of(g)` under `name_of(g)` (the name its
    InferenceService has on the cluster, so traces of both executors agree); a `local` judge from
    its model; any other judge at its own endpoint."""

    @contextlib.contextmanager
    def serve_model(g: int):
        log = (log_dir / f"serve-gen-{g}.log") if log_dir else None
        with backends.serve_model(spec, model_dir_of(g), name_of(g), log_path=log) as endpoint:
            yield endpoint

    @contextlib.contextmanager
    def serve_judge(judge):
        if judge.endpoint != "local":
            yield Endpoint(base_url=judge.endpoint, model=judge.model, api_key_env=judge.api_key_env)
            return
        log = (log_dir / f"serve-judge-{judge.name}.log") if log_dir else None
        with backends.serve_model(
            spec, resolve_model(judge.model, store_options=store_options), judge.name, log_path=log
        ) as endpoint:
            yield endpoint

    return serve_model, serve_judge


def remote_servers(local_judges: dict | None = None) -> tuple[ServeModel, ServeJudge]:
    """The cluster's evaluate finish: judges at their external endpoints, a `local` judge where
    `local_judges` (name -> Endpoint) says its executor serves it, else refused (it would need a GPU
    in this pod). No generation is served here: each is called in its own round."""

    @contextlib.contextmanager
    def serve_model(g: int):
        raise ValueError(
            f"L_{g} is called only in its round (--phase finish --served-gen {g}), never by the step's finish"
        )
        yield

    @contextlib.contextmanager
    def serve_judge(judge):
        if judge.endpoint == "local" and judge.name in (local_judges or {}):
            yield local_judges[judge.name]
            return
        if judge.endpoint == "local":
            raise ValueError(
                f"judges: {judge.name!r} has endpoint 'local'; on the cluster judges are external "
                f"endpoints (an OpenAI-compatible URL), the evaluate pod serves no model"
            )
        yield Endpoint(base_url=judge.endpoint, model=judge.model, api_key_env=judge.api_key_env)

    return serve_model, serve_judge
