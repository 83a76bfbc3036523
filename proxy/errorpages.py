"""Error pages the proxy makes itself never quote upstream bytes.

mitmproxy answers a failed exchange (a truncated response head, a bad status line, a refused
connection, a reset) with an HTML page that quotes its error message, and for a bad response
head that message quotes the raw upstream bytes: a credential an origin put into a broken
status line reached the sandbox past the scrubber. mitmproxy has no option for that page, so
`install()` replaces its two makers (HTTP/1 and HTTP/2) with sandgate's fixed JSON body,
which says only the status: nothing from upstream, for every sandbox. The message itself still
reaches the `error` hook, where the audit record's detail is redacted (auditing.py).
"""

from __future__ import annotations

import json

from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http import _http1, _http2

from sandgate.policy import Reason


def error_body(status_code: int, message: str = "") -> bytes:
    """The body of every error page the proxy makes; `message` (mitmproxy's, may quote upstream
    bytes) is deliberately left out."""
    del message
    body = {"error": "upstream failed", "status": status_code, "reason": Reason.UPSTREAM_ERROR}
    return (json.dumps(body) + "\n").encode()


def _http1_error_response(status_code: int, message: str = "") -> bytes:
    response = http.Response.make(
        status_code,
        error_body(status_code, message),
        http.Headers(content_type="application/json", connection="close"),
    )
    return http1.assemble_response(response)


def install() -> None:
    """Replace mitmproxy's error-page makers; fails loudly if a mitmproxy upgrade moved them."""
    for module, name in ((_http1, "make_error_response"), (_http2, "format_error")):
        if not callable(getattr(module, name, None)):
            raise RuntimeError(
                f"{module.__name__}.{name} is gone: this mitmproxy version makes its error pages "
                "elsewhere; update sandgate.proxy.errorpages before running it"
            )
    _http1.make_error_response = _http1_error_response
    _http2.format_error = error_body
