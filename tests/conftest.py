"""Shared fixtures live in tests/fixtures/<topic>.py; every module there is loaded as a plugin."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)
