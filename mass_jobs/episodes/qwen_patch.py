"""qwen-code's shell timeout as upstream sets it: a reproducible patch of the pinned bundle.

The paper's runtime gives qwen-code `tools.shell.defaultTimeoutMs: 600000`; the pinned 0.15.10 has no
such setting: a shell command without its own timeout dies at 120 s, and every request's tool
description says so. This patch makes the bundle's default read `QWEN_SHELL_DEFAULT_TIMEOUT_MS` (the
harness sets it from `execution.limits.shell_timeout_s`) and its tool description state that value,
so the model is told what the command does. 120 s stays the default where the variable is unset.

    python3 mass_jobs/episodes/qwen_patch.py PATH/TO/@qwen-code/qwen-code/cli.js

Standard library only (it runs in the image's Node stage and before the venv exists). Idempotent;
it refuses any other release and any bundle where an anchor is not found exactly once, naming it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RELEASE = "0.15.10"
ENV = "QWEN_SHELL_DEFAULT_TIMEOUT_MS"
MARKER = f"process.env.{ENV}"
EDITS = (
    ("DEFAULT_FOREGROUND_TIMEOUT_MS = 12e4;", f"DEFAULT_FOREGROUND_TIMEOUT_MS = Number({MARKER}) || 12e4;"),
    (
        "If not specified, commands will timeout after 120000ms (2 minutes).",
        "If not specified, commands will timeout after ${DEFAULT_FOREGROUND_TIMEOUT_MS}ms "
        "(${DEFAULT_FOREGROUND_TIMEOUT_MS / 6e4} minutes).",
    ),
)


class PatchError(RuntimeError):
    pass


def is_patched(bundle: Path) -> bool:
    return MARKER in Path(bundle).read_text(encoding="utf-8")


def patch(bundle: Path) -> bool:
    """Patch `bundle` (cli.js) in place; False when it was patched already."""
    bundle = Path(bundle)
    package = json.loads((bundle.parent / "package.json").read_text())
    if package.get("version") != RELEASE:
        raise PatchError(f"{bundle}: qwen-code {package.get('version')!r}, this patch is for {RELEASE}")
    text = bundle.read_text(encoding="utf-8")
    if MARKER in text:
        return False
    for old, new in EDITS:
        if text.count(old) != 1:
            raise PatchError(f"{bundle}: expected {old!r} once, found it {text.count(old)} times")
        text = text.replace(old, new)
    tmp = bundle.with_name(bundle.name + ".patching")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(bundle.stat().st_mode)
    tmp.replace(bundle)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: qwen_patch.py PATH/TO/cli.js", file=sys.stderr)
        return 2
    try:
        changed = patch(Path(argv[0]))
    except (OSError, PatchError) as err:
        print(f"qwen_patch: {err}", file=sys.stderr)
        return 1
    print(f"qwen_patch: {argv[0]}: {'patched' if changed else 'already patched'} ({ENV} sets the shell timeout)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
