"""A worker's audit log (`AuditLog` with `pipe_fd`): a record is one SOCK_SEQPACKET message to
the pool, whole; a record too large for one message goes straight into the live file; a
write-ahead waits for the pool's answer that it is in the file."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from sandgate.proxy import AuditRecord
from sandgate.proxy.audit import PIPE_RECORD_MAX, AuditLog, AuditUnwritable, PipeAnswer


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


def test_write_ahead_waits_for_the_pools_answer_and_fails_with_its_why(tmp_path: Path) -> None:
    """The pool answers "ok N" once a worker's first N messages are in the file; a write-ahead
    returns only then. "fail N why" refuses it with why, and the worker's log keeps `failure`
    until an "ok" comes (the pool's news also reaches a worker with nothing waiting)."""
    pool_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    async def scenario() -> None:
        log = AuditLog(tmp_path / "audit.jsonl", 1 << 20, 2, pipe_fd=worker_end.detach())
        log.listen(asyncio.get_running_loop())
        log.write(record("plain"))  # message 1: not waited for, but counted
        ahead = asyncio.create_task(log.write_ahead(record("ahead")))  # message 2
        await asyncio.sleep(0.05)
        assert [json.loads(pool_end.recv(PIPE_RECORD_MAX))["detail"] for _ in range(2)] == ["plain", "ahead"]
        pool_end.send(PipeAnswer(1, None).encode())  # covers message 1 only
        await asyncio.sleep(0.05)
        assert not ahead.done(), "a write-ahead returned before the pool had written it"
        pool_end.send(PipeAnswer(2, None).encode())
        await asyncio.wait_for(ahead, 5)

        refused = asyncio.create_task(log.write_ahead(record("refused")))  # message 3
        await asyncio.sleep(0.05)
        pool_end.recv(PIPE_RECORD_MAX)
        pool_end.send(
            PipeAnswer(3, "the audit log cannot be written (ENOSPC: No space left on device)").encode()
        )
        with pytest.raises(AuditUnwritable, match="ENOSPC"):
            await asyncio.wait_for(refused, 5)
        assert log.failure is not None and "ENOSPC" in log.failure
        pool_end.send(PipeAnswer(3, None).encode())  # written again: the news reaches the worker
        for _ in range(100):
            if log.failure is None:
                break
            await asyncio.sleep(0.01)
        assert log.failure is None
        log.close()

    try:
        asyncio.run(scenario())
    finally:
        pool_end.close()
