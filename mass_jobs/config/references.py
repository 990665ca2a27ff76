"""References to code outside the package, `module:NAME`: a pipeline of one's own, an agent step, a
step's core. Imported where they are used (in the jobs image: from its PYTHONPATH)."""

from __future__ import annotations

import importlib
from typing import Any


def referenced(ref: str, flag: str) -> Any:
    """What `module:NAME` names (None when the module has no NAME); a ValueError naming `flag` when
    the reference is malformed or its module does not import here."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ValueError(f"{flag}: expected module:NAME, got {ref!r}")
    try:
        found = importlib.import_module(module)
    except ImportError as err:
        raise ValueError(
            f"{flag}: expected a module importable here (in the jobs image: on its PYTHONPATH), found none: {err}"
        ) from None
    return getattr(found, attr, None)
