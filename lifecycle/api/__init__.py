"""HTTP API of the control plane: OpenSandbox lifecycle, egress and credential-vault routes.

The names are imported lazily: `sandgate sandbox ...` imports this package's small client
(`api.client`) and must not pay for FastAPI and the whole service on every command.
"""

from typing import Any

__all__ = ["create_app", "load_or_create_api_key"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from sandgate.lifecycle.api.app import create_app

        return create_app
    if name == "load_or_create_api_key":
        from sandgate.lifecycle.api.auth import load_or_create_api_key

        return load_or_create_api_key
    raise AttributeError(f"module 'sandgate.lifecycle.api' has no attribute {name!r}")
