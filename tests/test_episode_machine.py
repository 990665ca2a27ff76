"""The episode's machine as the spec sets it (execution.limits): paper.yaml's lets the footprint of
`uv add torch` through where the defaults refuse it, the spec's environment reaches every command,
the names the sandbox sets are refused, and the new fields leave step hashes of stores made before
them as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from mass_jobs.config.run_spec import MACHINE_FIELDS, SANDBOX_ENV, EpisodeLimits
from mass_jobs.sandbox.egress_relay import sandbox_proxy_env
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed, sandbox_env
from mass_jobs.spec.load import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[1]

# `uv add torch` with CUDA 12 wheels, as apparent sizes (sparse files: the quotas count apparent
# bytes): uv's cache holds the ~3 GB of wheels, the venv ~7.5 GB unpacked, the largest file
# (libtorch_cuda.so) ~1.5 GB. What an episode's machine must hold for six of the paper's tasks.
UV_ADD_TORCH = (
    "mkdir -p $XDG_CACHE_HOME/uv .venv/lib/torch && "
    "truncate -s 3000M $XDG_CACHE_HOME/uv/wheels && "
    "truncate -s 1500M .venv/lib/torch/libtorch_cuda.so && truncate -s 6000M .venv/lib/rest && "
    "echo $OMP_NUM_THREADS $LOKY_MAX_CPU_COUNT $CUDA_VISIBLE_DEVICES"
)


@pytest.fixture
def ws(tmp_path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


def test_the_papers_machine_holds_a_torch_install_and_its_pins(ws):
    limits = load_spec(ROOT / "examples" / "paper.yaml").execution.limits
    r = run_sandboxed(UV_ADD_TORCH, ws, SandboxLimits.from_episode_limits(limits, timeout_s=120))
    assert r.exit_code == 0 and r.killed_reason is None, (r.stderr, r.note)
    assert r.stdout.split() == ["2", "4", "0"]  # upstream's thread pins and its one GPU
    assert r.applied["scratch"]["on"] == "disk" and r.applied["rlimits"]["RLIMIT_AS"] == -1


def test_the_default_machine_refuses_it(ws):
    r = run_sandboxed(UV_ADD_TORCH, ws, SandboxLimits.from_episode_limits(EpisodeLimits(), timeout_s=120))
    assert r.exit_code != 0 and r.killed_reason == "file_size_limit", (r.stderr, r.note)
    assert r.applied["scratch"] == {"path": "/tmp", "on": "memory", "mb": 256}


def test_every_name_the_sandbox_sets_is_refused_by_the_spec(tmp_path):
    owned = {*sandbox_env(tmp_path, tmp_path, path_first="/x"), *sandbox_proxy_env()}
    for name in owned:
        with pytest.raises(ValidationError, match=f"env.{name}"):
            EpisodeLimits(env={name: "1"})
    assert {n for n in owned if n.isupper() and not n.startswith("PYTHON")} <= SANDBOX_ENV
    assert EpisodeLimits(env={"OMP_NUM_THREADS": "2", "TZ": "UTC"}).env["TZ"] == "UTC"


def test_a_bad_env_name_names_the_field(tmp_path):
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["execution"]["limits"]["env"] = {"PYTHONPATH": "/x"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path / "s.yaml")
    assert "$.execution.limits.env" in str(err.value) and "PYTHONPATH: expected a name the sandbox does not set" in str(
        err.value
    )


def test_the_machine_enters_step_inputs_only_where_set():
    default = EpisodeLimits()
    assert set(default.as_input()) == set(default.model_dump()) - set(MACHINE_FIELDS)
    changed = EpisodeLimits(scratch="disk", env={"OMP_NUM_THREADS": "2"})
    assert changed.as_input()["scratch"] == "disk" and changed.as_input()["env"] == {"OMP_NUM_THREADS": "2"}
    assert "workspace_mb" not in changed.as_input()
