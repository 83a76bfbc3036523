"""The one writer of audit lines: a record is the decision serialised, and what reaches the file
has no secret in any free-text field, no query string, and only valid UTF-8; a write that fails
leaves nothing half-written and says why, and a write-ahead that fails raises."""

from __future__ import annotations

import asyncio
import errno
import json
import resource
from pathlib import Path

import pytest

from sandgate.policy import Decision, Request, compile_policy, parse_policy
from sandgate.proxy import verify_chain
from sandgate.proxy.audit import AuditFile, AuditLog, AuditUnwritable
from sandgate.proxy.contract.audit import FREE_TEXT, AuditRecord, append_record
from sandgate.vault import Redactor

SECRET = "sk-writer-5d1c9e0b7a2f4e68"


def test_a_record_is_the_decision_and_report_mode_is_report() -> None:
    policy = compile_policy(parse_policy({"mode": "report", "defaultAction": "deny", "egress": []}, "<t>"))
    decision = policy.decide(Request(host="denied.example.com", port=443, scheme="https"))
    assert decision.allowed and decision.outcome == "report"
    record = AuditRecord.of("connection", "sbx", "10.0.0.2:1", decision, host="denied.example.com")
    assert (record.decision, record.reason, record.rule) == ("report", "default", None)
    refused = Decision("deny", "always_denied_range", detail="10.0.0.0/8 (private)")
    assert AuditRecord.of("request", "sbx", "-", refused).detail == "10.0.0.0/8 (private)"
    assert AuditRecord.of("request", "sbx", "-", refused, detail="mine").detail == "mine"


def test_every_free_text_field_is_redacted_when_written(tmp_path: Path) -> None:
    texts = {name: f"{name} {SECRET} x" for name in FREE_TEXT}
    texts["path"] = f"/bot/{SECRET}/send?token={SECRET}"
    record = AuditRecord(kind="request", sandbox="sbx", client="c", decision="deny", **texts)
    log = AuditLog(tmp_path / "audit.jsonl", 1 << 20, 1, Redactor([SECRET]).redact_text)
    log.write(record)
    log.close()
    line = (tmp_path / "audit.jsonl").read_text()
    assert SECRET not in line
    written = json.loads(line)
    assert written["path"] == "/bot/[REDACTED]/send?<redacted>"
    assert all(written[name] == f"{name} [REDACTED] x" for name in FREE_TEXT if name != "path")


def test_bytes_that_are_not_utf8_and_controls_are_kept_as_valid_json(tmp_path: Path) -> None:
    # mitmproxy keeps undecodable bytes of a request line as lone surrogates: the JSON encoder
    # refused them, so the record was lost. They are written as `\xNN` text; controls stay.
    path = "/a\udcff\udc9b\x1b[2J\u202e"
    record = AuditRecord(kind="request", sandbox="sbx", client="c", decision="deny", reason="r", path=path)
    append_record(tmp_path / "audit.jsonl", record)
    [line] = (tmp_path / "audit.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["path"] == "/a\\xff\\x9b\x1b[2J\u202e"


def test_a_write_that_fails_leaves_no_part_and_says_why_until_one_succeeds(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the kernel refuse writes past a size (EFBIG; Python ignores SIGXFSZ), as
    a full disk would: the write raises, nothing of it stays in the file (a full disk takes what
    fits), `failure` says why, and the next write that fits clears it."""
    path = tmp_path / "audit.jsonl"
    audit = AuditFile(path, 1 << 20, 1)
    audit.write(b'{"first": 1}\n')
    before = path.read_bytes()
    size = len(before)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 5, hard))
    try:
        with pytest.raises(OSError) as raised:
            audit.write(b'{"second": "longer than five bytes"}\n')
        assert raised.value.errno == errno.EFBIG
        assert audit.failure is not None and "EFBIG" in audit.failure
        assert path.read_bytes() == before  # the five bytes that fitted were taken back
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    audit.write(b'{"third": 3}\n')
    assert audit.failure is None
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [{k: v for k, v in line.items() if k != "prev"} for line in lines] == [{"first": 1}, {"third": 3}]
    assert verify_chain(path).problems == [] and verify_chain(path).chained == 2
    audit.close()


def test_write_ahead_raises_where_the_file_cannot_be_written(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", 1 << 20, 1)
    record = AuditRecord(kind="request", sandbox="sbx", client="c", decision="allow", reason="r")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        with pytest.raises(AuditUnwritable, match="EFBIG"):
            asyncio.run(log.write_ahead(record))
        log.write(record)  # a plain write is lost, logged, and not raised
        assert log.failure is not None
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    asyncio.run(log.write_ahead(record))
    assert log.failure is None and json.loads((tmp_path / "audit.jsonl").read_text())["id"] == record.id
    log.close()
