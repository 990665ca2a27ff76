"""Start-up of every Python process a guard check runs: the workspace goes to the end of sys.path.

A check's environment names this directory in PYTHONPATH and sets PYTHONSAFEPATH=1, so Python puts
neither the script's directory nor the working directory first. This module (imported by `site` at
start-up, before any of the check's code) appends the entry Python would have prepended instead.
The workspace's modules stay importable; none stands in for the standard library or an installed
package (a `json.py`, a `numpy/` of the agent's). A workspace `sitecustomize.py` is never imported:
at start-up no workspace entry is on sys.path yet.
"""

import os
import sys

OPTIONS_WITH_VALUE = ("-X", "-W", "-Q")


def workspace_entry(argv: list[str]) -> str:
    """What Python would put first on sys.path for this command line (sys.orig_argv[1:])."""
    args = iter(argv)
    for a in args:
        if a in ("-c", "-m") or a.startswith(("-c", "-m")) and not a.startswith("--"):
            return os.getcwd()
        if a in OPTIONS_WITH_VALUE:
            next(args, None)
        elif a == "-" or not a.startswith("-"):
            return os.getcwd() if a == "-" else os.path.dirname(os.path.abspath(a))
    return os.getcwd()


if os.environ.get("PYTHONSAFEPATH"):
    _entry = workspace_entry(list(getattr(sys, "orig_argv", sys.argv))[1:])
    if _entry not in sys.path:
        sys.path.append(_entry)
