"""`mass validate`'s warning for a check that imports the episode's code into its own process.

A protected evaluator that imports the agent's module (`from controller import act`) runs it in the
evaluator's interpreter: it can patch what the evaluator imported or shadow a standard-library name,
and no guard sees that from outside (docs/running.md, "Writing a task's guards"). The policy host
(`mass_policy.Policy`) runs it in a process of its own instead. This reads each check command's
Python scripts that the task ships under a protected path, and names every module such a script
imports that is neither the standard library, an installed package, the policy host nor a module
the task itself ships protected: that is the episode's code.

What it cannot see: imports by a computed name (`importlib.import_module(name)`, `__import__`,
`runpy`, `exec(open(...).read())`), code a script reaches through a module it imports, scripts
the task does not ship, and commands that are not `python SCRIPT.py`; nor does it know whether
a workspace module of an installed package's name would shadow it. A quiet validate is no proof.
"""

from __future__ import annotations

import ast
import importlib.util
import shlex
import sys
from pathlib import PurePosixPath

HOST = "mass_policy"


def _protected(rel: str, protected: list[str]) -> bool:
    return any(rel == p.rstrip("/") or rel.startswith(p.rstrip("/") + "/") for p in protected)


def _imported(source: str) -> list[str]:
    """Top-level names of the modules a script imports by name (absolute imports only)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names))


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def in_process_imports(task) -> list[str]:
    """One warning per (check, script, module) of `task` that imports the episode's code in-process."""
    protected = task.guards.protected_paths
    shipped = {PurePosixPath(rel) for rel in task.files if _protected(rel, protected)}
    own = {p.stem for p in shipped if p.suffix == ".py"} | {part for p in shipped for part in p.parts[:-1]}
    out = []
    for check in task.guards.checks:
        try:
            words = shlex.split(check.command)
        except ValueError:
            continue
        for script in (w.removeprefix("./") for w in words if w.endswith(".py")):
            if script not in task.files or not _protected(script, protected):
                continue
            for name in _imported(task.files[script]):
                if name in sys.stdlib_module_names or name == HOST or name in own or _installed(name):
                    continue
                out.append(
                    f"task {task.id}: check {check.name}: {script} imports {name!r} into its own process, and "
                    f"{name!r} is no protected file of the task (the episode's code): what it does at import "
                    f"reaches the check; run it through the policy host (mass_policy.Policy, docs/running.md)"
                )
    return out


def check_import_warnings(spec) -> list[str]:
    return [w for task in spec.resolved_tasks() for w in in_process_imports(task)]
