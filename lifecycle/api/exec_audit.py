"""The exec audit trail's writer: every execd call the host's reverse proxy forwards is recorded.

Rules:
1. Write-ahead: a recorded call (lifecycle/exec_trail.py's table) has its line in the audit file
   before its first byte reaches execd (`Call.write_ahead`), with `event: "incomplete"`, and a
   second line under the same id with its outcome once execd's answer ends or the client leaves
   (`Call.finish`). A call whose line cannot be written is not forwarded (503), as the proxy
   forwards nothing it cannot audit.
2. What a line says comes from the call as it passes (exec_trail reads it): the request's JSON
   body is read whole before it is forwarded (up to `JSON_BODY_MAX`), an upload's files are
   hashed as they stream through, the answer's event frames are read for the outcome.
3. Redacted at write time with every value the sandbox's credential vault has held here, its
   execd and egress tokens, the API key, the credential the call presented (its key, OIDC token
   or key-bound endpoint token) and any managed key, bound token or JWT written plainly
   (`Secrets`, lifecycle/trail_secrets.py), the proxy's writer's rules for the rest.
4. Who called: `actor` is the credential shown, `api-key` (a key or OIDC token) or
   `execd-token` (the sandbox's own execd token, or the endpoint token bound to a key), `client`
   the caller's address as the server saw it, `principal` the key's id, tenant and role (or the
   sandbox token's holder: lifecycle/principals.py).
5. A PTY session's WebSocket (`GET /pty/{id}/ws`) is a call like any other (`pty_attach`,
   written ahead, completed when the session's socket closes) and what is typed into it is
   recorded line by line (`Terminal`): a `pty_input` record holding the typed text up to its line
   end is in the file before the message carrying that line end reaches execd, so a shell runs
   no typed line unrecorded; a signal sent to the terminal is one record too. Text that reaches
   `TEXT_MAX` characters without a line end is recorded then; what is left unterminated when
   the socket closes is in the `pty_attach` record. A message whose record cannot be written
   closes the session's socket before it reaches execd.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.requests import HTTPConnection

from sandgate.lifecycle.api.auth import API_KEY_HEADER, bearer
from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.exec_trail import (
    JSON_BODY_MAX,
    PTY_INPUT,
    TEXT_MAX,
    Facts,
    Operation,
    Outcome,
    UploadDigests,
    body_facts,
    bounded,
    operation,
    query_facts,
    summary,
    terminal_input,
)
from sandgate.lifecycle.principals import acting, token_holder
from sandgate.lifecycle.runtime.base import EXECD_PORT, EXECD_TOKEN_HEADER
from sandgate.lifecycle.sandbox_store import SandboxRecord
from sandgate.lifecycle.trail_secrets import Secrets
from sandgate.proxy import INCOMPLETE, AuditRecord, append_record

log = logging.getLogger(__name__)


class ExecTrail:
    """The writer the reverse proxy calls for every request to execd (app.state.exec_trail)."""

    def __init__(self, audit_path: Path, secrets: Secrets) -> None:
        self.audit_path = audit_path
        self.secrets = secrets

    def begin(self, request: HTTPConnection, record: SandboxRecord, port: int, path: str) -> Call | None:
        """The call's trail (an HTTP request's or a WebSocket's, whose handshake is a GET), or None
        when it does nothing to the sandbox."""
        if port != EXECD_PORT:
            return None
        method = request.scope.get("method", "GET")
        found = operation(method, path.partition("?")[0])
        if found is None:
            return None
        op, user = found
        query = request.scope.get("query_string", b"").decode("latin-1")
        facts = query_facts(op, path, query)
        if user is not None:
            facts["user"] = user
        peer = request.client
        return Call(
            self,
            record,
            op,
            facts,
            presented(request),
            actor="execd-token" if shown_token(request) else "api-key",
            client=f"{peer.host}:{peer.port}" if peer else "unknown",
            route=f"{method} {path.partition('?')[0]}",
        )


def shown_token(request: HTTPConnection) -> bool:
    """Whether the caller showed an execd token (the sandbox's own, or one bound to a key)
    rather than a key."""
    state = request.scope["state"]
    return state.get("principal") is None or state.get("endpoint_token") is not None


def presented(request: HTTPConnection) -> frozenset[str]:
    """The credentials the caller sent: its key or bearer token, its endpoint token."""
    headers = request.headers
    sent = (headers.get(API_KEY_HEADER), bearer(headers), headers.get(EXECD_TOKEN_HEADER))
    return frozenset(value for value in sent if value)


class Call:
    """One recorded execd call, from its write-ahead line to its outcome."""

    def __init__(
        self, trail: ExecTrail, record: SandboxRecord, op: Operation, facts: Facts, presented: frozenset[str],
        **who: str,
    ):  # fmt: skip
        self.trail = trail
        self.sandbox = record
        self.presented = presented
        self.op = op
        self.facts: Facts = {"op": op.name, "actor": who["actor"], "route": who["route"], **facts}
        self.principal = acting.get() or token_holder("execd", record.tenant)
        self.client = who["client"]
        self.started = time.monotonic()
        self.bytes_out = 0  # client -> execd
        self.bytes_in = 0  # execd -> client
        self.outcome = Outcome(digest=hashlib.sha256() if op.name == "read" else None)
        self.upload: UploadDigests | None = None
        self.id: str | None = None
        self.finished = False

    async def request_body(
        self, body: AsyncIterator[bytes] | None, content_type: str
    ) -> AsyncIterator[bytes] | None:
        """The body to forward: a JSON body read whole first (rule 2), an upload hashed as it
        passes, any other counted."""
        if body is None:
            return None
        if self.op.body == "json":
            head = bytearray()
            async for chunk in body:
                head += chunk
                if len(head) > JSON_BODY_MAX:
                    break
            self.facts.update(
                body_facts(self.op, bytes(head))
                if len(head) <= JSON_BODY_MAX
                else {"unparsed_body": len(head)}
            )
            return self._counted(body, bytes(head))
        if self.op.body == "upload":
            self.upload = UploadDigests.for_content_type(content_type)
        return self._counted(body, b"")

    async def _counted(self, rest: AsyncIterator[bytes], head: bytes) -> AsyncIterator[bytes]:
        if head:
            self.bytes_out += len(head)
            yield head
        async for chunk in rest:
            self.bytes_out += len(chunk)
            if self.upload is not None:
                self.upload.feed(chunk)
            yield chunk

    def write_ahead(self) -> None:
        """Rule 1: the line is in the file, or the call is refused (ApiError 503)."""
        record = self._record(event=INCOMPLETE)
        self.id = record.id
        self._write_or_refuse(record)

    def write_typed(self, facts: Facts) -> None:
        """Rule 5: one whole `pty_input` record of what was typed on this call's terminal, or
        ApiError 503 (the message is not forwarded)."""
        line = {**self.facts, "op": PTY_INPUT.name, **facts}
        typed = len(facts.get("input", "").encode())
        self._write_or_refuse(self._record(PTY_INPUT, line, bytes_in=0, bytes_out=typed))

    def _write_or_refuse(self, record: AuditRecord) -> None:
        try:
            self._append(record)
        except OSError as exc:
            log.error("exec audit record for sandbox %s not written: %s", self.sandbox.id, exc)
            raise ApiError(
                503,
                "AUDIT_UNWRITABLE",
                "execd call refused: the control plane forwards nothing it cannot audit "
                f"({exc.strerror or exc})",
            ) from exc

    def answer(self, chunk: bytes) -> None:
        """A chunk of execd's answer on its way to the client."""
        self.bytes_in += len(chunk)
        if self.op.kind == "command":
            self.outcome.feed_frames(chunk)
        elif self.outcome.digest is not None:
            self.outcome.digest.update(chunk)

    def finish(self, status: int | None, problem: str | None = None) -> None:
        """The whole line (rule 1); called once, when the answer ended or the client left."""
        if self.finished:
            return
        self.finished = True
        if self.upload is not None:
            self.facts.update(self.upload.facts())
        self.facts.update(self.outcome.facts())
        if problem is not None:
            self.facts["problem"] = problem
        record = self._record(
            status=status,
            duration_ms=round((time.monotonic() - self.started) * 1000, 3),
            **({"id": self.id} if self.id else {}),
        )
        try:
            self._append(record)
        except OSError as exc:
            log.error("exec audit record %s (its outcome) not written: %s", self.id, exc)

    def _append(self, record: AuditRecord) -> None:
        append_record(self.trail.audit_path, record, self.trail.secrets.redact(self.sandbox, self.presented))

    def _record(
        self, op: Operation | None = None, facts: Facts | None = None, /, **fields: Any
    ) -> AuditRecord:
        """An exec record is no decision: it says what was done (`reason` one line of it, `detail`
        the facts as JSON), `method` the operation, `path` its first path. This call's own, or
        (`op`, `facts`) one of what passed on its connection."""
        op = op or self.op
        facts = self.facts if facts is None else facts
        paths = facts.get("paths") or []
        return AuditRecord(
            kind=op.kind,  # type: ignore[arg-type]
            sandbox=self.sandbox.id,
            client=self.client,
            decision="allow",
            reason=summary(op, facts),
            detail=json.dumps(facts, ensure_ascii=False),
            method=op.name,
            port=EXECD_PORT,
            path=paths[0] if paths and isinstance(paths[0], str) else None,
            principal=self.principal,
            **{"bytes_in": self.bytes_in, "bytes_out": self.bytes_out, **fields},
        )


class Terminal:
    """Rule 5: what a client types into a PTY session, recorded before it reaches execd."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.pending = bytearray()  # typed since the last recorded line end
        self.typed = 0

    def client_message(self, message: bytes | str) -> None:
        """Called before a client's message goes on to execd; ApiError 503 when its record
        cannot be written (the message must not go on)."""
        self.call.bytes_out += len(message)
        data, signal = terminal_input(message)
        if signal is not None:
            self.call.write_typed({"signal": signal})
        if not data:
            return
        self.typed += len(data)
        self.pending += data
        end = max(self.pending.rfind(b"\n"), self.pending.rfind(b"\r"))
        if end >= 0 or len(self.pending) >= TEXT_MAX:
            cut = end + 1 if end >= 0 else len(self.pending)
            self.call.write_typed({"input": bounded(self.pending[:cut].decode(errors="replace"))})
            del self.pending[:cut]

    def sandbox_message(self, message: bytes | str) -> None:
        self.call.bytes_in += len(message)

    def close(self, status: int | None, problem: str | None = None) -> None:
        """The `pty_attach` record's whole line: bytes typed, and what was typed after the last
        line end."""
        self.call.facts["typed_bytes"] = self.typed
        if self.pending:
            self.call.facts["input"] = bounded(self.pending.decode(errors="replace"))
        self.call.finish(status, problem)
