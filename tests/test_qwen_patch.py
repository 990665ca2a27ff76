"""The pinned qwen-code bundle patched to take upstream's shell timeout (mass_jobs/episodes/qwen_patch.py):
what the patch changes, what it refuses, and the harness refusing a bundle without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mass_jobs.episodes import qwen_code, qwen_patch

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
DESCRIPTION = (
    "- You can specify an optional timeout. If not specified, commands will timeout after 120000ms (2 minutes).\n"
)


def bundle(tmp_path: Path, version: str = qwen_patch.RELEASE, text: str | None = None) -> Path:
    (tmp_path / "package.json").write_text(json.dumps({"name": "@qwen-code/qwen-code", "version": version}))
    cli = tmp_path / "cli.js"
    cli.write_text(
        text
        if text is not None
        else "function getShellToolDescription() {\n  return `" + DESCRIPTION + "`;\n}\n"
        "var DEFAULT_FOREGROUND_TIMEOUT_MS;\nDEFAULT_FOREGROUND_TIMEOUT_MS = 12e4;\n"
    )
    cli.chmod(0o755)
    return cli


def test_the_patch_makes_the_default_and_the_description_read_the_harness_value(tmp_path):
    cli = bundle(tmp_path)
    assert not qwen_patch.is_patched(cli)
    assert qwen_patch.patch(cli) is True and qwen_patch.patch(cli) is False  # idempotent
    text = cli.read_text()
    assert "DEFAULT_FOREGROUND_TIMEOUT_MS = Number(process.env.QWEN_SHELL_DEFAULT_TIMEOUT_MS) || 12e4;" in text
    assert "timeout after ${DEFAULT_FOREGROUND_TIMEOUT_MS}ms (${DEFAULT_FOREGROUND_TIMEOUT_MS / 6e4} minutes)" in text
    assert "120000ms" not in text and cli.stat().st_mode & 0o111


def test_the_patch_refuses_another_release_and_a_bundle_it_does_not_recognise(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(qwen_patch.PatchError, match="qwen-code '0.16.0', this patch is for 0.15.10"):
        qwen_patch.patch(bundle(tmp_path / "a", version="0.16.0"))
    cli = bundle(tmp_path / "b", text="DEFAULT_FOREGROUND_TIMEOUT_MS = 12e4;\n")
    with pytest.raises(qwen_patch.PatchError, match="expected 'If not specified.*found it 0 times"):
        qwen_patch.patch(cli)
    assert cli.read_text() == "DEFAULT_FOREGROUND_TIMEOUT_MS = 12e4;\n"  # nothing half-written
    assert qwen_patch.main([str(cli)]) == 1


def test_the_installed_bundle_is_patched():
    """make setup patched the install the harness runs (.tools/qwen-code)."""
    assert qwen_patch.is_patched(qwen_code.qwen_binary().resolve())


def test_the_harness_refuses_an_unpatched_bundle(tmp_path, monkeypatch):
    cli = bundle(tmp_path)
    monkeypatch.setenv("MASS_QWEN_BIN", str(cli))
    with pytest.raises(
        FileNotFoundError, match="lacks the shell-timeout patch: run `python3 mass_jobs/episodes/qwen_patch.py"
    ):
        qwen_code.qwen_binary()
    qwen_patch.patch(cli)
    qwen_code._patched.cache_clear()
    assert qwen_code.qwen_binary() == cli


def test_the_image_and_the_makefile_apply_the_patch():
    """Both installs of qwen-code run it: the sandbox image and make setup."""
    assert (
        "python3 mass_jobs/episodes/qwen_patch.py /usr/local/lib/node_modules/@qwen-code/qwen-code/cli.js"
        in (ROOT / "images" / "sandbox.Dockerfile").read_text()
    )
    makefile = (ROOT / "Makefile").read_text()
    assert "mass_jobs/episodes/qwen_patch.py $(NODE_DIR)/node_modules/@qwen-code/qwen-code/cli.js" in makefile
    assert "setup: bwrap $(STAMP) $(QWEN_PATCHED)" in makefile
