"""HTTP API of the control plane: OpenSandbox lifecycle, egress and credential-vault routes."""

from sandgate.lifecycle.api.app import create_app
from sandgate.lifecycle.api.auth import load_or_create_api_key

__all__ = ["create_app", "load_or_create_api_key"]
