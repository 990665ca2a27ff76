"""The unit tier keeps its mark honest (tests/fixtures/unit.py): a unit test that starts a process or
listens on a socket fails, naming itself and what it started."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.fixtures.unit import NotUnit

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(
        NotUnit,
        match=r"test_unit_tier.py::test_a_unit_test_cannot_start_a_process is marked unit "
        r"but starts a process",
    ):
        subprocess.run(["true"], check=True)


def test_a_unit_test_cannot_serve():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(NotUnit, match="listens on a socket"):
            s.listen()
