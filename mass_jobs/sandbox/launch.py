"""The sandbox's launcher, run as a script by `mass_jobs.sandbox.run` (`python -I -S THIS --launch
CONFIG`), so only the standard library: it dies with its caller, sets the rlimits, drops to the
call's uid where bwrap does not, then execs the command."""

from __future__ import annotations

import json
import os
import signal
import sys

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def launch(config: dict) -> None:
    """Dies with the caller, sets the rlimits, drops to the uid where bwrap does not, then execs."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the caller died before the line above
        os._exit(137)
    # Python ignores these at startup and exec keeps ignored signals: give the command the defaults.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), tuple(value))
    if config["uid"] is not None:
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    try:
        os.chdir(config["cwd"])
        os.execv(config["argv"][0], config["argv"])
    except OSError as exc:  # e.g. no namespaces and the workspace lies under a dir the uid cannot enter
        os.write(2, f"sandbox: cannot start the command as uid {os.getuid()}: {exc}\n".encode())
        os._exit(126)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--launch":
    launch(json.loads(sys.argv[2]))
