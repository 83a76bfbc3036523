"""The HTTP access log keeps no query string.

Rules: a client may put anything in a URL, a key included (an old console link `?key=`, a
token pasted into any route), and uvicorn's access log would write it verbatim. Every access
line goes through `QueryRedactor`, which replaces what follows `?` with `REDACTED_QUERY`; the
path stays, so a reviewer still sees which route was called. Nothing else of the line changes.
"""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
REDACTED_QUERY = "[query redacted]"
PATH_ARG = 2  # uvicorn's access record args: (client, method, path with query, http version, status)


def without_query(target: str) -> str:
    """`target` with its query string (if any) replaced by REDACTED_QUERY."""
    path, question, _ = target.partition("?")
    return f"{path}?{REDACTED_QUERY}" if question else path


class QueryRedactor(logging.Filter):
    """Rewrites the path of each access record before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > PATH_ARG:
            target = args[PATH_ARG]
            if isinstance(target, str):
                record.args = (*args[:PATH_ARG], without_query(target), *args[PATH_ARG + 1 :])
        return True


def redact_access_queries() -> None:
    """Install the filter on uvicorn's access logger (idempotent)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(existing, QueryRedactor) for existing in logger.filters):
        logger.addFilter(QueryRedactor())
