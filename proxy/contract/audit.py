"""The audit record: its schema and the one way a record becomes a line (part of the proxy's
contract: lifecycle reads and appends records by it, and it loads no mitmproxy).

Rules:
1. A record is a decision serialised: `AuditRecord.of` takes the policy's `Decision` (its
   outcome allow/deny/report, reason, rule, inspect, detail) and adds the facts of what was asked,
   captured before injection changed anything. A record is written for every connection-level
   and request-level decision the proxy makes and for every DNS answer.
2. One writer: every line goes through `written`, which, at write time, passes every free-text
   field (`FREE_TEXT`: host, path, SNI, method, reason, detail...) through the redactor of every
   secret value the proxy holds (a superset of each sandbox's own) and replaces query strings
   (`redact_path`). Callers cannot forget either: they hand over records, not lines.
3. The proxy owns the audit file (its writer is the engine's `proxy/audit.py`). Other processes
   (lifecycle's policy changes) add lines with `append_record`, which opens the live file per
   line, so the proxy's rotation never strands them in a backup.
4. This module is the schema: `AuditRecord` is a line's fields (the file's name is
   `names.AUDIT_FILE`); the index, the API, the CLI, the console and the OCSF export read
   records by it. It imports only pydantic and sandgate.policy.
5. Write-ahead: a request the proxy forwards upstream has two lines under one id, first with
   `event: INCOMPLETE`, written before its first byte leaves (the engine's `AuditLog.write_ahead`),
   then the whole record when the response ends. Readers keep the last line of an id; a record
   left `incomplete` went upstream and its response never ended (or has not yet).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from sandgate.policy import Decision, Outcome
from sandgate.proxy.contract.chain import append_line

RecordKind = Literal[
    "connection",
    "request",
    "dns",
    "security_event",
    "policy_change",
    "lifecycle",
    "command",
    "file",
    "process",
    "api",
]
RECORD_KINDS: tuple[RecordKind, ...] = get_args(RecordKind)
Redact = Callable[[str], str]
# Fields that hold text a sandbox, an upstream or a policy chose: redacted at write time.
FREE_TEXT = ("sni", "method", "host", "path", "reason", "rule", "binding", "event", "detail")
# `event` of a request's write-ahead line: forwarded upstream, its response not (yet) ended (rule 5).
INCOMPLETE = "incomplete"


def utc_timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_record_id() -> str:
    return os.urandom(10).hex()


def redact_path(path: str | None) -> str | None:
    """The path with any query string replaced: queries carry tokens far too often."""
    if path is None:
        return None
    base, sep, _query = path.partition("?")
    return f"{base}?<redacted>" if sep else base


class ConnectionProcess(BaseModel):
    """The process inside the sandbox that held a connection's socket (proxy/origin.py): its
    pid on the host and in the sandbox, its executable; or, when it could not be known, why."""

    pid: int | None = None
    sandbox_pid: int | None = None
    exe: str | None = None
    unknown: str | None = None


class Principal(BaseModel):
    """Who made a control-plane call: a managed key's id (`via` "key"), the bootstrap key
    ("bootstrap"), an OIDC subject ("oidc"), or a sandbox's own token ("sandbox-token"); its
    tenant and role (lifecycle/principals.py)."""

    model_config = ConfigDict(frozen=True)

    id: str
    tenant: str
    role: str
    via: str


class AuditRecord(BaseModel):
    """One line of audit.jsonl. `bytes_in`: upstream -> client; `bytes_out`: client -> upstream."""

    v: Literal[1] = 1
    ts: str = Field(default_factory=utc_timestamp)
    id: str = Field(default_factory=new_record_id)
    kind: RecordKind
    sandbox: str
    client: str
    upstream: str | None = None
    via: str | None = None  # the upstream proxy it left through (http://host:port)
    sni: str | None = None
    scheme: Literal["http", "https"] | None = None
    method: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    decision: Outcome
    reason: str
    rule: str | None = None
    inspect: bool = False
    binding: str | None = None
    status: int | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: float | None = None
    event: str | None = None
    detail: str | None = None
    process: ConnectionProcess | None = None  # connection and request records (standard isolation)
    principal: Principal | None = None  # control-plane records: who called

    @classmethod
    def of(cls, kind: RecordKind, sandbox: str, client: str, decision: Decision, **facts: Any) -> AuditRecord:
        """The record of `decision`; `facts` say what was asked (a `detail` or `inspect` among
        them wins over the decision's own)."""
        fields: dict[str, Any] = {"rule": decision.rule, "inspect": decision.inspect, **facts}
        fields["detail"] = fields.get("detail") or decision.detail
        return cls(
            kind=kind,
            sandbox=sandbox,
            client=client,
            decision=decision.outcome,
            reason=decision.reason,
            **fields,
        )


def written(record: AuditRecord, redact: Redact | None = None) -> AuditRecord:
    """`record` as it may be written: free text through `redact`, the path without its query,
    bytes that were not UTF-8 (kept by mitmproxy as lone surrogates) as `\\xNN` text."""
    values = record.__dict__
    changed: dict[str, Any] = {}
    if record.path is not None and "?" in record.path:
        changed["path"] = redact_path(record.path)
    texts = [changed.get(name, values[name]) or "" for name in FREE_TEXT]
    if redact is not None and redact(joined := "\0".join(texts)) == joined:
        redact = None  # one pass over all of them found nothing: no field holds a secret
    for name, text in zip(FREE_TEXT, texts, strict=True):
        if not text:
            continue
        clean = redact(text) if redact is not None else text
        if not clean.isascii():
            clean = clean.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        if clean != text:
            changed[name] = clean
    exe = record.process.exe if record.process is not None else None
    if exe and redact is not None and (clean_exe := redact(exe)) != exe:  # a path the sandbox chose
        changed["process"] = record.process.model_copy(update={"exe": clean_exe})  # type: ignore[union-attr]
    return record.model_copy(update=changed) if changed else record


def to_line(record: AuditRecord) -> str:
    """One line of the file (for a record `written` has passed)."""
    return record.model_dump_json() + "\n"


def append_record(path: Path, record: AuditRecord, redact: Redact | None = None) -> None:
    """Add one line to the live file from outside the proxy (chained under the file's lock:
    safe beside it); raises OSError when it cannot be written."""
    append_records(path, [(record, redact)])


def append_records(path: Path, records: list[tuple[AuditRecord, Redact | None]]) -> None:
    """Add several lines with one locked write (each record with its own redactor)."""
    if records:
        append_line(path, "".join(to_line(written(record, redact)) for record, redact in records).encode())


REFUSAL_WINDOW = 10.0  # seconds: a refusal flood's records, at most two per kind per window


class RefusalWindows:
    """Which refusals get an audit record of their own (proxy/fairness.py rule 3, the API's bad
    credentials: lifecycle/api/auth.py rule 5): the first of a kind is recorded at once and opens
    a window; those inside it are only counted."""

    def __init__(self) -> None:
        self._suppressed: dict[tuple[str, str], int] = {}

    def refused(self, key: tuple[str, str]) -> bool:
        """True: record this refusal now (and close the window later with `close`)."""
        if key in self._suppressed:
            self._suppressed[key] += 1
            return False
        self._suppressed[key] = 0
        return True

    def close(self, key: tuple[str, str]) -> int:
        """End the window; returns how many refusals it counted without recording them."""
        return self._suppressed.pop(key, 0)
