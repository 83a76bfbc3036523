"""`GET /metrics`: the egress proxy's Prometheus metrics, served by the control plane.

Rules: the proxy keeps the counters (decisions by kind/action/reason, injections by binding,
upstream errors, security events, the request latency histogram) and serves them on its control
socket, which only the control plane can reach; this route relays them unchanged. It sits behind
the API key like the rest of the API: binding names and decision volumes per reason are the
operator's business, not a sandbox's or a passer-by's (Prometheus sends the key with
`http_headers`, see docs/proxy.md). A proxy that does not answer (restarting) gives 503, so a
scrape records the gap instead of stale numbers.
"""

from __future__ import annotations

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from sandgate.lifecycle.api.errors import ApiError
from sandgate.proxy import ProxyControlError

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter(tags=["Server"])


@router.get("/metrics", response_class=PlainTextResponse)
def proxy_metrics(request: Request) -> PlainTextResponse:
    try:
        text = request.app.state.service.egress.proxy.metrics()
    except (ProxyControlError, OSError, httpx.HTTPError) as exc:
        raise ApiError(
            503,
            "UNAVAILABLE",
            f"the egress proxy did not answer for its metrics ({exc or type(exc).__name__}); "
            "it may be restarting: retry, or see proxy.log in the state dir",
        ) from exc
    return PlainTextResponse(text, media_type=PROMETHEUS_TEXT)
