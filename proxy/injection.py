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
5. A signing binding (AWS SigV4) signs the request as it will be sent: after the header changes
   the scrubbing path makes (`streaming.whole_identity`), with the client's placeholder
   signature checked first; a request that cannot be re-signed is a 400 with the reason. A
   payload hash taken over the body holds that body whole and signs at `request`.
6. An `oauth2` binding's token is minted (or taken from the cache) before its request is
   rendered (`minting.py`); each mint is audited (binding, generation or reason). A mint that
   fails is a 502 for the sandbox with the reason (redacted) and a log line for the operator; a
   401 from the API drops the token so the next request mints a new one.
7. Values come from the proxy's memory (`credentials.SecretValues`); one that is not there yet
   is read from the vault in a thread (`asyncio.to_thread`): this hook awaits it, other
   connections and sandboxes go on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from mitmproxy import http

from sandgate.policy import OAuth2Auth, Reason
from sandgate.proxy.auditing import mint_record, security_event
from sandgate.proxy.decide import deny_response, refusal
from sandgate.proxy.state import BODY_KEY, FLOW_KEY, ProxyState, RequestState, Sandbox
from sandgate.proxy.streaming import whole_identity
from sandgate.vault import MintError, Placeholders, SigV4Refused, SigV4Signer, VaultError, token_host

log = logging.getLogger(__name__)

NEVER_INJECT = frozenset({"TRACE", "CONNECT"})
BodyStep = Callable[[http.HTTPFlow], str | None]  # at `request`, with the whole body: the audit detail


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
            if not await self._mint(flow, request_state, binding_name):
                return
            self._inject(flow, request_state, binding_name)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """A 401 from the API: the minted token it was sent is dropped, the next request mints."""
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if request_state is None or flow.response is None or flow.response.status_code != 401:
            return
        for binding_name in request_state.bindings:
            auth = request_state.sandbox.bindings[binding_name].auth
            if isinstance(auth, OAuth2Auth) and self.state.minter is not None:
                self.state.minter.forget(auth)

    def request(self, flow: http.HTTPFlow) -> None:
        body_step: BodyStep | None = flow.metadata.pop(BODY_KEY, None)
        if body_step is None or flow.response:
            return
        detail = body_step(flow)
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if detail and request_state:
            request_state.detail = detail

    async def _mint(self, flow: http.HTTPFlow, request_state: RequestState, binding_name: str) -> bool:
        """For an `oauth2` binding: a usable token in memory (minted now if need be); False if
        none could be had (then the answer is a 502 with the reason)."""
        sandbox = request_state.sandbox
        auth = sandbox.bindings[binding_name].auth
        if not isinstance(auth, OAuth2Auth):
            return True
        client = flow.client_conn.peername
        try:
            if self.state.minter is None:
                raise MintError("this proxy has no token minter")
            result = await self.state.minter.token(auth, sandbox.credentials.reveal)
        except VaultError as exc:
            detail = self.state.table.values.redact_text(f"binding {binding_name!r}: {exc}")
            log.warning("sandbox %s: %s", sandbox.id, detail)
            mint_record(self.state, sandbox.id, client, binding_name, _endpoint(auth), detail, failed=True)
            verdict = refusal(Reason.TOKEN_UNAVAILABLE, request_state.verdict.rule, status=502)
            request_state.verdict, request_state.detail = verdict, detail
            flow.response = deny_response(verdict, request_state.name, detail)
            return False
        generation = f"token generation {result.generation}"
        if result.fresh:
            mint_record(
                self.state, sandbox.id, client, binding_name, result.endpoint, generation, failed=False
            )
        request_state.detail = generation
        return True

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
                flow.metadata[BODY_KEY] = functools.partial(_substitute_body, injection.placeholders)
        if injection.signer and not self._sign(flow, request_state, injection.signer):
            return
        request_state.bindings.append(binding_name)
        self.state.metrics.injections[binding_name] += 1

    def _sign(self, flow: http.HTTPFlow, request_state: RequestState, signer: SigV4Signer) -> bool:
        """Re-sign now, or at `request` when the payload hash needs the body; False if refused."""
        request = flow.request
        if request_state.sandbox.credentials.holds_secrets:
            whole_identity(request.headers)  # what the scrubbing path sends: sign that
        try:
            if signer.needs_body(_signing_headers(request)):
                signer.check(_signing_url(request), _signing_headers(request))
                flow.metadata[BODY_KEY] = functools.partial(self._sign_whole, signer)
            else:
                _set_signature(request, signer, None)
        except SigV4Refused as exc:
            self._refuse_signing(flow, request_state, exc)
            return False
        return True

    def _sign_whole(self, signer: SigV4Signer, flow: http.HTTPFlow) -> str | None:
        request_state: RequestState = flow.metadata[FLOW_KEY]
        try:
            _set_signature(flow.request, signer, flow.request.raw_content or b"")
        except SigV4Refused as exc:
            self._refuse_signing(flow, request_state, exc)
        return None

    @staticmethod
    def _refuse_signing(flow: http.HTTPFlow, request_state: RequestState, exc: SigV4Refused) -> None:
        verdict = refusal(Reason.NOT_RESIGNABLE, request_state.verdict.rule, status=400)
        request_state.verdict, request_state.detail = verdict, str(exc)
        flow.response = deny_response(verdict, request_state.name, str(exc))

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


def _endpoint(auth: OAuth2Auth) -> str:
    host, port = token_host(auth)
    return f"{host}:{port}"


def _substitute_body(placeholders: Placeholders, flow: http.HTTPFlow) -> str | None:
    request = flow.request
    result = placeholders.body(
        request.raw_content or b"",
        request.headers.get("content-type"),
        request.headers.get("content-encoding"),
    )
    request.raw_content = result.body
    return result.skipped


def _signing_url(request: http.Request) -> str:
    """The URL as it goes upstream: the Host the client signed and the target as received."""
    return f"{request.scheme}://{request.host_header}{request.path}"


def _signing_headers(request: http.Request) -> list[tuple[str, str]]:
    headers = list(request.headers.items(multi=True))
    if "host" not in request.headers:  # HTTP/2: the :authority pseudo-header is the host
        headers.append(("host", request.host_header or ""))
    return headers


def _set_signature(request: http.Request, signer: SigV4Signer, body: bytes | None) -> None:
    signed = signer.sign(request.method, _signing_url(request), _signing_headers(request), body)
    request.headers.pop("x-amz-security-token", None)  # a placeholder token never goes upstream
    for name, value in signed:
        request.headers[name] = value


def _substitutes_body(sandbox: Sandbox, binding_name: str) -> bool:
    auth = sandbox.bindings[binding_name].auth
    return any("body" in substitution.in_ for substitution in getattr(auth, "substitutions", ()))
