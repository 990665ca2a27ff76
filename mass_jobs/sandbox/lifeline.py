"""Children that die with this process, even when it is SIGKILLed.

`spawn(cmd, **popen_kwargs)` is `subprocess.Popen(cmd, ...)` whose command is killed (its whole
process group when it leads one, e.g. `start_new_session=True`) as soon as this process dies by any
means. It runs `python -m mass_jobs.sandbox.lifeline FD -- cmd`, which forks a watcher and execs `cmd` (same
pid, exit status and process group as a plain Popen). The watcher blocks on a pipe whose only write
end this process holds: the kernel closes it when this process dies, the watcher reads EOF and
SIGKILLs the command. The watcher in turn dies with the command (PR_SET_PDEATHSIG). `run(cmd, ...)`
is the same for `subprocess.run`.

PR_SET_PDEATHSIG on the command alone would not do: it fires when the *thread* that spawned the
child exits (a pool worker that started a model server, say), not when the process does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import weakref
from typing import Any

PR_SET_PDEATHSIG = 1


def spawn(cmd: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """Popen(cmd, **popen_kwargs) that dies with this process; see the module docstring."""
    read_end, write_end = os.pipe()  # both non-inheritable: only read_end is passed on
    pass_fds = tuple(popen_kwargs.pop("pass_fds", ())) + (read_end,)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mass_jobs.sandbox.lifeline", str(read_end), "--", *cmd],
            pass_fds=pass_fds,
            **popen_kwargs,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    # Held open while the Popen object lives; `run` closes it at once.
    proc._lifeline = weakref.finalize(proc, os.close, write_end)  # type: ignore[attr-defined]
    return proc


def run(cmd: list[str], **popen_kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run(cmd) (no capture) through `spawn`."""
    with spawn(cmd, **popen_kwargs) as proc:
        try:
            proc.wait()
        except BaseException:
            proc.kill()
            raise
        finally:
            proc._lifeline()  # type: ignore[attr-defined]
    return subprocess.CompletedProcess(cmd, proc.returncode)


def _watch(fd: int, pid: int) -> None:
    """In the watcher: wait for EOF on the lifeline, then kill the command (group)."""
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the command ended: so do we
    if os.getppid() != pid:
        os._exit(0)
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)  # also kills this watcher, a member of the group
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(0)


def _main(argv: list[str]) -> None:
    fd, sep, cmd = int(argv[0]), argv[1], argv[2:]
    if sep != "--" or not cmd:
        sys.exit("usage: python -m mass_jobs.sandbox.lifeline FD -- CMD...")
    me = os.getpid()
    if os.fork() == 0:
        _watch(fd, me)
    os.close(fd)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    _main(sys.argv[1:])
