"""`mass validate` warns where a protected check script imports the episode's code into its own
process (mass_jobs/spec/check_imports.py), and is quiet for the policy-host pattern."""

from __future__ import annotations

import pytest
import yaml

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.config.task_spec import Task
from mass_jobs.spec.check_imports import in_process_imports

EVALUATE = (
    "import json\nimport sys\nsys.path.insert(0, 'sim')\nimport push\n"
    "sys.path.insert(0, 'src')\nfrom controller import act\nimport numpy\n"
)
HOSTED = "import json\nfrom mass_policy import Policy\nimport sys\nsys.path.insert(0, 'sim')\nimport push\n"


def task(evaluate: str, command: str = "python3 checks/evaluate.py", protected=("sim", "checks")) -> dict:
    return {
        "id": "push",
        "split": "train",
        "prompt": "Write src/controller.py.",
        "files": {"sim/push.py": "def step(s, a):\n    return s\n", "checks/evaluate.py": evaluate},
        "guards": {"protected_paths": list(protected), "checks": [{"name": "recompute", "command": command}]},
    }


@pytest.mark.unit
def test_an_in_process_import_of_the_episode_s_code_is_named():
    assert in_process_imports(Task.model_validate(task(EVALUATE))) == [
        "task push: check recompute: checks/evaluate.py imports 'controller' into its own process, and 'controller' "
        "is no protected file of the task (the episode's code): what it does at import reaches the check; run it "
        "through the policy host (mass_policy.Policy, docs/running.md)"
    ]


@pytest.mark.unit
def test_the_policy_host_stdlib_installed_and_shipped_protected_modules_are_not():
    assert in_process_imports(Task.model_validate(task(HOSTED))) == []
    # an unprotected script is no evaluator the episode cannot change (the protected-path guard's case)
    assert in_process_imports(Task.model_validate(task(EVALUATE, protected=("sim",)))) == []
    # a command that is not a script run (what the warning cannot see, docs/running.md)
    assert in_process_imports(Task.model_validate(task(EVALUATE, command="python3 -c 'import controller'"))) == []


def test_mass_validate_prints_the_warning_and_still_exits_0(tmp_path, capsys):  # probes bwrap: not unit
    (tmp_path / "model").mkdir()
    spec = {
        "name": "imports",
        "model": {"base": str(tmp_path / "model")},
        "tasks": [task(EVALUATE)],
        "store": {"uri": f"file://{tmp_path}/store"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert cli_main(["validate", str(tmp_path / "spec.yaml"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: task push: check recompute: checks/evaluate.py imports 'controller'")
