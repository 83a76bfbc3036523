"""The worker pool: N proxy processes behind one control socket, one audit file and shared listeners.

Rules:
1. `python -m sandgate.proxy` with `ProxyConfig.workers` other than 1 runs this pool (a small
   asyncio process) and N workers. The pool binds each TCP listener once per worker with
   SO_REUSEPORT and keeps every one open: the kernel spreads new connections over the workers
   by a hash of addresses and ports (so one sandbox's connections spread too), and the listener
   of a dead or restarting worker keeps its queue, which its replacement serves. Workers are
   forked by the worker template (proxy/template.py), which hands each its two listeners and
   its audit pipe: a worker starts in a fork, not in a 1.2 s import.
2. Every worker holds every sandbox's entry. The pool keeps the entries (its table) and serves
   lifecycle's control API (`ProxyControl`, the same routes). A change goes to every running
   worker's own socket and succeeds only if every one took it; a worker that did not (an error,
   no answer, an answer unlike the others') is killed, and its replacement gets the table. A
   policy the workers reject is answered 422 and changes nothing.
3. A worker starts with no entries and accepts nothing until the pool has replayed the whole
   table into it, under the lock that orders changes, and sent `POST /serve`. So no connection
   meets a worker that lacks its sandbox's entry: it waits in its listener's queue meanwhile.
4. A dead worker's connections die with it (the kernel resets them: fail closed); the pool
   restarts it (backoff 0.5 s doubling to 10 s). Workers die with the template and the template
   with the pool (PR_SET_PDEATHSIG); the pool ends, with an error, when its template ends.
5. One audit stream: a worker sends each record as one message on a SOCK_SEQPACKET pair (whole or
   not at all: never cut, never interleaved); the pool appends what arrives to the one
   `AuditFile`, which it alone rotates, one write per batch, and answers on the same pair how
   many of that worker's messages are in the file (`PipeAnswer`): a worker forwards a request
   only after its write-ahead line is (proxy/audit.py, rule 5). A batch that cannot be written
   is answered "fail" with why, and every worker hears of it, until a batch is written again.
6. `GET /metrics` sums every worker's series (`metrics.summed`) and adds the pool's own.
7. DNS: mitmproxy's UDP server can neither share a port nor take an inherited socket, so the
   pool serves DNS itself (proxy/pooldns.py: the same `DnsAddon`, over a table that follows
   every change the workers took), and DNS answers while any worker restarts. Workers ask the
   pool (`PeerNames`, `GET /names/...`) for the name a sandbox resolved an address from, when a
   connection carries no name of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from sandgate.proxy.audit import PIPE_RECORD_MAX, AuditFile, PipeAnswer
from sandgate.proxy.contract.config import ProxyConfig, SandboxEntry
from sandgate.proxy.contract.control import (
    POOL_ROUTES,
    ROUTES,
    WORKER_ROUTES,
    ApprovalAnswer,
    Route,
    VaultChange,
)
from sandgate.proxy.contract.names import worker_socket as worker_socket_path
from sandgate.proxy.control import ControlServer, on
from sandgate.proxy.frontdoor import ListenError, listen_socket
from sandgate.proxy.metrics import summed
from sandgate.proxy.pooldns import PoolDns
from sandgate.proxy.resolver import NameMemory
from sandgate.proxy.template import Template, TemplateGone, WorkerProcess, WorkerSlot

log = logging.getLogger(__name__)
Change = SandboxEntry | VaultChange  # a change the pool fans out (None: a drop)

START_TIMEOUT = 30.0  # a worker must answer on its control socket within this
CHANGE_TIMEOUT = 4.0  # per worker; below ProxyControl's 5 s, so lifecycle hears why


def worker_count(config: ProxyConfig) -> int:
    return config.workers or os.cpu_count() or 1


def worker_socket(config: ProxyConfig, index: int) -> Path:
    """Worker `index`'s own control socket, beside the pool's."""
    return worker_socket_path(config.socket_path, index)


# ---------------------------------------------------------------------- the worker's side


class PeerNames(NameMemory):
    """A worker asks the pool, which serves DNS (rule 7). Any failure is no name: the
    connection is judged by its address, as if the sandbox had never asked (fail closed)."""

    def __init__(self, pool_socket: Path) -> None:
        super().__init__()
        transport = httpx.AsyncHTTPTransport(uds=str(pool_socket))
        self._client = httpx.AsyncClient(transport=transport, base_url="http://pool", timeout=2.0)

    async def lookup(self, sandbox_address: str, address: str) -> str | None:
        try:
            response = await self._client.get(
                POOL_ROUTES.name_for.at(sandbox_address=sandbox_address, address=address)
            )
            response.raise_for_status()
            name = response.json()["name"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            log.warning("the pool's DNS: no name for %s from %s: %r", address, sandbox_address, exc)
            return None
        return name if isinstance(name, str) else None


# ---------------------------------------------------------------------- the pool


@dataclass
class Worker:
    index: int
    listeners: tuple[socket.socket, socket.socket]
    control: httpx.AsyncClient
    process: WorkerProcess | None = None
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
    template: Template
    entries: dict[str, SandboxEntry] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.entries = {entry.address: entry for entry in self.config.sandboxes}
        config = self.config
        self.audit = AuditFile(
            config.audit_path, config.audit_max_bytes, config.audit_backups, config.audit_fsync
        )
        self.pipes: dict[socket.socket, int] = {}  # each worker's audit pipe -> messages handled
        self.told: str | None = None  # the audit failure every worker was last told of
        self.dns = PoolDns(config, self.audit)
        self.lock = asyncio.Lock()  # orders changes and replays (rules 2 and 3)
        self.stopping = asyncio.Event()
        self.template_lost = False

    async def run(self) -> None:
        """Bind, start every worker, serve the control socket until SIGTERM/SIGINT, then stop
        the workers. Raises ListenError or PoolStartError if the pool cannot start, and
        PoolStartError when its template ends (rule 4)."""
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
        watcher = asyncio.create_task(self._watch_template())
        try:
            await self.dns.start(list(self.entries.values()))
            await asyncio.gather(*(self._start(worker) for worker in self.workers))
            await control.start()
            keepers = [asyncio.create_task(self._keep(worker)) for worker in self.workers]
            await self.stopping.wait()
            for keeper in keepers:
                keeper.cancel()
            await control.stop()
        finally:
            watcher.cancel()
            await self._stop_workers()
            await self.dns.stop()
            self.audit.close()
        if self.template_lost:
            raise PoolStartError(f"the worker template (pid {self.template.pid}) ended, and the pool with it")

    async def _watch_template(self) -> None:
        await self.template.ended()
        log.error("the worker template (pid %d) ended; stopping the pool", self.template.pid)
        self.template_lost = True
        self.stopping.set()

    # ------------------------------------------------------------------ workers

    async def _start(self, worker: Worker) -> None:
        pool_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * PIPE_RECORD_MAX)
        pool_end.setblocking(False)
        self.pipes[pool_end] = 0
        asyncio.get_running_loop().add_reader(pool_end.fileno(), self._drain_audit, pool_end)
        fds = (worker.listeners[0].fileno(), worker.listeners[1].fileno(), worker_end.fileno())
        try:
            worker.process = await self.template.fork(worker.index, len(self.workers), fds, START_TIMEOUT)
        except TemplateGone as exc:
            raise PoolStartError(str(exc)) from exc
        finally:
            worker_end.close()  # the worker holds it now; EOF on pool_end when the worker is gone
        await self._wait_answering(worker)
        async with self.lock:  # rule 3: the whole table, then serve
            for entry in self.entries.values():
                await self._expect(
                    worker,
                    ROUTES.put_sandbox.method,
                    ROUTES.put_sandbox.at(address=entry.address),
                    entry.model_dump_json(),
                    200,
                )
            await self._expect(worker, WORKER_ROUTES.serve.method, WORKER_ROUTES.serve.path, None, 200)
            worker.serving = True
        log.info("proxy worker %d (pid %d) serving", worker.index, worker.process.pid)

    async def _wait_answering(self, worker: Worker) -> None:
        assert worker.process is not None
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT
        while True:
            if not worker.process.running:
                raise PoolStartError(
                    f"proxy worker {worker.index} ended while starting (see the proxy's log)"
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await worker.control.get(ROUTES.health.path)).is_success:
                    return
            if asyncio.get_running_loop().time() > deadline:
                worker.process.send(signal.SIGKILL)
                raise PoolStartError(f"proxy worker {worker.index} did not answer within {START_TIMEOUT:g} s")
            await asyncio.sleep(0.05)

    async def _expect(self, worker: Worker, method: str, path: str, body: str | None, status: int) -> None:
        answer = await self._call(worker, method, path, body)
        if isinstance(answer, Exception) or answer.status != status:
            assert worker.process is not None
            worker.process.send(signal.SIGKILL)
            raise PoolStartError(f"proxy worker {worker.index} starting: {method} {path} -> {answer!r}")

    async def _keep(self, worker: Worker) -> None:
        """Restart the worker whenever it ends (rule 4)."""
        backoff = 0.5
        while True:
            process = worker.process
            assert process is not None
            await process.wait()
            process.close()
            worker.serving = False
            log.error("proxy worker %d (pid %d) ended; restarting", worker.index, process.pid)
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
        running = [w.process for w in self.workers if w.process and w.process.running]
        for process in running:
            process.send(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), 5.0)
        except TimeoutError:
            for process in running:
                process.send(signal.SIGKILL)
        self.template.stop()

    def _drain_audit(self, sock: socket.socket) -> None:
        """Append every record waiting on a worker's pipe and answer it (rule 5); at EOF the
        pipe is closed."""
        records: list[bytes] = []
        ended = False
        while True:
            try:
                record = sock.recv(PIPE_RECORD_MAX)
            except BlockingIOError:
                break
            except OSError:
                record = b""
            if not record:
                ended = True
                break
            records.append(record)
        if records:
            self.pipes[sock] += len(records)
            try:
                self.audit.write(b"".join(records))
            except OSError:
                log.error("%d audit records from a worker not written: %s", len(records), self.audit.failure)
            if self.audit.failure != self.told:  # the news (unwritable, or written again) for all
                self.told = self.audit.failure
                for pipe in list(self.pipes):
                    self._answer(pipe)
            elif not ended:
                self._answer(sock)
        if ended:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            self.pipes.pop(sock, None)
            sock.close()

    def _answer(self, sock: socket.socket) -> None:
        """A late or lost answer is only late: the next one counts every message before it."""
        with contextlib.suppress(OSError):
            sock.send(PipeAnswer(self.pipes[sock], self.audit.failure).encode())

    # ------------------------------------------------------------------ changes (rule 2)

    async def change(self, route: Route, address: str | None, payload: Change | None) -> Answer:
        """Send one change to every serving worker (`address` fills a sandbox route's path); the
        payload is written as JSON once, and the pool's own table and DNS take the object."""
        method, path = route.method, route.at(address=address) if address else route.path
        body = payload.model_dump_json() if payload is not None else None
        async with self.lock:
            targets = [worker for worker in self.workers if worker.serving]
            if not targets:
                return Answer(503, {"detail": "no proxy worker is serving (the pool restarts them); retry"})
            # The pool's DNS table takes the change beside the workers (it compiles the same
            # policy, so it refuses what they refuse); put back if none of them took it.
            answers, _ = await asyncio.gather(
                asyncio.gather(*(self._call(worker, method, path, body) for worker in targets)),
                self._follow(route, address, payload),
            )
            took = [_took(method, answer) for answer in answers]
            if any(took):
                self._apply(address, payload)
            elif address is not None:
                await self._restore_dns(address)
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
                worker.process.send(signal.SIGKILL)  # its replacement gets the pool's table (rule 2)
            said = "; ".join(f"worker {worker.index}: {answer!r}" for worker, answer in missing)
            detail = f"{method} {path} was not taken by every proxy worker ({said}); those are restarted"
            return Answer(502, {"detail": detail})

    def _apply(self, address: str | None, payload: Change | None) -> None:
        """The pool's table follows what the workers took."""
        if isinstance(payload, SandboxEntry):
            self.entries[payload.address] = payload
        elif payload is None and address:
            self.entries.pop(address, None)

    async def _follow(self, route: Route, address: str | None, payload: Change | None) -> None:
        """The pool's DNS server takes the change (rule 7)."""
        if isinstance(payload, SandboxEntry):
            await self.dns.put(payload)
        elif isinstance(payload, VaultChange):
            await self.dns.vault_changed(payload.names)
        elif route == ROUTES.drop_sandbox and address:
            self.dns.drop(address)

    async def _restore_dns(self, address: str) -> None:
        """The DNS table back to the pool's entry for `address` (a change no worker took)."""
        kept = self.entries.get(address)
        if kept is None:
            self.dns.drop(address)
        else:
            await self.dns.put(kept)

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

    async def approvals(self) -> list[Any]:
        """Every worker's held requests (each is held by the worker whose connection it came on)."""
        answers = await asyncio.gather(
            *(self._call(w, "GET", ROUTES.list_approvals.path, None) for w in self._serving())
        )
        lists = [answer.body for answer in answers if isinstance(answer, Answer) and answer.status == 200]
        return [held for found in lists for held in found]

    async def answer_approval(self, approval_id: str, body: str) -> Answer:
        """The answer goes to every worker; the one that holds the request takes it (200)."""
        route = ROUTES.answer_approval
        path = route.at(approval_id=approval_id)
        answers = await asyncio.gather(*(self._call(w, route.method, path, body) for w in self._serving()))
        taken = [answer for answer in answers if isinstance(answer, Answer) and answer.status == 200]
        detail = f"approval {approval_id} is not held (answered, timed out, or gone)"
        return taken[0] if taken else Answer(404, {"detail": detail})

    def _serving(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.serving]

    async def metrics(self) -> str:
        texts = []
        for worker in self.workers:
            if worker.serving:
                with contextlib.suppress(httpx.HTTPError):
                    response = await worker.control.get(ROUTES.metrics.path)
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
        return summed([*texts, self.dns.state.metrics.render(), "\n".join(own) + "\n"])

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if any(worker.serving for worker in self.workers) else "no worker serving",
            "audit": self.audit.failure or "ok",
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
    """The control API of docs/proxy.md, served by the pool (the contract's `ROUTES`)."""
    app = FastAPI(title="sandgate proxy pool control", docs_url=None, redoc_url=None, openapi_url=None)

    def reply(answer: Answer) -> Response:
        if answer.status == 204:
            return Response(status_code=204)
        return JSONResponse(status_code=answer.status, content=answer.body)

    @on(app, ROUTES.put_sandbox)
    async def put_sandbox(address: str, entry: SandboxEntry) -> Response:
        if entry.address != address:
            raise HTTPException(422, f"path address {address} differs from body address {entry.address}")
        return reply(await pool.change(ROUTES.put_sandbox, address, entry))

    @on(app, ROUTES.drop_sandbox)
    async def drop_sandbox(address: str) -> Response:
        return reply(await pool.change(ROUTES.drop_sandbox, address, None))

    @on(app, ROUTES.list_approvals)
    async def list_approvals() -> list[Any]:
        return await pool.approvals()

    @on(app, ROUTES.answer_approval)
    async def answer_approval(approval_id: str, answer: ApprovalAnswer) -> Response:
        return reply(await pool.answer_approval(approval_id, answer.model_dump_json()))

    @on(app, ROUTES.vault_changed)
    async def vault_changed(change: VaultChange) -> Response:
        return reply(await pool.change(ROUTES.vault_changed, None, change))

    @on(app, ROUTES.put_values)
    def put_values() -> Response:
        # a restarted worker gets the pool's table, which holds no values: one worker only
        return JSONResponse(status_code=409, content={"detail": "a memory vault needs workers = 1"})

    @on(app, ROUTES.list_sandboxes)
    def list_sandboxes() -> list[SandboxEntry]:
        return list(pool.entries.values())

    @on(app, ROUTES.get_sandbox)
    def get_sandbox(address: str) -> SandboxEntry:
        entry = pool.entries.get(address)
        if entry is None:
            raise HTTPException(404, f"no sandbox at {address}")
        return entry

    @on(app, POOL_ROUTES.name_for)
    def name_for(sandbox_address: str, address: str) -> dict[str, str | None]:
        return {"name": pool.dns.name_for(sandbox_address, address)}

    @on(app, ROUTES.health)
    def health() -> JSONResponse:
        state = pool.health()
        return JSONResponse(status_code=200 if state["status"] == "ok" else 503, content=state)

    @on(app, ROUTES.metrics)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(await pool.metrics(), media_type="text/plain; version=0.0.4")

    return app


def run_pool(config: ProxyConfig, run_worker: Callable[[WorkerSlot], None]) -> None:
    """The entry point of `python -m sandgate.proxy` when the config asks for workers: fork the
    template first, while this process has neither an event loop nor a thread."""
    template = Template.start(run_worker)
    asyncio.run(WorkerPool(config, template).run())


__all__ = ["ListenError", "PeerNames", "PoolStartError", "WorkerSlot", "run_pool", "worker_socket"]
