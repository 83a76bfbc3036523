"""Error pages the proxy makes itself never quote upstream bytes.

mitmproxy answers a failed exchange (a truncated response head, a bad status line, a refused
connection, a reset) with an HTML page that quotes its error message, and for a bad response
head that message quotes the raw upstream bytes: a credential an origin put into a broken
status line reached the sandbox past the scrubber. mitmproxy has no option for that page, so
`install()` replaces its two makers (HTTP/1 and HTTP/2) with sandgate's fixed JSON body,
which says only the status: nothing from upstream, for every sandbox. The message itself still
reaches the `error` hook, where the audit record's detail is redacted (auditing.py).

One kind of failure is named: an upstream proxy's (proxy/upstreamproxy.py rule 4). When the
message is about a configured upstream proxy's address, the page names that proxy (from the
configuration, not the message) and says whether it was unreachable or refused the CONNECT,
with the status digits only, never the proxy's reason phrase.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import _http1, _http2

from sandgate.policy import Reason
from sandgate.proxy.contract.config import UpstreamProxy

# mitmproxy's own words when an upstream proxy answers its CONNECT with a non-2xx status.
REFUSED_CONNECT = re.compile(r"^Upstream proxy (\S+) refused HTTP CONNECT request: (\d{3})")
_upstream_proxies: Callable[[], Iterable[UpstreamProxy]] = tuple


def error_body(status_code: int, message: str = "") -> bytes:
    """The body of every error page the proxy makes; `message` (mitmproxy's, may quote upstream
    bytes) is left out, but for the upstream proxy it names (module rules)."""
    body: dict[str, object] = {
        "error": "upstream failed",
        "status": status_code,
        "reason": Reason.UPSTREAM_ERROR,
    }
    if via := upstream_failure(message):
        body["upstream_proxy"], body["detail"] = via
    return (json.dumps(body) + "\n").encode()


def upstream_failure(message: str) -> tuple[str, str] | None:
    """(the upstream proxy's URL, what it did) when `message` is about a configured one."""
    refused = REFUSED_CONNECT.match(message)
    for proxy in _upstream_proxies():
        host, port = proxy.address
        if refused and refused.group(1) == f"{host}:{port}":
            return proxy.url, f"upstream proxy {proxy.url} refused the CONNECT: {refused.group(2)}"
        if not refused and (f"{host}:{port}" in message or f"('{host}', {port})" in message):
            return (
                proxy.url,
                f"upstream proxy {proxy.url} is unreachable (no fallback to a direct connection)",
            )
    return None


def _http1_error_response(status_code: int, message: str = "") -> bytes:
    response = http.Response.make(
        status_code,
        error_body(status_code, message),
        http.Headers(content_type="application/json", connection="close"),
    )
    return http1.assemble_response(response)


def install(upstream_proxies: Callable[[], Iterable[UpstreamProxy]] = tuple) -> None:
    """Replace mitmproxy's error-page makers; fails loudly if a mitmproxy upgrade moved them.
    `upstream_proxies` says which upstream proxies are configured now."""
    global _upstream_proxies
    _upstream_proxies = upstream_proxies
    for module, name in ((_http1, "make_error_response"), (_http2, "format_error")):
        if not callable(getattr(module, name, None)):
            raise RuntimeError(
                f"{module.__name__}.{name} is gone: this mitmproxy version makes its error pages "
                "elsewhere; update sandgate.proxy.errorpages before running it"
            )
    _http1.make_error_response = _http1_error_response
    _http2.format_error = error_body
