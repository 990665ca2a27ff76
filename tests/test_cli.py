"""Every registered `mass` entry is importable and its --help runs (Argo containers call them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mass_jobs.commands.cli import COMMANDS


def test_top_level_help_lists_every_command():
    out = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    listed = out.split("positional arguments:\n  COMMAND\n", 1)[1].split("\n\n")[0].splitlines()
    names = [line.split()[0] for line in listed if line.startswith("    ") and not line.startswith(" " * 5)]
    assert names == list(COMMANDS)  # each once, in the table's order (a help line's wrap is indented deeper)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_runs(name):
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", name, "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert f"mass {name}" in proc.stdout


def test_the_dispatcher_and_help_import_only_the_standard_library():
    """`mass --help` must run where no dependency is importable yet (an image's code check in a pod)."""
    probe = (
        "import sys, mass_jobs.commands.cli as c\n"
        "c.build_parser()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'mass_jobs'}\n"
        "             - {m for m in sys.modules if m.startswith('_')}))"
    )  # the interpreter's site hooks
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_command_is_a_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "frobnicate"], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "invalid choice" in proc.stderr
