"""The style gate of the fast tier: ruff's linter and formatter over the code and the tests
([tool.ruff] in pyproject.toml), and the size of modules and functions. A module or function over its cap is
named below with why it stays whole; the list is exact, so a new long one fails and one that got
shorter must leave it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 450
FUNCTION_LINES = 60

# module -> why it is longer than MODULE_LINES
LONG_MODULES = {
    "mass_jobs/config/run_spec.py": "the run spec's models: one class per spec section, read as the schema's source",
    "mass_jobs/k8s/argo.py": "the cycle's WorkflowTemplate: one method per template, each a page of Argo fields",
    "mass_jobs/k8s/preflight.py": "every offline cluster check beside the chart value it reads",
    "mass_jobs/sandbox/run.py": "one sandboxed command: namespaces, limits and their accounting in one place",
    "mass_jobs/serving/proxy.py": "the recording proxy: request checks, streaming and the record in one handler",
}
# module:function -> why it is longer than FUNCTION_LINES
LONG_FUNCTIONS = {
    "mass_jobs/commands/episode.py:main": "the agent pod's entry: read, run, sign and write in order",
    "mass_jobs/commands/plan.py:main": "a command's table of rows",
    "mass_jobs/commands/validate.py:main": "the offline and live preflight and the outputs Argo reads",
    "mass_jobs/episodes/audit.py:audit_records": "one pass over a trace's records",
    "mass_jobs/episodes/sandbox_local.py:local_sandbox": "the sandbox container's start-up in order",
    "mass_jobs/k8s/agent_template.py:agent_container": "the agent pod's containers, field by field",
    "mass_jobs/k8s/argo.py:trainer": "the PyTorchJob's fields",
    "mass_jobs/k8s/settings.py:values_settings": "one line per chart value",
    "mass_jobs/pipeline/planning/memory.py:training_memory": "the training memory formula, term by term",
    "mass_jobs/serving/request_checks.py:invalid_request_reason": "one check per request field vLLM refuses",
    "mass_jobs/serving/serve.py:make_chat_handler_class": "the HTTP handler class the server serves",
    "mass_jobs/spec/rules.py:cross_field_issues": "one rule per pair of fields",
    "mass_jobs/steps/render_sft.py:render_episode": "an episode's threads rendered in order",
    "mass_jobs/steps/report_figures.py:figures": "one block per figure",
    "mass_jobs/steps/sft_tokens.py:cut_windows": "the upstream window cutting, transcribed",
    "mass_jobs/tools/testing/scripted_endpoint.py:_handler_for": "the scripted endpoint's HTTP handler class",
}


def sizes(root: Path, package: str = "mass_jobs") -> tuple[dict[str, int], dict[str, int]]:
    """(module -> lines, module:function -> lines) of every module and function over its cap."""
    modules, functions = {}, {}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        source = path.read_text()
        if (n := len(source.splitlines())) > MODULE_LINES:
            modules[rel] = n
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > FUNCTION_LINES:
                    functions[f"{rel}:{node.name}"] = n
    return modules, functions


def test_ruff_finds_nothing():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "mass_jobs", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.unit
def test_modules_and_functions_over_their_caps_are_the_named_ones():
    modules, functions = sizes(ROOT)
    assert sorted(modules) == sorted(LONG_MODULES), {
        "over, not named": sorted(set(modules) - set(LONG_MODULES)),
        "named, not over": sorted(set(LONG_MODULES) - set(modules)),
    }
    assert sorted(functions) == sorted(LONG_FUNCTIONS), {
        "over, not named": {f: functions[f] for f in sorted(set(functions) - set(LONG_FUNCTIONS))},
        "named, not over": sorted(set(LONG_FUNCTIONS) - set(functions)),
    }


@pytest.mark.unit
def test_the_size_gate_sees_a_long_function_and_a_long_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (tmp_path / "pkg" / "m.py").write_text("def short():\n    return 1\n\n\ndef long():\n" + body)
    (tmp_path / "pkg" / "big.py").write_text("X = 1\n" * (MODULE_LINES + 1))
    modules, functions = sizes(tmp_path, "pkg")
    assert modules == {"pkg/big.py": MODULE_LINES + 1}
    assert functions == {"pkg/m.py:long": FUNCTION_LINES + 1}


def test_ruff_refuses_what_the_config_selects(tmp_path):
    """The gate is live: an unused import and an unsorted import block fail under the project's config."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport json\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "F401" in proc.stdout and "I001" in proc.stdout


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_the_formatter_finds_nothing_to_change():
    proc = ruff("format", "--check", "--no-cache", "mass_jobs", "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_formatter_refuses_what_it_would_change(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = {'a':1}\n")
    proc = ruff("format", "--check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert proc.returncode == 1 and "1 file would be reformatted" in proc.stdout
