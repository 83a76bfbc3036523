"""Injection: the credential of the binding the policy selected goes into the request here.

Rules:
1. Runs after enforcement, so only on requests whose names agreed (SNI == Host == :authority)
   and whose policy decision selected a binding; the binding's own match (hosts, schemes, ports,
   methods, paths) is applied by the policy, so cleartext gets a credential only when the
   binding lists `http`. Never on TRACE (it echoes headers) or CONNECT.
2. Headers are set, never added: a header the client sent under the same name is replaced.
3. A passthrough placeholder in a request that is not for its own binding (another host, or no
   binding at all) is refused with 403 and a security_event: the workload tried to send a
   credential somewhere it may not go.
4. The proxy never follows redirects, so a credential goes only to the request it was decided for.
5. Values come from the proxy's memory (`credentials.SecretValues`); one that is not there yet
   is read from the vault in a thread (`asyncio.to_thread`): this hook awaits it, other
   connections and sandboxes go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mitmproxy import http

from sandgate.policy import Reason
from sandgate.proxy.auditing import security_event
from sandgate.proxy.decide import deny_response, refusal
from sandgate.proxy.state import BODY_KEY, FLOW_KEY, ProxyState, RequestState, Sandbox
from sandgate.vault import VaultError

log = logging.getLogger(__name__)

NEVER_INJECT = frozenset({"TRACE", "CONNECT"})


class InjectionAddon:
    def __init__(self, state: ProxyState) -> None:
        self.state = state

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if flow.response or request_state is None or not request_state.verdict.allowed:
            return
        sandbox = request_state.sandbox
        selected = [name for name in request_state.verdict.bindings if name in sandbox.bindings]
        if self._placeholder_misused(flow, request_state, selected):
            return
        if request_state.identity is None or request_state.identity.method in NEVER_INJECT:
            return
        for binding_name in selected:
            if sandbox.credentials.missing(binding_name):
                await asyncio.to_thread(sandbox.credentials.load_missing, binding_name)
            self._inject(flow, request_state, binding_name)

    def request(self, flow: http.HTTPFlow) -> None:
        placeholders = flow.metadata.pop(BODY_KEY, None)
        if placeholders is None or flow.response:
            return
        request = flow.request
        result = placeholders.body(
            request.raw_content or b"",
            request.headers.get("content-type"),
            request.headers.get("content-encoding"),
        )
        request.raw_content = result.body
        if result.skipped:
            request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
            if request_state:
                request_state.detail = result.skipped

    def _inject(self, flow: http.HTTPFlow, request_state: RequestState, binding_name: str) -> None:
        sandbox = request_state.sandbox
        try:
            injection = sandbox.credentials.render(binding_name)
        except VaultError as exc:
            verdict = refusal(Reason.CREDENTIAL_UNAVAILABLE, request_state.verdict.rule, status=502)
            request_state.verdict, request_state.detail = verdict, str(exc)
            flow.response = deny_response(verdict, request_state.name)
            return
        request = flow.request
        for name, value in injection.headers:
            request.headers[name] = value  # replaces every client-sent header of that name
        if injection.placeholders:
            request.headers.fields = _substituted(request.headers.fields, injection.placeholders.header)
            request.path = injection.placeholders.target(request.path)
            if _substitutes_body(sandbox, binding_name):
                flow.metadata[BODY_KEY] = injection.placeholders
        request_state.bindings.append(binding_name)
        self.state.metrics.injections[binding_name] += 1

    def _placeholder_misused(
        self, flow: http.HTTPFlow, request_state: RequestState, selected: list[str]
    ) -> bool:
        sandbox = request_state.sandbox
        if not sandbox.placeholders:
            return False
        request = flow.request
        seen = [request.path, *(value for _, value in request.headers.items(multi=True))]
        for placeholder, owner in sandbox.placeholders.items():
            if owner in selected or not any(placeholder in text for text in seen):
                continue
            detail = f"placeholder of binding {owner!r} sent to {request_state.name}"
            security_event(
                self.state,
                sandbox.id,
                flow.client_conn.peername,
                Reason.PLACEHOLDER_MISUSE,
                detail,
                host=request_state.name,
                method=request.method,
                port=request.port,
            )
            verdict = refusal(Reason.PLACEHOLDER_MISUSE, request_state.verdict.rule)
            request_state.verdict, request_state.detail = verdict, detail
            flow.response = deny_response(verdict, request_state.name)
            return True
        return False


def _substituted(
    fields: tuple[tuple[bytes, bytes], ...], substitute: Callable[[str], str]
) -> tuple[tuple[bytes, bytes], ...]:
    """Every header value with its placeholders substituted, in one pass over the fields (a
    lookup by name per field would cost O(n^2) for a request with thousands of headers)."""
    out = []
    for name, raw in fields:
        value = raw.decode("utf-8", "surrogateescape")
        substituted = substitute(value)
        out.append((name, raw if substituted == value else substituted.encode("utf-8", "surrogateescape")))
    return tuple(out)


def _substitutes_body(sandbox: Sandbox, binding_name: str) -> bool:
    auth = sandbox.bindings[binding_name].auth
    return any("body" in substitution.in_ for substitution in getattr(auth, "substitutions", ()))
