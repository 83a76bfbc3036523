"""Write-ahead audit benchmark: what a request's write-ahead line costs, in CPU time and latency.

`python -m bench write_ahead` (no root, about 20 s). Measures, per record, with the proxy's own
writer classes and a real pool drain (`WorkerPool._drain_audit`, in a forked process, appending
to a real file and answering on a real SOCK_SEQPACKET pair):

- one proxy process: `AuditLog.write` (what every record cost before) against
  `AuditLog.write_ahead` (the same write, awaited);
- a worker: `write` (a send down the pipe) against `write_ahead` (send, the pool's write, its
  answer), one request at a time (c=1: the round trip) and 32 at once (c=32: the pool writes and
  answers in batches);
- the same with `audit_fsync`.

CPU time is the worker's and the pool's together (getrusage), so the figures hold on a busy
machine better than the wall-clock ones, which are given too (p50 of the c=1 round trip).
`SANDGATE_BENCH_WAL_RECORDS` sets the records per row (default 4000).
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench import sized
from sandgate.proxy.audit import PIPE_RECORD_MAX, AuditLog
from sandgate.proxy.contract.audit import INCOMPLETE, AuditRecord
from sandgate.proxy.contract.config import ProxyConfig
from sandgate.proxy.workers import WorkerPool

RECORDS = int(os.environ.get("SANDGATE_BENCH_WAL_RECORDS", sized(4000, 200)))
CONCURRENCY = 32


def record() -> AuditRecord:
    """A typical write-ahead line: an allowed, credentialed HTTPS request."""
    return AuditRecord(
        kind="request",
        sandbox="sbx-0123456789abcdef",
        client="10.213.0.2:51234",
        sni="api.example.com",
        scheme="https",
        method="POST",
        host="api.example.com",
        port=443,
        path="/v1/chat/completions",
        decision="allow",
        reason="rule",
        rule="policy.yaml:12",
        inspect=True,
        binding="model-key",
        event=INCOMPLETE,
    )


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def run_pool(state_dir: Path, pool_end: socket.socket, fsync: bool) -> None:
    """The pool's side, in a forked process: drain, append, answer, until the pipe ends."""
    pool = WorkerPool(ProxyConfig(state_dir=state_dir, audit_fsync=fsync), template=None)

    async def serve() -> None:
        pool_end.setblocking(False)
        pool.pipes[pool_end] = 0
        ended = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(pool_end.fileno(), _drain_until_eof, pool, pool_end, ended)
        await ended

    asyncio.run(serve())


def _drain_until_eof(pool: WorkerPool, sock: socket.socket, ended: asyncio.Future[None]) -> None:
    pool._drain_audit(sock)
    if sock.fileno() < 0 and not ended.done():
        ended.set_result(None)


async def timed(step: Callable[[], Awaitable[None]], count: int, concurrency: int) -> list[float]:
    """`count` awaits of `step`, `concurrency` at a time; each one's wall time."""
    times: list[float] = []

    async def one_client(share: int) -> None:
        for _ in range(share):
            start = time.perf_counter()
            await step()
            times.append(time.perf_counter() - start)

    shares = [count // concurrency + (1 if i < count % concurrency else 0) for i in range(concurrency)]
    await asyncio.gather(*(one_client(share) for share in shares))
    return times


def row(label: str, count: int, cpu: float, times: list[float]) -> None:
    p50 = statistics.median(times) * 1e6
    print(f"  {label:<58} {cpu / count * 1e6:8.1f} us CPU/record  p50 {p50:8.1f} us", flush=True)


def one_process(state_dir: Path, fsync: bool) -> None:
    log = AuditLog(state_dir / "one.jsonl", 1 << 30, 1, fsync=fsync)
    line = record()

    async def plain() -> None:
        log.write(line)

    async def ahead() -> None:
        await log.write_ahead(line)

    for label, step in (("one process, write", plain), ("one process, write_ahead", ahead)):
        before = cpu_seconds(resource.RUSAGE_SELF)
        times = asyncio.run(timed(step, RECORDS, 1))
        cpu = cpu_seconds(resource.RUSAGE_SELF) - before
        row(f"{label}{' + fsync' if fsync else ''}", RECORDS, cpu, times)
    log.close()


def through_the_pool(state_dir: Path, fsync: bool) -> None:
    for label, concurrency, ahead in (
        ("worker, write (send only)", 1, False),
        ("worker, write_ahead, c=1", 1, True),
        (f"worker, write_ahead, c={CONCURRENCY}", CONCURRENCY, True),
    ):
        cpu, times = pool_run(state_dir, fsync, concurrency, ahead)
        row(f"{label}{' + fsync' if fsync else ''}", RECORDS, cpu, times)


def pool_run(state_dir: Path, fsync: bool, concurrency: int, ahead: bool) -> tuple[float, list[float]]:
    """RECORDS records from this process (the worker) to a forked pool: CPU of both, wall times."""
    pool_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * PIPE_RECORD_MAX)
    before_children = cpu_seconds(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        worker_end.close()
        try:
            run_pool(state_dir, pool_end, fsync)
        finally:
            os._exit(0)
    pool_end.close()
    line = record()

    async def worker() -> list[float]:
        log = AuditLog(state_dir / "audit.jsonl", 1 << 30, 1, pipe_fd=worker_end.detach())
        log.listen(asyncio.get_running_loop())

        async def step() -> None:
            if ahead:
                await log.write_ahead(line)
            else:
                log.write(line)

        times = await timed(step, RECORDS, concurrency)
        log.close()  # EOF: the pool ends once it has written everything
        return times

    before = cpu_seconds(resource.RUSAGE_SELF)
    times = asyncio.run(worker())
    own = cpu_seconds(resource.RUSAGE_SELF) - before
    _pid, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the pool process ended with {status}")
    return own + cpu_seconds(resource.RUSAGE_CHILDREN) - before_children, times


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{RECORDS} records per row, load average {load}")
    for fsync in (False, True):
        with tempfile.TemporaryDirectory(prefix="sandgate-wal-") as tmp:
            one_process(Path(tmp), fsync)
            through_the_pool(Path(tmp), fsync)


if __name__ == "__main__":
    main()
