"""Each container of the Argo templates calls a real `mass` CLI entry, with flags its --help lists.

Collected from argo/ (container templates, the PyTorchJob in the train step and the egress proxy's
Deployment), so a renamed
flag or entry fails here before it fails on a cluster.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mass_jobs.k8s import codegen, schemas
from tests.fixtures.k8s import load_docs


def _commands() -> dict[str, set[str]]:
    """'entry [sub]' -> flags used anywhere in argo/."""
    found: dict[str, set[str]] = {}
    docs = [d for text in codegen.argo_files().values() for d in load_docs(text)]
    argvs = []
    for doc in docs:
        for t in doc["spec"].get("templates", []):
            if "container" in t:
                argvs.append(t["container"]["command"] + t["container"].get("args", []))
        for inner in schemas.embedded_manifests(doc):
            for rs in (inner.get("spec", {}).get("pytorchReplicaSpecs") or {}).values():
                argvs += [c["command"] for c in rs["template"]["spec"]["containers"]]
            if inner.get("kind") == "Deployment" and "spec" in inner:  # the egress proxy
                argvs += [c["command"] + c.get("args", []) for c in inner["spec"]["template"]["spec"]["containers"]]
    for argv in argvs:
        assert "mass" in argv, f"container does not run the mass CLI: {argv}"
        rest = argv[argv.index("mass") + 1 :]
        entry = " ".join(rest[:2]) if rest[0] == "render" else rest[0]
        found.setdefault(entry, set()).update(a.split("=")[0] for a in rest if a.startswith("--"))
    return found


COMMANDS = _commands()


def test_every_step_of_the_cycle_has_an_entry():
    assert set(COMMANDS) == {
        "validate",
        "search",
        "collect",
        "episode",
        "guard",
        "rank",
        "render sft",
        "train",
        "select",
        "merge",
        "evaluate",
        "report",
        "egress-serve",
        "serve-wait",
    }


@pytest.mark.parametrize("entry", sorted(COMMANDS))
def test_container_command_is_a_real_cli_entry(entry):
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", *entry.split(), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"`mass {entry} --help` failed: {proc.stderr[-800:]}"
    missing = sorted(COMMANDS[entry] - documented_flags(proc.stdout))
    assert not missing, f"`mass {entry}` does not document {missing}"


def documented_flags(help_text: str) -> set[str]:
    """Whole option tokens of a --help text: `--gen` is not documented by `--generation-endpoint`."""
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))


def test_a_flag_is_matched_whole_not_as_a_prefix():
    text = "usage: mass evaluate [--generation-endpoint G URL NAME] [--spec SPEC]\n  --agent-pods  run pods"
    assert documented_flags(text) == {"--generation-endpoint", "--spec", "--agent-pods"}
    assert "--gen" not in documented_flags(text) and "--agent" not in documented_flags(text)
