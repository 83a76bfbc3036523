"""The worker pool: N proxy processes behind one control socket, one audit file and shared listeners.

Rules:
1. `python -m sandgate.proxy` with `ProxyConfig.workers` other than 1 runs this pool (a small
   asyncio process, no mitmproxy) and N workers. The pool binds each TCP listener once per
   worker with SO_REUSEPORT and keeps every one open: the kernel spreads new connections over
   the workers by a hash of addresses and ports (so one sandbox's connections spread too), and
   the listener of a dead or restarting worker keeps its queue, which its replacement serves.
   Worker i runs `python -m sandgate.proxy --config FILE --worker i/N --fds T,E,A` and inherits
   its two listeners and its audit pipe.
2. Every worker holds every sandbox's entry. The pool keeps the entries (its table) and serves
   lifecycle's control API (`ProxyControl`, the same routes). A change goes to every running
   worker's own socket and succeeds only if every one took it; a worker that did not (an error,
   no answer, an answer unlike the others') is killed, and its replacement gets the table. A
   policy the workers reject is answered 422 and changes nothing.
3. A worker starts with no entries and accepts nothing until the pool has replayed the whole
   table into it, under the lock that orders changes, and sent `POST /serve`. So no connection
   meets a worker that lacks its sandbox's entry: it waits in its listener's queue meanwhile.
4. A dead worker's connections die with it (the kernel resets them: fail closed); the pool
   restarts it (backoff 0.5 s doubling to 10 s). Workers die with the pool (PR_SET_PDEATHSIG).
5. One audit stream: a worker sends each record as one message on a SOCK_SEQPACKET pair (whole or
   not at all: never cut, never interleaved); the pool appends what arrives to the one
   `AuditFile`, which it alone rotates.
6. `GET /metrics` sums every worker's series (`metrics.summed`) and adds the pool's own.
7. DNS: mitmproxy's UDP server can neither share a port nor take an inherited socket, so worker
   0 alone serves DNS; the others ask it (`PeerNames`) for the name a sandbox resolved an
   address from, when a connection carries no name of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from sandgate.proxy.audit import PIPE_RECORD_MAX, AuditFile
from sandgate.proxy.config import ProxyConfig, SandboxEntry
from sandgate.proxy.control import ControlServer, VaultChange
from sandgate.proxy.frontdoor import ListenError, listen_socket
from sandgate.proxy.metrics import summed
from sandgate.proxy.resolver import NameMemory

log = logging.getLogger(__name__)

DNS_WORKER = 0
START_TIMEOUT = 30.0  # a worker must answer on its control socket within this
CHANGE_TIMEOUT = 4.0  # per worker; below ProxyControl's 5 s, so lifecycle hears why
PR_SET_PDEATHSIG = 1


def worker_count(config: ProxyConfig) -> int:
    return config.workers or os.cpu_count() or 1


def worker_socket(config: ProxyConfig, index: int) -> Path:
    """Worker `index`'s own control socket, beside the pool's."""
    path = config.socket_path
    return path.with_name(f"{path.stem}-worker-{index}.sock")


# ---------------------------------------------------------------------- the worker's side


@dataclass(frozen=True)
class WorkerSlot:
    """What a worker is told on its command line: which one it is, and its inherited descriptors."""

    index: int
    count: int
    fds: tuple[int, int, int]  # transparent listener, explicit listener, audit pipe
    pool: int  # the pool's PID

    @classmethod
    def parse(cls, worker: str, fds: str, pool: int) -> WorkerSlot:
        index, _, count = worker.partition("/")
        transparent, explicit, audit = (int(fd) for fd in fds.split(","))
        return cls(int(index), int(count), (transparent, explicit, audit), pool)

    def argv(self) -> list[str]:
        fds = ",".join(map(str, self.fds))
        return ["--worker", f"{self.index}/{self.count}", "--fds", fds, "--pool", str(self.pool)]

    @property
    def serves_dns(self) -> bool:
        return self.index == DNS_WORKER

    @property
    def audit_fd(self) -> int:
        return self.fds[2]

    def listeners(self) -> tuple[socket.socket, socket.socket]:
        transparent, explicit = (socket.socket(fileno=fd) for fd in self.fds[:2])
        for sock in (transparent, explicit):
            sock.setblocking(False)
        return transparent, explicit


def die_with_pool(pool: int) -> None:
    """A worker gets SIGTERM when the pool ends, however it ends (rule 4); a pool that ended
    before this was set (the worker was still starting) ends the worker here."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != pool:
        raise SystemExit(f"sandgate proxy worker: the pool (pid {pool}) is gone")


class PeerNames(NameMemory):
    """A worker without the DNS listener asks the DNS worker (rule 7). Any failure is no name:
    the connection is judged by its address, as if the sandbox had never asked (fail closed)."""

    def __init__(self, dns_worker_socket: Path) -> None:
        super().__init__()
        transport = httpx.AsyncHTTPTransport(uds=str(dns_worker_socket))
        self._client = httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=2.0)

    async def lookup(self, sandbox_address: str, address: str) -> str | None:
        try:
            response = await self._client.get(f"/names/{sandbox_address}/{address}")
            response.raise_for_status()
            name = response.json()["name"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            log.warning("DNS worker: no name for %s from %s: %r", address, sandbox_address, exc)
            return None
        return name if isinstance(name, str) else None


# ---------------------------------------------------------------------- the pool


@dataclass
class Worker:
    index: int
    listeners: tuple[socket.socket, socket.socket]
    control: httpx.AsyncClient
    process: asyncio.subprocess.Process | None = None
    serving: bool = False  # replayed and accepting: changes go to it
    restarts: int = 0


@dataclass
class Answer:
    status: int
    body: Any


class PoolStartError(RuntimeError):
    """A worker did not start; the message says which and why."""


@dataclass
class WorkerPool:
    config: ProxyConfig
    config_path: Path
    log_level: str = "WARNING"
    entries: dict[str, SandboxEntry] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.entries = {entry.address: entry for entry in self.config.sandboxes}
        self.audit = AuditFile(self.config.audit_path, self.config.audit_max_bytes, self.config.audit_backups)
        self.lock = asyncio.Lock()  # orders changes and replays (rules 2 and 3)
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        """Bind, start every worker, serve the control socket until SIGTERM/SIGINT, then stop
        the workers. Raises ListenError or PoolStartError if the pool cannot start."""
        ports = (self.config.transparent_port, self.config.explicit_port)
        for index in range(worker_count(self.config)):
            transparent, explicit = (listen_socket(self.config, port, reuse_port=True) for port in ports)
            uds = httpx.AsyncHTTPTransport(uds=str(worker_socket(self.config, index)))
            client = httpx.AsyncClient(transport=uds, base_url="http://worker", timeout=CHANGE_TIMEOUT)
            self.workers.append(Worker(index, (transparent, explicit), client))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        control = ControlServer(pool_app(self), self.config.socket_path)
        try:
            await asyncio.gather(*(self._start(worker) for worker in self.workers))
            await control.start()
            keepers = [asyncio.create_task(self._keep(worker)) for worker in self.workers]
            await self.stopping.wait()
            for keeper in keepers:
                keeper.cancel()
            await control.stop()
        finally:
            await self._stop_workers()
            self.audit.close()

    # ------------------------------------------------------------------ workers

    async def _start(self, worker: Worker) -> None:
        pool_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * PIPE_RECORD_MAX)
        pool_end.setblocking(False)
        asyncio.get_running_loop().add_reader(pool_end.fileno(), self._drain_audit, pool_end)
        slot = WorkerSlot(
            worker.index,
            len(self.workers),
            (worker.listeners[0].fileno(), worker.listeners[1].fileno(), worker_end.fileno()),
            os.getpid(),
        )
        argv = ["-m", "sandgate.proxy", "--config", str(self.config_path), "--log-level", self.log_level]
        worker.process = await asyncio.create_subprocess_exec(
            sys.executable, *argv, *slot.argv(), pass_fds=slot.fds, stdin=asyncio.subprocess.DEVNULL
        )
        worker_end.close()  # the worker holds it now; EOF on pool_end when the worker is gone
        await self._wait_answering(worker)
        async with self.lock:  # rule 3: the whole table, then serve
            for entry in self.entries.values():
                await self._expect(worker, "PUT", f"/sandboxes/{entry.address}", entry.model_dump_json(), 200)
            await self._expect(worker, "POST", "/serve", None, 200)
            worker.serving = True
        log.info("proxy worker %d (pid %d) serving", worker.index, worker.process.pid)

    async def _wait_answering(self, worker: Worker) -> None:
        assert worker.process is not None
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT
        while True:
            if worker.process.returncode is not None:
                raise PoolStartError(
                    f"proxy worker {worker.index} exited with status {worker.process.returncode} "
                    "while starting (its log is the proxy's)"
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await worker.control.get("/health")).is_success:
                    return
            if asyncio.get_running_loop().time() > deadline:
                worker.process.kill()
                raise PoolStartError(f"proxy worker {worker.index} did not answer within {START_TIMEOUT:g} s")
            await asyncio.sleep(0.05)

    async def _expect(self, worker: Worker, method: str, path: str, body: str | None, status: int) -> None:
        answer = await self._call(worker, method, path, body)
        if isinstance(answer, Exception) or answer.status != status:
            assert worker.process is not None
            worker.process.kill()
            raise PoolStartError(f"proxy worker {worker.index} starting: {method} {path} -> {answer!r}")

    async def _keep(self, worker: Worker) -> None:
        """Restart the worker whenever it exits (rule 4)."""
        backoff = 0.5
        while True:
            assert worker.process is not None
            status = await worker.process.wait()
            worker.serving = False
            pid = worker.process.pid
            log.error("proxy worker %d (pid %d) exited with status %s; restarting", worker.index, pid, status)
            while True:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                try:
                    await self._start(worker)
                except (PoolStartError, OSError) as exc:
                    log.error("%s; retrying", exc)
                    continue
                worker.restarts += 1
                backoff = 0.5
                break

    async def _stop_workers(self) -> None:
        running = [w.process for w in self.workers if w.process and w.process.returncode is None]
        for process in running:
            process.terminate()
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), 5.0)
        except TimeoutError:
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()

    def _drain_audit(self, sock: socket.socket) -> None:
        """Append every record waiting on a worker's pipe (rule 5); at EOF the pipe is closed."""
        records: list[bytes] = []
        while True:
            try:
                record = sock.recv(PIPE_RECORD_MAX)
            except BlockingIOError:
                break
            except OSError:
                record = b""
            if not record:
                asyncio.get_running_loop().remove_reader(sock.fileno())
                sock.close()
                break
            records.append(record)
        if records:
            self.audit.write(b"".join(records))

    # ------------------------------------------------------------------ changes (rule 2)

    async def change(self, method: str, path: str, body: str | None) -> Answer:
        async with self.lock:
            targets = [worker for worker in self.workers if worker.serving]
            if not targets:
                return Answer(503, {"detail": "no proxy worker is serving (the pool restarts them); retry"})
            answers = await asyncio.gather(*(self._call(worker, method, path, body) for worker in targets))
            took = [_took(method, answer) for answer in answers]
            if any(took):
                self._apply(method, path, body)
            missing = [
                (worker, answer)
                for worker, answer, taken in zip(targets, answers, took, strict=True)
                if not isinstance(answer, Answer) or answer.status >= 500 or (any(took) and not taken)
            ]
            if not missing:
                first = answers[0]
                assert isinstance(first, Answer)
                return first
            for worker, _answer in missing:
                assert worker.process is not None
                worker.serving = False
                worker.process.kill()  # its replacement gets the pool's table (rule 2)
            said = "; ".join(f"worker {worker.index}: {answer!r}" for worker, answer in missing)
            detail = f"{method} {path} was not taken by every proxy worker ({said}); those are restarted"
            return Answer(502, {"detail": detail})

    def _apply(self, method: str, path: str, body: str | None) -> None:
        if path.startswith("/sandboxes/"):
            address = path.removeprefix("/sandboxes/")
            if method == "PUT" and body is not None:
                self.entries[address] = SandboxEntry.model_validate_json(body)
            elif method == "DELETE":
                self.entries.pop(address, None)

    async def _call(self, worker: Worker, method: str, path: str, body: str | None) -> Answer | Exception:
        try:
            response = await worker.control.request(
                method, path, content=body, headers={"content-type": "application/json"} if body else None
            )
        except httpx.HTTPError as exc:
            return exc
        try:
            payload = response.json() if response.content else None
        except ValueError:
            payload = response.text
        return Answer(response.status_code, payload)

    async def metrics(self) -> str:
        texts = []
        for worker in self.workers:
            if worker.serving:
                with contextlib.suppress(httpx.HTTPError):
                    response = await worker.control.get("/metrics")
                    if response.is_success:
                        texts.append(response.text)
        serving = sum(worker.serving for worker in self.workers)
        restarts = sum(worker.restarts for worker in self.workers)
        own = [
            "# HELP sandgate_proxy_workers Proxy worker processes, by whether they serve now.",
            "# TYPE sandgate_proxy_workers gauge",
            f'sandgate_proxy_workers{{state="serving"}} {serving}',
            f'sandgate_proxy_workers{{state="down"}} {len(self.workers) - serving}',
            "# HELP sandgate_proxy_worker_restarts_total Proxy workers restarted after they died.",
            "# TYPE sandgate_proxy_worker_restarts_total counter",
            f"sandgate_proxy_worker_restarts_total {restarts}",
        ]
        return summed([*texts, "\n".join(own) + "\n"])

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if any(worker.serving for worker in self.workers) else "no worker serving",
            "sandboxes": len(self.entries),
            "pid": os.getpid(),
            "workers": [
                {
                    "index": worker.index,
                    "pid": worker.process.pid if worker.process else None,
                    "serving": worker.serving,
                    "restarts": worker.restarts,
                }
                for worker in self.workers
            ],
        }


def _took(method: str, answer: Answer | Exception) -> bool:
    """The worker did what was asked (deleting what it does not hold counts)."""
    if not isinstance(answer, Answer):
        return False
    return answer.status < 300 or (method == "DELETE" and answer.status == 404)


def pool_app(pool: WorkerPool) -> FastAPI:
    """The control API of docs/proxy.md, served by the pool (routes as proxy/control.py)."""
    app = FastAPI(title="sandgate proxy pool control", docs_url=None, redoc_url=None, openapi_url=None)

    def reply(answer: Answer) -> Response:
        if answer.status == 204:
            return Response(status_code=204)
        return JSONResponse(status_code=answer.status, content=answer.body)

    @app.put("/sandboxes/{address}")
    async def put_sandbox(address: str, entry: SandboxEntry) -> Response:
        if entry.address != address:
            raise HTTPException(422, f"path address {address} differs from body address {entry.address}")
        return reply(await pool.change("PUT", f"/sandboxes/{address}", entry.model_dump_json()))

    @app.delete("/sandboxes/{address}")
    async def drop_sandbox(address: str) -> Response:
        return reply(await pool.change("DELETE", f"/sandboxes/{address}", None))

    @app.post("/vault/changed")
    async def vault_changed(change: VaultChange) -> Response:
        return reply(await pool.change("POST", "/vault/changed", change.model_dump_json()))

    @app.get("/sandboxes")
    def list_sandboxes() -> list[SandboxEntry]:
        return list(pool.entries.values())

    @app.get("/sandboxes/{address}")
    def get_sandbox(address: str) -> SandboxEntry:
        entry = pool.entries.get(address)
        if entry is None:
            raise HTTPException(404, f"no sandbox at {address}")
        return entry

    @app.get("/health")
    def health() -> JSONResponse:
        state = pool.health()
        return JSONResponse(status_code=200 if state["status"] == "ok" else 503, content=state)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(await pool.metrics(), media_type="text/plain; version=0.0.4")

    return app


def run_pool(config: ProxyConfig, config_path: Path, log_level: str) -> None:
    """The entry point of `python -m sandgate.proxy` when the config asks for workers."""
    asyncio.run(WorkerPool(config, config_path, log_level).run())


__all__ = ["ListenError", "PeerNames", "PoolStartError", "WorkerSlot", "run_pool", "worker_socket"]
