"""sandgate.lifecycle: the control plane (settings, CLI, HTTP API, SQLite state, networks, runtimes).

Public face: `Settings`/`load_settings`, the CLI entry `main`, and the FastAPI app factory
`create_app`, all imported lazily: `sandgate policy check` must not pay for pydantic, the web
stack or mitmproxy (see lifecycle/cli).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandgate.lifecycle.settings import Settings, load_settings

__all__ = ["Settings", "create_app", "load_settings", "main"]


def __getattr__(name: str) -> Any:
    if name in ("Settings", "load_settings"):
        from sandgate.lifecycle import settings

        return getattr(settings, name)
    if name == "create_app":
        from sandgate.lifecycle.api import create_app

        return create_app
    if name == "main":
        from sandgate.lifecycle.cli import main

        return main
    raise AttributeError(f"module 'sandgate.lifecycle' has no attribute {name!r}")
