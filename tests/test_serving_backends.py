"""Serving backends (execution.serving): one engine-argument builder for KServe and a local `vllm serve`,
the missing-vLLM validation message, the server process lifecycle with real processes (`mass serve` as
the launched command), and `external`: steps against an already-running `mass serve`, starting none."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from mass_jobs.commands.cli import main as mass
from mass_jobs.k8s import serving
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.serving import backends
from mass_jobs.serving.server_process import ServerProcess, free_port
from mass_jobs.spec.load import validate_document
from tests.fixtures.inner_loop import spec_document

ENGINE_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser", "--max-model-len", "--dtype")
REPO = Path(__file__).resolve().parents[1]


def engine_part(argv: list[str]) -> dict[str, str]:
    """flag -> value of the engine arguments in an argv (flags given as --flag=value or bare)."""
    out = {}
    for a in argv:
        flag, _, value = a.partition("=")
        if flag in ENGINE_FLAGS:
            out[flag] = value
    return out


def test_kserve_runtime_and_local_vllm_get_the_same_engine_arguments():
    spec = validate_document(
        spec_document(
            "file:///tmp/x",
            model={"base": "tiny", "dtype": "float16", "sampling": {"max_output_tokens": 256, "context_length": 8192}},
            execution={"serving": "embedded", "vllm": {"tool_call_parser": "qwen3_coder", "max_model_len": 8192}},
        )
    )
    s = ClusterSettings(tool_call_parser="qwen3_coder", max_model_len="8192")
    isvc = serving.inference_service(s, "mass-x-g0", "s3://b/m", {}, dtype=spec.model.dtype)
    kserve = isvc["spec"]["predictor"]["model"]["args"]
    local = backends.vllm_command(
        ["vllm", "serve"], "/models/m", "mass-x-g0", "127.0.0.1", 8123, backends.spec_engine_args(spec)
    )
    expected = {
        "--enable-auto-tool-choice": "",
        "--tool-call-parser": "qwen3_coder",
        "--reasoning-parser": "qwen3",
        "--max-model-len": "8192",
        "--dtype": "float16",
    }
    assert engine_part(kserve) == engine_part(local) == expected
    assert local[:3] == ["vllm", "serve", "/models/m"] and "--served-model-name" in local and "--seed=0" in local
    assert kserve[:2] == ["--model_name=mass-x-g0", "--backend=vllm"]

    # defaults agree too: the chart's parser is the spec's, the spec's context length is vLLM's limit
    default = validate_document(
        spec_document("file:///tmp/x", model={"base": "tiny", "sampling": {"context_length": 32768}})
    )
    kserve = serving.runtime_args(ClusterSettings(), "n", default.model.dtype)
    assert engine_part(kserve) == engine_part(backends.spec_engine_args(default))
    # the checked-in example object is what the builder writes
    doc = yaml.safe_load((REPO / "examples/k8s/inferenceservice-base.yaml").read_text())
    assert doc["spec"]["predictor"]["model"]["args"] == serving.runtime_args(
        ClusterSettings(), "mass-demo-g0", "bfloat16"
    )
    # the Argo cycle serves with the spec's dtype (validate's output), not a fixed one
    cycle = (REPO / "argo/mass-cycle.yaml").read_text()
    assert "--dtype={{inputs.parameters.dtype}}" in cycle
    assert "{{steps.validate.outputs.parameters.dtype}}" in cycle


def write_spec(tmp_path, model_dir, **sections) -> Path:
    doc = spec_document(f"file://{tmp_path}/store", **sections)
    doc["model"] = {**doc["model"], "base": str(model_dir), "dtype": "float32"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_vllm_serving_without_vllm_fails_validation_with_how_to_install(tmp_path, monkeypatch, capsys):
    model = tmp_path / "model"
    model.mkdir()
    spec = write_spec(tmp_path, model, execution={"serving": "vllm"})
    monkeypatch.delenv("VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no `vllm` on PATH
    if (Path(sys.executable).parent / "vllm").exists():
        pytest.fail("this environment has vLLM installed; the test needs one without it")
    for argv in (["validate", str(spec)], ["run", str(spec)]):
        assert mass(argv) == 2
        err = capsys.readouterr().err
        assert "$.execution.serving" in err and "pip install '.[vllm]'" in err and "VLLM_PYTHON" in err, err
    # VLLM_PYTHON naming an interpreter without vllm is named in the message
    monkeypatch.setenv("VLLM_PYTHON", sys.executable)
    assert mass(["validate", str(spec)]) == 2
    assert f"VLLM_PYTHON={sys.executable!r} cannot import vllm" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="execution.serving: vllm: expected vLLM installed"):
        backends.VllmServer(model, "m", [])
    # argo runs serve with KServe: no local vLLM needed
    assert backends.vllm_missing_reason() is not None
    doc = spec_document("s3://b/p", model={"base": "tiny"}, execution={"serving": "vllm", "mode": "argo"})
    assert validate_document(doc).execution.serving == "vllm"


def test_external_serving_needs_an_endpoint_per_role_and_batching_only_embedded(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    spec = write_spec(
        tmp_path,
        model,
        execution={"serving": "external", "continuous_batching": True},
        roles={"executor": {"endpoint": "http://127.0.0.1:1/v1", "model": "m"}},
    )
    assert mass(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    for role in ("optimizer", "evaluator"):
        assert f"$.roles.{role}" in err and "execution.serving is 'external'" in err
    assert "$.roles.executor" not in err
    assert "$.execution.continuous_batching" in err


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is pgid (from /proc: catches any orphaned worker)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(d.name))
    return pids


def test_server_process_waits_for_health_and_stops_the_whole_group(tiny_model_dir, tmp_path):
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mass_jobs.commands.cli",
        "serve",
        "--model",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--served-name",
        "tiny",
        "--device",
        "cpu",
    ]
    srv = ServerProcess(cmd, port=port, name="mass serve", log_path=tmp_path / "serve.log")
    with srv:
        # start() returned: the app answers at once, model loaded
        assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
        models = httpx.get(f"{srv.base_url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        pgid = srv.process.pid
        assert os.getpgid(pgid) == pgid  # its own group, led by the server
        members = group_members(pgid)
        assert pgid in members and len(members) >= 2  # the server and its lifeline watcher
    assert srv.process is None
    assert group_members(pgid) == []  # nothing of the group outlives stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{srv.base_url}/health", timeout=2)
    assert "serving" in (tmp_path / "serve.log").read_text()


@pytest.mark.slow(cost=10)  # a model server, started and killed: the slow tier
def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tiny_model_dir, tmp_path):
    """A server that ignores SIGTERM (a wedged engine) is killed after the grace period."""
    port = free_port()
    serve = (
        "import signal, sys, uvicorn.server as u; from mass_jobs.commands.cli import main; "
        "u.HANDLED_SIGNALS = (signal.SIGINT,); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"sys.exit(main(['serve', '--model', {str(tiny_model_dir)!r}, '--port', '{port}', '--device', 'cpu']))"
    )
    srv = ServerProcess([sys.executable, "-c", serve], port=port, stop_grace_s=2, log_path=tmp_path / "s.log")
    with srv:
        pid = srv.process.pid
        assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
        os.kill(pid, signal.SIGTERM)  # ignored: still serving
        assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
        proc = srv.process
    assert proc.returncode == -signal.SIGKILL
    assert group_members(pid) == []


@pytest.mark.slow(cost=12)  # a model server and the steps that use it: the slow tier
def test_external_serving_runs_steps_against_a_running_server_and_starts_none(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from mass_jobs.serving.serve import ModelServer
    from mass_jobs.store import open_store

    with ModelServer(tiny_model_dir, served_name="outside", device="cpu", log_path=tmp_path / "outside.log") as outside:
        url = outside.endpoint.base_url
        roles = {r: {"endpoint": url, "model": "outside"} for r in ("optimizer", "evaluator", "executor")}
        spec = write_spec(
            tmp_path,
            tiny_model_dir,
            model={"sampling": {"max_output_tokens": 24}},
            search={"iterations": 0},
            roles=roles,
            collection={"episodes": 2, "train_ranks": 1, "validation_rank": 2, "require_beats_reference": False},
            ranking={"comparisons_per_episode": 1},
            execution={
                "serving": "external",
                "limits": {"turns_per_agent": 1, "tool_calls": 2, "wall_s": 120, "request_timeout_s": 120},
            },
        )

        def no_server(self):
            raise AssertionError(f"the run started a server: {self.command()}")

        monkeypatch.setattr(ServerProcess, "start", no_server)
        before = outside.log_tail(10**7).count("[Request received]")
        assert mass(["search", str(spec), "--gen", "0", "--task", "t1"]) == 0, capsys.readouterr().err
        assert mass(["collect", str(spec), "--gen", "0", "--task", "t1", "--episode", "0"]) == 0, (
            capsys.readouterr().err
        )
        served = outside.log_tail(10**7).count("[Request received]") - before
    store = open_store(f"file://{tmp_path}/store")
    episode = store.get_json("inner/gen-0/collect/t1/ep-0/episode.json")
    assert episode["executor"] == {"endpoint": url, "model": "outside", "api_key_env": None}
    assert store.exists("inner/gen-0/collect/t1/ep-0/status.json")
    assert not store.exists("inner/gen-0/collect/t1/ep-1/status.json")  # one episode asked, one run
    # search ran the reference and the initial workflow (>= 1 request each) and collect one episode
    assert served >= 3


def test_the_vllm_extra_is_pinned_once_and_kept_out_of_the_test_install():
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["vllm"]
    assert len(extra) == 1 and re.fullmatch(r"vllm==\d+\.\d+\.\d+", extra[0])
    assert not any(d.startswith("vllm") for d in project["dependencies"] + project["optional-dependencies"]["test"])
    makefile = (REPO / "Makefile").read_text()
    assert f"pip install -q {extra[0]}" in makefile  # `make vllm-env` installs the same pin
    assert "'.[test]'" in makefile and "'.[vllm]'" not in makefile.split("test: setup")[0]


def test_a_run_may_resume_on_another_serving_backend_but_not_with_other_numbers(make_store):
    from mass_jobs.run.context import RunContext
    from mass_jobs.spec.load import SpecError

    store = make_store("file")
    doc = spec_document(store.spec.uri)
    RunContext(validate_document(doc), store).claim_spec()
    # a spec stored before these fields existed, or one that switches backend, is the same run
    stored = store.get_json(RunContext(validate_document(doc), store).spec_key())
    for key in ("serving", "continuous_batching", "vllm"):
        stored["execution"].pop(key)
    store.put_json(RunContext(validate_document(doc), store).spec_key(), stored)
    other = {
        **doc,
        "execution": {**doc["execution"], "continuous_batching": True, "vllm": {"tool_call_parser": "qwen3_coder"}},
    }
    RunContext(validate_document(other), store).claim_spec(record=False)
    changed = {**doc, "execution": {**doc["execution"], "concurrency": 3}}
    with pytest.raises(SpecError, match=r"\$.execution.concurrency"):
        RunContext(validate_document(changed), store).claim_spec(record=False)


def test_vllm_launcher_serves_through_the_openai_server_module(tmp_path):
    """An interpreter that imports vllm is launched as `-m vllm.entrypoints.openai.api_server --model`
    (the CPU distribution's `vllm` CLI dies on its missing package metadata); one that does not is
    not a launcher."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    launcher = backends.vllm_launcher({"VLLM_PYTHON": str(python), "PATH": ""})
    assert launcher == [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert backends.vllm_command(launcher, "/m", "x", "127.0.0.1", 9, [])[:5] == [*launcher, "/m"]
    assert backends.vllm_launcher({"VLLM_PYTHON": sys.executable, "PATH": ""}) is None
