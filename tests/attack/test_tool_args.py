"""Tool arguments: what a model passes to the file and shell tools (a file used as a folder,
over-long names, deep paths, symlink loops, lone surrogates, FIFOs, a dangling or escaping `.tmp`
link, huge files and commands) ends as a tool error the model sees, never as the episode's
`infra_error`, and no tool call blocks past its deadline."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
from pathlib import Path

import pytest

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.harness import OUTCOMES, EpisodeInput, run_episode, validate_status
from mass_jobs.serving.proxy import read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply

LIMITS = EpisodeLimits(wall_s=120, request_timeout_s=20, request_retries=0, shell_timeout_s=60, cpu_s=5, loop_repeats=3)


def attack(scripted_endpoint, tmp_path, *calls: Reply) -> tuple[dict, list[str]]:
    """One worker makes `calls` then finishes; returns (status, the worker's tool results in order).
    The episode runs in a thread so that a tool call that blocks shows as a failure, not a hang."""
    ep = scripted_endpoint(
        {
            "orchestrator": [
                Reply.call("delegate", agent_id="w", role="attacker", assignment="attack"),
                Reply.call("finish", summary="done"),
            ],
            "w": [*calls, Reply.call("finish", summary="attacked")],
        }
    )
    inp = EpisodeInput(prompt="go", endpoint=ep.endpoint, limits=LIMITS, sampling=Sampling())
    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault("r", run_episode(inp, tmp_path / "ws", tmp_path / "out")), daemon=True
    )
    t.start()
    t.join(LIMITS.wall_s + 60)
    assert not t.is_alive(), "a tool call blocked past the episode's wall limit"
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    validate_status(status)
    worker = [r for r in read_trace(tmp_path / "out" / "trace.jsonl") if (r["agent"] or {}).get("id") == "w"]
    results = [m["content"] for m in worker[-1]["request"]["messages"] if m["role"] == "tool"]
    assert len(results) == len(calls)
    # the episode ends normally; one that only drew tool errors did no work
    acted = any(not r.startswith("ERROR:") for r in results)
    assert status["outcome"] in OUTCOMES and status["outcome"] == ("success" if acted else "no_work"), status
    return status, results


def sh(cmd: str) -> Reply:
    return Reply.call("shell", command=cmd)


def errors(results: list[str]) -> list[bool]:
    return [r.startswith("ERROR:") for r in results]


def test_file_used_as_a_folder(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        Reply.call("write_file", path="a.txt", content="x"),
        Reply.call("write_file", path="a.txt/b.txt", content="y"),
        Reply.call("read_file", path="a.txt/b.txt"),
        Reply.call("list_files", path="a.txt"),
        Reply.call("write_file", path="a.txt/deeper/c.txt", content="z"),
    )  # fmt: skip
    assert errors(res) == [False, True, True, True, True]
    assert "Not a directory" in res[1] or "File exists" in res[1]
    assert (tmp_path / "ws" / "a.txt").read_text() == "x"


def test_over_long_names_and_paths(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        Reply.call("write_file", path="n" * 300, content="x"),
        Reply.call("write_file", path="/".join(["d"] * 2000), content="x"),
        Reply.call("read_file", path="r" * 5000),
        Reply.call("list_files", path="/".join(["e"] * 100)),
        Reply.call("write_file", path="é" * 200 + ".txt", content="x"),  # 400 bytes, 204 characters
    )  # fmt: skip
    assert errors(res) == [True] * 5
    assert "255 bytes" in res[0] and "too long" in res[1] and "too long" in res[2]


@pytest.fixture
def deep_tree_cleanup(tmp_path):
    yield
    # Whatever happened: Python's rmtree (pytest's tmp cleanup) would exhaust its stack on the tree.
    subprocess.run(["rm", "-rf", str(tmp_path / "ws" / "d")], check=False)


def test_deep_tree_made_by_the_shell_is_listed_and_read_without_a_crash(scripted_endpoint, tmp_path, deep_tree_cleanup):
    """1500 levels: past Python's recursion limit (the harness once walked the workspace with os.walk)."""
    deep = "import os\nfor i in range(1500):\n    os.mkdir('d'); os.chdir('d')\nopen('leaf.txt', 'w').write('x')\n"
    _, res = attack(
        scripted_endpoint, tmp_path,
        Reply.call("write_file", path="deep.py", content=deep),
        sh("python deep.py && echo made"),
        Reply.call("list_files", path="."),
        Reply.call("read_file", path="/".join(["d"] * 1500) + "/leaf.txt"),
        sh("echo next-call-works"),
    )  # fmt: skip
    assert errors(res) == [False, False, False, True, False] and "next-call-works" in res[4]
    assert "made" in res[1] and "deep.py" in res[2]


def test_symlink_loop(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("ln -s loop1 loop2 && ln -s loop2 loop1 && ln -s self self && echo ok"),
        Reply.call("read_file", path="loop1"),
        Reply.call("write_file", path="loop1", content="x"),
        Reply.call("write_file", path="loop1/x.txt", content="x"),
        Reply.call("list_files", path="self"),
        Reply.call("list_files", path="."),
    )  # fmt: skip
    assert errors(res) == [False, True, True, True, True, False]


def test_lone_surrogates_in_content_path_and_command(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        Reply.call("write_file", path="s.txt", content="bad \ud800 text"),
        Reply.call("write_file", path="\udcff.txt", content="x"),
        Reply.call("read_file", path="\ud800"),
        sh("echo \udc80"),
        Reply.call("write_file", path="ok.txt", content="fine \U0001f600"),
    )  # fmt: skip
    assert errors(res) == [True, True, True, True, False]
    assert "not valid Unicode" in res[0]
    assert (tmp_path / "ws" / "ok.txt").read_text() == "fine \U0001f600"


def test_dangling_tmp_link_made_by_the_agent(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("ln -s /nonexistent/place .tmp && echo linked"),
        sh("echo still-works"),
        Reply.call("write_file", path=".tmp", content="x"),
    )  # fmt: skip
    assert errors(res) == [False, False, True]
    assert "still-works" in res[1]


def test_tmp_link_to_a_host_dir_creates_nothing_there(scripted_endpoint, tmp_path):
    target = Path(f"/var/tmp/mass-attack-{secrets.token_hex(4)}")
    target.mkdir()
    try:
        _, res = attack(
            scripted_endpoint, tmp_path,
            sh(f"ln -s {target} .tmp && echo linked"),
            sh("echo x > $TMPDIR/f && echo still-works"),
        )  # fmt: skip
        assert errors(res) == [False, False] and "still-works" in res[1]
        assert list(target.iterdir()) == []
    finally:
        target.rmdir()


def test_fifo_write_and_read_do_not_hang(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("mkfifo p && ln -s p plink && echo made"),
        Reply.call("write_file", path="p", content="x" * 100_000),
        Reply.call("read_file", path="p"),
        Reply.call("write_file", path="plink", content="x"),
        Reply.call("read_file", path="plink"),
        Reply.call("list_files", path="."),
    )  # fmt: skip
    assert errors(res) == [False, True, True, True, True, False]
    assert "not a regular file" in res[1] or "No such device" in res[1]


def test_links_to_devices_and_host_files_are_escapes(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("ln -s /dev/zero z; ln -s /etc/hostname h; ln -s /etc e; echo ok"),
        Reply.call("read_file", path="z"),
        Reply.call("read_file", path="h"),
        Reply.call("write_file", path="e/mass-attack", content="x"),
        Reply.call("write_file", path="h", content="x"),
    )  # fmt: skip
    assert errors(res) == [False, True, True, True, True]
    assert all("outside the workspace" in r for r in res[1:])
    assert not Path("/etc/mass-attack").exists()


def test_huge_file_is_read_in_bounded_pieces(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("head -c 50000000 /dev/zero | tr '\\0' a > big && echo made"),
        Reply.call("read_file", path="big"),
        sh("head -c 3000000 /dev/urandom > bin && echo made"),
        Reply.call("read_file", path="bin"),
    )  # fmt: skip
    assert errors(res) == [False, False, False, False]
    assert len(res[1]) < 20_000 and len(res[3]) < 20_000


def test_commands_with_nul_or_over_exec_limits(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("echo a\x00b"),
        sh("echo " + "x" * 200_000),
        sh("   "),
        sh("echo " + "y" * 60_000 + " | wc -c"),
    )  # fmt: skip
    assert errors(res) == [True, True, True, False]
    assert "NUL" in res[0] and "script file" in res[1] and "60001" in res[3]


def test_wrong_argument_types_and_empty_paths(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        Reply.call("write_file", path=["a"], content="x"),
        Reply.call("write_file", path="b.txt", content={"x": 1}),
        Reply.call("read_file", path=None),
        Reply.call("write_file", path="", content="x"),
        Reply.call("write_file", path=".", content="x"),
        Reply.call("shell", command=12),
        Reply.call("delegate", agent_id="x\n" * 5000, assignment=""),
    )  # fmt: skip
    assert errors(res) == [True] * 7


def test_shell_killed_by_a_limit_is_a_tool_error_not_an_episode_error(scripted_endpoint, tmp_path):
    _, res = attack(
        scripted_endpoint, tmp_path,
        sh("python -c 'while True: pass'"),
        sh("yes >&2"),
        sh("echo after"),
    )  # fmt: skip
    assert errors(res) == [True, True, False]
    assert "killed: cpu_limit" in res[0] or "killed: wall_timeout" in res[0]
    assert "killed: output_limit" in res[1] and "after" in res[2]


@pytest.mark.parametrize("name", ["..", ".", "a/../..", "~root", "/etc/passwd", "a\x00b"])
def test_path_escapes_are_tool_errors(scripted_endpoint, tmp_path, name):
    _, res = attack(scripted_endpoint, tmp_path, Reply.call("write_file", path=name, content="x"))
    assert errors(res) == [True]
