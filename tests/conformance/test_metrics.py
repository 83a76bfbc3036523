"""Prometheus scrapes the egress proxy's metrics from the control plane (`GET /v1/metrics`, API
key), and what it gets parses as the exposition format and counts what the sandbox did."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance.conftest import API_HOST
from tests.support.internet import ORIGIN_V4
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root

STATUS = "-sS -o /dev/null -w '%{http_code}'"


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of every sample called `name` in a Prometheus text page."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def decisions(text: str, action: str, reason: str) -> float:
    key = (("action", action), ("kind", "request"), ("reason", reason))
    return samples(text, "sandgate_proxy_decisions_total").get(key, 0.0)


def test_proxy_metrics_are_served_on_the_control_plane(server: SandgateServer) -> None:
    bare = httpx.Client(base_url=server.base_url, trust_env=False)
    assert bare.get("/v1/metrics").status_code == 401  # behind the API key like the rest
    with server.client() as client:
        before = client.get("/v1/metrics").text
    sandbox_id = server.create_sandbox(
        networkPolicy={"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
    )["id"]
    try:
        allowed = server.run(sandbox_id, f"curl {STATUS} http://{API_HOST}/")
        denied = server.run(
            sandbox_id,
            f"curl {STATUS} --resolve denied.example.com:80:{ORIGIN_V4} http://denied.example.com/",
        )
        assert (allowed.stdout, denied.stdout) == ("200", "403"), (allowed, denied)
        with server.client() as client:
            response = client.get("/v1/metrics")
    finally:
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{sandbox_id}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = response.text
    assert decisions(after, "allow", "rule") >= decisions(before, "allow", "rule") + 1
    assert decisions(after, "deny", "default") >= decisions(before, "deny", "default") + 1
    latency_count = samples(after, "sandgate_proxy_request_duration_seconds_count")
    assert latency_count[()] >= 1
