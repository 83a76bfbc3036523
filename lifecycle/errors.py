"""How the control plane's actions fail, without speaking HTTP.

Rules:
1. An action that cannot do what was asked raises `LifecycleError(kind, message)`; the message
   says what was wrong and how to fix it. The API maps each kind to a status code
   (api/calls.py), so no module below the API knows a status code.
2. Clean-up steps after a failure run through `quietly`: one failed step is logged and never
   hides the error that started the clean-up, nor stops the steps after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

log = logging.getLogger(__name__)

ErrorKind = Literal[
    "not_found", "invalid", "forbidden", "conflict", "unsupported", "unavailable", "precondition"
]


class LifecycleError(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class RuntimeError_(Exception):
    """A runtime (or the image store or a registry it pulls from) could not do what was asked;
    the message says what and how to fix it."""


def quietly(step: Callable[[], object]) -> None:
    """Run a clean-up step; log its failure and go on."""
    try:
        step()
    except Exception:
        log.exception("clean-up step failed (continuing)")
