"""The policy host: a protected evaluator runs the episode's code in a process of its own.

An evaluator that imports the agent's controller (`from controller import act`) runs that code in
its own interpreter: whatever it does at import or call time (patch the simulator the evaluator
imported, replace `json` or `math`, rewrite a global) happens to the evaluator, and no guard can see
it from outside. With the policy host the evaluator never imports it:

    from mass_policy import Policy

    with Policy("src/controller.py", "act", timeout_s=5) as act:
        action = act(state)  # the state goes out as JSON, the action comes back as JSON

The policy runs in a fresh interpreter (`-I`: no environment variables of Python's, no user site,
its own folder last on sys.path) that loads the file by path and answers one JSON line per call;
its prints go to stderr, never into the answers. A crash, an answer that is not JSON, or a call
past `timeout_s` raises PolicyError; the process is killed when the block ends. What the policy can
still do is what any process of the sandbox can: read the workspace, burn its share of the limits.
Every sandboxed Python (agent shells and guard checks) finds this module on PYTHONPATH.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys

CHILD = r"""
import importlib.util, json, os, sys
path, name = sys.argv[1], sys.argv[2]
sys.path.append(os.path.dirname(os.path.abspath(path)))
spec = importlib.util.spec_from_file_location("policy", path)
module = importlib.util.module_from_spec(spec)
answers, sys.stdout = sys.stdout, sys.stderr
spec.loader.exec_module(module)
policy = getattr(module, name)
for line in sys.stdin:
    answers.write(json.dumps(policy(json.loads(line)), allow_nan=False) + "\n")
    answers.flush()
"""


class PolicyError(RuntimeError):
    """The policy process crashed, answered something that is not JSON, or did not answer in time."""


class Policy:
    """`with Policy(path, name) as call:` call(state) -> the policy's answer; see the module docstring."""

    def __init__(self, path: str, name: str = "act", timeout_s: float = 10.0, python: str | None = None):
        self.path, self.name, self.timeout_s = path, name, timeout_s
        self.python = python or sys.executable
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [self.python, "-I", "-c", CHILD, self.path, self.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def __call__(self, state):
        proc = self.proc
        if proc is None:
            raise PolicyError("the policy is not running: use `with Policy(...) as call:`")
        try:
            proc.stdin.write(json.dumps(state, allow_nan=False) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise PolicyError(f"{self.path}: the policy process exited with code {proc.poll()}") from None
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
        if not ready:
            raise PolicyError(f"{self.path}: no answer within {self.timeout_s:g} s")
        line = proc.stdout.readline()
        if not line:
            raise PolicyError(f"{self.path}: the policy process exited with code {proc.wait()}")
        try:
            return json.loads(line)
        except ValueError:
            raise PolicyError(f"{self.path}: answered {line[:200]!r}, not JSON") from None
