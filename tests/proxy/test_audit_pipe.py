"""A worker's audit log (`AuditLog` with `pipe_fd`): a record is one SOCK_SEQPACKET message to
the pool, whole; a record too large for one message goes straight into the live file."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from sandgate.proxy import AuditRecord
from sandgate.proxy.audit import PIPE_RECORD_MAX, AuditLog


def record(detail: str) -> AuditRecord:
    return AuditRecord(
        kind="security_event", sandbox="sbx", client="-", decision="deny", reason="r", detail=detail
    )


def test_a_record_is_one_message_and_an_oversized_one_goes_to_the_file(tmp_path: Path) -> None:
    pool_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, 1 << 20, 2, pipe_fd=worker_end.detach())
    try:
        log.write(record("small"))
        message = pool_end.recv(PIPE_RECORD_MAX)
        assert message.endswith(b"\n") and json.loads(message)["detail"] == "small"
        assert not path.exists()  # the pool writes the file, not the worker

        log.write(record("x" * PIPE_RECORD_MAX))
        pool_end.setblocking(False)
        assert [json.loads(line)["detail"] for line in path.read_text().splitlines()] == [
            "x" * PIPE_RECORD_MAX
        ]
        try:
            pool_end.recv(PIPE_RECORD_MAX)
            raise AssertionError("the oversized record also went down the pipe")
        except BlockingIOError:
            pass
    finally:
        log.close()
        pool_end.close()
