"""sandgate.execd: the OpenSandbox-compatible execution daemon that runs inside every sandbox.

It imports nothing of sandgate (it runs where the control plane's code must not be) and starts
fast. Run it with `python -m sandgate.execd --host H --port P [--token T] [--root DIR]`.
"""

from .app import ExecdApp, ExecdConfig, create_app

__all__ = ["ExecdApp", "ExecdConfig", "create_app"]
