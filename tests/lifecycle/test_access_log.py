"""No secret from a URL in the access log: a key sent as a query string (an old console link
`?key=`, any API route) is not in serve's output, while the route called still is."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sandgate.lifecycle.api.access_log import REDACTED_QUERY, QueryRedactor, without_query
from tests.support.server import sandgate_server

KEY_IN_URL = "url-secret-5e1b77"


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/console", "/console"),
        ("/console/login?key=abc", f"/console/login?{REDACTED_QUERY}"),
        ("/v1/sandboxes?state=Running&token=abc", f"/v1/sandboxes?{REDACTED_QUERY}"),
        ("/a?", f"/a?{REDACTED_QUERY}"),
        ("/a?b?c", f"/a?{REDACTED_QUERY}"),
    ],
)
def test_without_query(target: str, logged: str) -> None:
    assert without_query(target) == logged


def test_the_filter_rewrites_only_the_path_of_an_access_record() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", f"/console/login?key={KEY_IN_URL}", "1.1", 200), None,
    )  # fmt: skip
    assert QueryRedactor().filter(record)
    assert record.getMessage() == f'127.0.0.1:5 - "GET /console/login?{REDACTED_QUERY} HTTP/1.1" 200'


@pytest.mark.root
def test_serve_logs_no_query_string(tmp_path: Path) -> None:
    with sandgate_server(tmp_path, log_level="info") as server:
        with server.client() as client:
            assert client.get(f"/console/login?key={KEY_IN_URL}").status_code == 200
            client.get(f"/v1/sandboxes?token={KEY_IN_URL}")
        server.stop()
        log = server.log_path.read_text(errors="replace")
    assert "/console/login?" in log and "/v1/sandboxes?" in log  # the lines are there
    assert KEY_IN_URL not in log
