"""Orphans: a SIGKILLed caller must take its children with it (sandboxed commands and their
escapees, the `mass serve` a run or step started, anything spawned through mass_jobs.sandbox.lifeline)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def live_matching(needle: str) -> list[int]:
    """Pids of processes (zombies excluded: they are dead) whose command line contains `needle`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in cmdline and state != b"Z" and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def settle(needle: str, bound_s: float = 15.0) -> list[int]:
    """What still runs once the kernel had `bound_s` to deliver the deaths (returns early when none)."""
    end = time.monotonic() + bound_s
    while (alive := live_matching(needle)) and time.monotonic() < end:
        time.sleep(0.1)
    return alive


def start_driver(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, bound_s: float = 60.0) -> None:
    end = time.monotonic() + bound_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < end, f"driver never got to {path}"
        time.sleep(0.05)


SANDBOX_DRIVER = """
import sys
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed
run_sandboxed(sys.argv[2], sys.argv[1], SandboxLimits(timeout_s=600, cpu_s=600, processes=32))
"""


def test_sigkilled_caller_takes_the_sandbox_and_every_escapee_with_it(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    m = f"{300 + secrets.randbelow(1000) / 1000:.3f}"
    cmd = (
        f"sleep {m} & setsid sleep {m} & (sleep {m} &) ; nohup sleep {m} >/dev/null 2>&1 & echo up > started; sleep {m}"
    )
    driver = start_driver(SANDBOX_DRIVER, str(ws), cmd)
    wait_for(ws / "started", driver)
    assert len(live_matching(f"sleep {m}")) >= 4  # the background sleeps run (and shells waiting on them)
    assert live_matching(str(ws.resolve()))  # and bwrap with the workspace in its command line
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert settle(f"sleep {m}") == []
    assert settle(str(ws.resolve())) == []


def test_sigkilled_caller_during_a_fork_bomb_leaves_nothing(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    m = f"{400 + secrets.randbelow(1000) / 1000:.3f}"
    cmd = f"for i in $(seq 20); do sleep {m} & done; echo up > started; while :; do sleep {m} & done"
    driver = start_driver(SANDBOX_DRIVER, str(ws), cmd)
    wait_for(ws / "started", driver)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert settle(f"sleep {m}") == []


SERVE_DRIVER = """
import sys, time
from mass_jobs.serving.serve import ModelServer
srv = ModelServer(sys.argv[1], served_name="tiny", device="cpu").start()
print(srv.process.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow(cost=12)  # a run and its model server, killed: the slow tier (`make attack` runs it too)
def test_sigkilled_run_takes_its_mass_serve_child_with_it(tiny_model_dir):
    """`mass run` and the steps start `mass serve` through ModelServer (own session, so no
    terminal signal reaches it): the healthy server must die with a SIGKILLed caller."""
    driver = start_driver(SERVE_DRIVER, str(tiny_model_dir))
    pid = int(driver.stdout.readline())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"serve" in cmdline and str(tiny_model_dir).encode() in cmdline
    assert os.getsid(pid) == pid  # its own session: only the lifeline ends it
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert settle(str(tiny_model_dir)) == []


THREAD_DRIVER = """
import sys, threading, time
from mass_jobs.sandbox import lifeline
box = {}
t = threading.Thread(target=lambda: box.setdefault("p", lifeline.spawn(["sleep", sys.argv[1]], start_new_session=True)))
t.start(); t.join()  # the spawning thread is gone: PR_SET_PDEATHSIG alone would kill the child now
time.sleep(1.0)
print(box["p"].pid, box["p"].poll(), flush=True)
time.sleep(600)
"""


def test_a_child_outlives_the_thread_that_spawned_it_but_not_the_process():
    m = f"{500 + secrets.randbelow(1000) / 1000:.3f}"
    driver = start_driver(THREAD_DRIVER, m)
    pid, returncode = driver.stdout.readline().split()
    assert returncode == "None" and int(pid) in live_matching(f"sleep {m}")  # (and its watcher)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert settle(f"sleep {m}") == []


def test_lifeline_keeps_exit_codes_and_pids_of_a_plain_popen():
    from mass_jobs.sandbox import lifeline

    assert lifeline.run(["sh", "-c", "exit 7"]).returncode == 7
    proc = lifeline.spawn(["sh", "-c", "echo $$"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    assert int(out) == proc.pid and proc.returncode == 0
