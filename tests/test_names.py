"""Every name the code uses is defined: a module split that moves a function but misses one of its
callers (a local import renamed in one loop and not the next) fails here, not in a pod at run time."""

from pathlib import Path

import pytest
from pyflakes import api, messages, reporter

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

ROOT = Path(__file__).resolve().parents[1]
UNDEFINED = (messages.UndefinedName, messages.UndefinedExport, messages.UndefinedLocal)


class Collect(reporter.Reporter):
    def __init__(self):
        super().__init__(None, None)
        self.found = []

    def flake(self, message):
        if isinstance(message, UNDEFINED):
            self.found.append(f"{message.filename}:{message.lineno}: {message.message % message.message_args}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")


def undefined_names(paths) -> list[str]:
    out = Collect()
    for path in paths:
        api.checkPath(str(path), out)
    return out.found


def test_no_module_uses_a_name_it_never_defines():
    files = sorted((ROOT / "mass_jobs").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    assert len(files) > 200
    assert undefined_names(files) == []


def test_the_check_sees_a_renamed_local_import(tmp_path):
    bad = tmp_path / "split.py"
    bad.write_text("def reap():\n    from os import getpid as me\n    return me()\n\n\ndef walk():\n    return me()\n")
    assert undefined_names([bad]) == [f"{bad}:7: undefined name 'me'"]
