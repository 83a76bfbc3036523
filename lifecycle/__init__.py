"""sandgate.lifecycle: the control plane (settings, CLI, HTTP API, SQLite state, networks, runtimes).

Public face: `Settings`/`load_settings`, the CLI entry `main`, and the FastAPI app factory
`create_app` (imported lazily, so CLI commands that need no web stack start fast).
"""

from typing import Any

from sandgate.lifecycle.settings import Settings, load_settings

__all__ = ["Settings", "create_app", "load_settings", "main"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from sandgate.lifecycle.api import create_app

        return create_app
    if name == "main":
        from sandgate.lifecycle.cli import main

        return main
    raise AttributeError(f"module 'sandgate.lifecycle' has no attribute {name!r}")
