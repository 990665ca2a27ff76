"""Guard check commands as a job of their own: the task's `guards.checks` run in a finished
episode's workspace, one after another, each with the sandbox of agent shell calls.

A check runs code the model wrote (a test suite over its files, its own scripts), so on the
cluster it runs where agent code runs: an agent pod, through the same `mass episode --in DIR
--out DIR [--sandbox SOCKET]`, whose `DIR/episode.json` is then a checks file:

    {"checks": [{"name", "command", "timeout_s"}, ...], "limits": EpisodeLimits}

with the episode's stored workspace archive as `DIR/workspace.tar.gz`. The result,
`OUT/checks.json`, is written by the harness side only: {"checks": [{"name", "exit_code",
"detail"}], "digest"} in the declared order; `digest` names the checks it answers, so a result
for checks since changed is never taken. Each check runs on a fresh copy of the workspace, and in
the sandbox container no process of one check outlives it (the service reaps them), so a check
cannot tamper with the next one's run; a sandbox that stops answering fails the remaining checks.
Its interpreters put the workspace last on sys.path and its pytest reads no workspace conftest or
ini file (CHECK_ENV): a module named like the standard library's is not what a check imports.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import Field

from mass_jobs.config.errors import SandboxError
from mass_jobs.config.run_spec import EpisodeLimits
from mass_jobs.config.shared import Closed
from mass_jobs.config.task_spec import CheckCommand
from mass_jobs.sandbox.run import POLICY_SITE, SandboxLimits, run_sandboxed

DETAIL_CHARS = 300


class ChecksFile(Closed):
    """`episode.json` of a checks job."""

    checks: list[CheckCommand] = Field(min_length=1)
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    protected: list[str] = Field(
        default_factory=list, description="The task's protected paths: read-only to each check."
    )


def is_checks_file(data: Any) -> bool:
    return isinstance(data, dict) and "checks" in data and "prompt" not in data


def load_checks_file(path: Path) -> ChecksFile | None:
    """The checks job in `path`, None when it holds an episode; ValueError names each bad field."""
    from pydantic import ValidationError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read JSON: {exc}") from None
    if not is_checks_file(data):
        return None
    try:
        return ChecksFile.model_validate(data)
    except ValidationError as exc:
        lines = [f"$.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ValueError(f"{path}: invalid checks file:\n" + "\n".join(lines)) from None


class fresh_copy:
    """A copy of a finished workspace for one check (links copied as links, special files and
    Python bytecode left out), removed after it: what one check's run of the episode's code writes,
    the next never sees, the workspace the guard reads is never the one a check ran in, and a
    check imports the sources it can see, not a .pyc the agent compiled from other ones."""

    def __init__(self, workspace: Path):
        self.workspace = Path(workspace)

    def __enter__(self) -> Path:
        import shutil
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="mass-check-")
        copy = Path(self._tmp.name) / "workspace"
        shutil.copytree(
            self.workspace,
            copy,
            symlinks=True,
            ignore=lambda d, names: [n for n in names if _is_special(Path(d) / n) or _is_bytecode(n)],
        )
        return copy

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()


def _is_bytecode(name: str) -> bool:
    return name == "__pycache__" or name.endswith((".pyc", ".pyo"))


def _is_special(path: Path) -> bool:
    import stat

    mode = path.lstat().st_mode
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def checks_digest(checks: list[CheckCommand]) -> str:
    doc = [c.model_dump(mode="json") for c in checks]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# A check's interpreters: the workspace never ahead of the standard library or installed packages
# (check_site/sitecustomize.py), and pytest without the workspace's conftest files and ini files
# (an unprotected conftest.py can rewrite every report; an ini file can add options or plugins) and
# appending test directories to sys.path rather than prepending them.
CHECK_SITE = Path(__file__).resolve().parent / "check_site"
CHECK_ENV = {
    "PYTHONSAFEPATH": "1",
    "PYTHONPATH": os.pathsep.join([str(CHECK_SITE), str(POLICY_SITE)]),
    "PYTEST_ADDOPTS": "--noconftest -c /dev/null --rootdir=. --import-mode=append -p no:cacheprovider",
}


def run_check(check: CheckCommand, workspace: Path, limits: EpisodeLimits, protected=()) -> tuple[int, str]:
    """(exit code, short description when it failed) of one check, sandboxed in `workspace`, with the
    task's `protected` paths read-only: a check never changes what it checks, and a hardened one
    (`python -I`, which ignores PYTHONPYCACHEPREFIX) leaves no bytecode there to count as a change."""

    sandbox = SandboxLimits.from_episode_limits(
        limits,
        timeout_s=check.timeout_s,
        extra_env=dict(CHECK_ENV),
        read_only=(str(CHECK_SITE),),
        read_only_paths=tuple(protected),
    )
    res = run_sandboxed(check.command, workspace, sandbox)
    if res.timed_out:
        return (res.exit_code if res.exit_code not in (0, None) else 124), f"timed out after {check.timeout_s:g}s"
    tail = (res.stderr or res.stdout or "").strip()[-DETAIL_CHARS:]
    return (res.exit_code if res.exit_code is not None else 1), tail


def run_checks(job: ChecksFile, workspace: Path, out_dir: Path, sandbox=None) -> dict:
    """Every check of `job` in order, here or in the sandbox container; writes OUT/checks.json."""

    results = []
    lost = None
    if sandbox is not None:
        try:
            sandbox.wait_ready()
            sandbox.put_workspace(workspace)
        except SandboxError as exc:
            lost = str(exc)
    for check in job.checks:
        if lost is not None:
            code, detail = 1, f"not run: the sandbox failed ({lost})"[:DETAIL_CHARS]
        elif sandbox is None:
            with fresh_copy(workspace) as copy:
                code, detail = run_check(check, copy, job.limits, job.protected)
        else:
            try:
                code, detail = sandbox.check(check, job.limits, job.protected)
            except SandboxError as exc:
                lost = str(exc)
                code, detail = 1, f"the sandbox failed: {exc}"[:DETAIL_CHARS]
        results.append({"name": check.name, "exit_code": int(code), "detail": str(detail)[-DETAIL_CHARS:]})
    doc = {"checks": results, "digest": checks_digest(job.checks)}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "checks.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def validate_results(doc: Any, checks: list[CheckCommand]) -> dict[str, tuple[int, str]]:
    """name -> (exit code, detail) of a checks.json answering exactly `checks`; ValueError otherwise."""
    if not isinstance(doc, dict) or doc.get("digest") != checks_digest(checks):
        raise ValueError("checks.json does not answer the task's current checks")
    rows = doc.get("checks")
    if not isinstance(rows, list) or [r.get("name") if isinstance(r, dict) else None for r in rows] != [
        c.name for c in checks
    ]:
        raise ValueError(f"checks.json: expected results for {[c.name for c in checks]} in that order")
    out = {}
    for r in rows:
        code, detail = r.get("exit_code"), r.get("detail")
        if isinstance(code, bool) or not isinstance(code, int) or not isinstance(detail, str):
            raise ValueError(f"checks.json: {r.get('name')}: expected an integer exit_code and a string detail")
        out[r["name"]] = (code, detail[-DETAIL_CHARS:])
    return out
