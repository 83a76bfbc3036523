"""`/code/context`, `/code/contexts`, `/code`: stateful code contexts for the code-interpreter SDK.

Rules:
1. A context is one persistent driver process per language, all speaking one protocol (see
   repl_driver.py's docstring): `python` runs `repl_driver.py` under the sandbox's `python3`
   (the first on the child's PATH, else execd's own Python); `javascript` runs `repl_driver.js`
   under the sandbox's `node`; `bash` runs `bash_driver.py` (execd's own Python) around the
   sandbox's `bash`. Each runs in its own process group with stdin at /dev/null. Its stdout and
   stderr are pipes that execd reads; a socketpair carries the framed control protocol. No
   Jupyter is needed.
2. A run streams `init` (text = the context id, which is also the id to interrupt), then
   `execution_count`, then stdout/stderr text as it is written (each event carries its own line
   endings, as Jupyter's streams do), then one `result` per value shown, then
   `execution_complete`. On failure `error{ename, evalue, traceback}` replaces
   `execution_complete`. Result bundles name `text/plain` `text`, as the Go execd does, because
   that is the field the SDK reads.
3. Runs in one context are serial: a second concurrent run gets a 409. An interrupt
   (`DELETE /code?id=`) sends SIGINT to the context's process group. The cell fails (Python:
   KeyboardInterrupt; JavaScript: "Script execution was interrupted"; bash: status 130) and the
   context keeps its state. A client that goes away interrupts its
   cell in the same way.
4. A run's optional `timeout` (ms, an execd extension) interrupts the cell. If the cell is still
   running `INTERRUPT_GRACE_S` after the SIGINT, the context is killed. A killed context, or one
   whose process died, has ended: later runs get a 410. Deleting a context kills its process
   group.
5. `python`, `bash` and `javascript` are supported. Creating or running any other language is
   a 400 that lists the supported ones. Listing or deleting by another language matches
   nothing. A run without a context id uses the language's default context, which is created
   on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .commands import EVENT_QUEUE
from .errors import CONFLICT, ApiError, bad_request, not_found
from .events import event, frame, sse_response, with_pings
from .process import READ_CHUNK, child_env, drain_after_exit, exit_code, expand_cwd, kill_group
from .requests import Field, check, parse_body
from .web import Request, Response, json_response

DRIVER = Path(__file__).with_name("repl_driver.py")
BASH_DRIVER = Path(__file__).with_name("bash_driver.py")
JS_DRIVER = Path(__file__).with_name("repl_driver.js")
HEADER_BYTES = 4
MAX_FRAME = 64 * 1024 * 1024  # the driver's limit too
HELD_RESULTS_BYTES = 16 * 1024 * 1024
READY_TIMEOUT_S = 15.0
INTERRUPT_GRACE_S = 2.0
UNSUPPORTED_LANGUAGE = "UNSUPPORTED_LANGUAGE"


CREATE_CONTEXT = {"language": Field("str", required=True, min_length=1), "cwd": Field("str")}
CONTEXT_REF = {"id": Field("str"), "language": Field("str", min_length=1)}
RUN_CODE = {"code": Field("str", required=True, min_length=1), "timeout": Field("int", minimum=0)}


@dataclass(frozen=True)
class CreateContextRequest:
    language: str
    cwd: str | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> CreateContextRequest:
        return cls(**check(data, CREATE_CONTEXT, where))


@dataclass(frozen=True)
class RunCodeRequest:
    """`{code, context: {id?, language?}, timeout?}`; `timeout` (ms) is an execd extension."""

    code: str
    context_id: str | None = None
    language: str = "python"
    timeout: int | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> RunCodeRequest:
        values = check(data, RUN_CODE, where)
        ref = data.get("context") or {}
        if not isinstance(ref, dict):
            raise bad_request(f'invalid {where}: context must be an object like {{"language": "python"}}')
        context = check(ref, CONTEXT_REF, f"{where}, context")
        return cls(values["code"], context["id"] or None, context["language"] or "python", values["timeout"])


Event = dict[str, Any]


def check_language(language: str) -> str:
    if language not in SUPPORTED_LANGUAGES:
        supported = ", ".join(SUPPORTED_LANGUAGES)
        raise bad_request(
            f"language {language!r} is not supported by this execd; supported: {supported}",
            UNSUPPORTED_LANGUAGE,
        )
    return language


class RunEvents(asyncio.Queue[Event | None]):
    """A run's event queue that drops events once its client has gone (the cell still finishes)."""

    detached = False

    async def put(self, item: Event | None) -> None:
        if not self.detached:
            await super().put(item)

    def detach(self) -> None:
        self.detached = True
        while not self.empty():
            self.get_nowait()


@dataclass
class CellOutcome:
    """What the driver reported for one cell; `error` None means success."""

    results: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


@dataclass
class Context:
    id: str
    language: str
    process: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    marker: bytes
    execution_count: int = 0
    running: bool = False
    ended: str = ""
    run_task: asyncio.Task[None] | None = None

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language}

    def interrupt(self) -> None:
        kill_group(self.process.pid, signal.SIGINT)

    def end(self, why: str) -> None:
        self.ended = self.ended or why
        kill_group(self.process.pid)
        self.writer.close()

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        self.writer.write(len(data).to_bytes(HEADER_BYTES, "big") + data)
        await self.writer.drain()

    async def receive(self) -> tuple[dict[str, Any], int] | None:
        """The next frame from the driver and its size; None once it has gone (or broke the protocol)."""
        try:
            size = int.from_bytes(await self.reader.readexactly(HEADER_BYTES), "big")
            if size > MAX_FRAME:
                self.end(f"its driver sent a {size}-byte frame (limit {MAX_FRAME})")
                return None
            message: dict[str, Any] = json.loads(await self.reader.readexactly(size))
            return message, size
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return None

    async def collect(self, overflow: Callable[[dict[str, Any]], Awaitable[None]]) -> CellOutcome | None:
        """The current cell's results and error, or None if the driver went away mid-cell.

        Results are held so that they follow the cell's output, up to `HELD_RESULTS_BYTES`;
        beyond that each goes to `overflow` as it comes, so memory stays bounded.
        """
        outcome, held = CellOutcome(), 0
        while (received := await self.receive()) is not None:
            message, size = received
            if message.get("op") == "result":
                held += size
                data = message.get("data") or {}
                if held <= HELD_RESULTS_BYTES:
                    outcome.results.append(data)
                else:
                    await overflow(data)
            elif message.get("op") == "done":
                outcome.error = message.get("error")
                return outcome
        return None


def held_back(data: bytes, marker: bytes) -> int:
    """How many trailing bytes of `data` could be the start of `marker` (kept for the next read)."""
    for size in range(min(len(marker) - 1, len(data)), 0, -1):
        if data.endswith(marker[:size]):
            return size
    return 0


async def stream_until_marker(
    reader: asyncio.StreamReader, marker: bytes, kind: str, queue: RunEvents, progress: list[int]
) -> None:
    """Emit `kind` events with the text read up to `marker` (or EOF), as soon as it arrives."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = b""
    while True:
        chunk = await reader.read(READ_CHUNK)
        data = pending + chunk
        found = data.find(marker)
        done = found >= 0 or not chunk
        keep = 0 if done else held_back(data, marker)
        text = decoder.decode(data[: found if found >= 0 else len(data) - keep], final=done)
        if text:
            progress[0] += 1
            await queue.put(event(kind, text))
        if done:
            return
        pending = data[len(data) - keep :]


def sandbox_python(env: dict[str, str]) -> str:
    return shutil.which("python3", path=env.get("PATH", os.defpath)) or sys.executable


def python_driver(env: dict[str, str]) -> list[str]:
    return [sandbox_python(env), str(DRIVER)]


def bash_driver(env: dict[str, str]) -> list[str]:
    return [sys.executable, "-I", str(BASH_DRIVER)]  # execd's own Python drives the sandbox's bash


def javascript_driver(env: dict[str, str]) -> list[str]:
    node = shutil.which("node", path=env.get("PATH", os.defpath))
    if node is None:
        raise ApiError(
            500,
            "RUNTIME_ERROR",
            "javascript contexts need Node.js: no `node` on the sandbox's PATH; install it in the image",
        )
    return [node, str(JS_DRIVER)]


# each language's driver command (the socket fd and the marker are appended)
DRIVERS: dict[str, Callable[[dict[str, str]], list[str]]] = {
    "python": python_driver,
    "bash": bash_driver,
    "javascript": javascript_driver,
}
SUPPORTED_LANGUAGES = tuple(DRIVERS)


class CodeContexts:
    """Every code context of this execd: created, run, interrupted and ended on request."""

    def __init__(self, default_cwd: str) -> None:
        self.default_cwd = default_cwd
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}
        self.default_lock = asyncio.Lock()
        # Contexts end with execd: when its event loop shuts down it cancels this task, which
        # kills and reaps every context; atexit covers an exit that skips the loop's shutdown.
        self.closer = asyncio.get_running_loop().create_task(self._end_all_when_cancelled())
        atexit.register(self.shutdown)

    # -- registry -------------------------------------------------------------------------------

    def get(self, context_id: str) -> Context:
        context = self.contexts.get(context_id)
        if context is None:
            raise not_found(
                f"no code context {context_id!r}; create one with POST /code/context", "CONTEXT_NOT_FOUND"
            )
        if context.ended:
            raise ApiError(
                410,
                "CONTEXT_ENDED",
                f"code context {context_id} has ended ({context.ended}); create a new one",
            )
        return context

    def listed(self, language: str | None) -> list[dict[str, str]]:
        return [
            c.describe()
            for c in self.contexts.values()
            if not c.ended and (not language or c.language == language)
        ]

    def delete(self, context_id: str) -> None:
        context = self.contexts.pop(context_id, None)
        if context is None:
            raise not_found(f"no code context {context_id!r}", "CONTEXT_NOT_FOUND")
        context.end("deleted")
        if self.defaults.get(context.language) == context_id:
            del self.defaults[context.language]

    def delete_language(self, language: str) -> None:
        for context in [c for c in self.contexts.values() if c.language == language]:
            self.delete(context.id)

    def shutdown(self) -> None:
        for context in self.contexts.values():
            kill_group(context.process.pid)

    async def _end_all_when_cancelled(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            for context in self.contexts.values():
                context.end("execd stopped")
            waits = [c.process.wait() for c in self.contexts.values()]
            await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 5)

    # -- creation -------------------------------------------------------------------------------

    async def create(self, language: str, cwd: str | None) -> Context:
        env = child_env(None, None)
        directory = expand_cwd(cwd, env, self.default_cwd)
        marker = f"\x1e__SANDGATE_CELL_END_{secrets.token_hex(16)}__\x1e"
        driver = DRIVERS[language](env)
        ours, theirs = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                *driver,
                str(theirs.fileno()),
                marker,
                cwd=directory,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
            )
        except OSError as exc:
            ours.close()
            raise ApiError(500, "RUNTIME_ERROR", f"cannot start a {language} code context: {exc}") from None
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        context = Context(uuid.uuid4().hex, language, process, reader, writer, marker.encode())
        await self._wait_ready(context)
        self.contexts[context.id] = context
        return context

    async def _wait_ready(self, context: Context) -> None:
        try:
            ready = await asyncio.wait_for(context.receive(), READY_TIMEOUT_S)
        except TimeoutError:
            ready = None
        if ready is not None and ready[0].get("op") == "ready":
            return
        context.end("it did not start")
        assert context.process.stderr is not None
        try:
            why = await asyncio.wait_for(context.process.stderr.read(4096), 1.0)
        except TimeoutError:
            why = b"no answer within %d s" % READY_TIMEOUT_S
        raise ApiError(
            500,
            "RUNTIME_ERROR",
            f"the {context.language} code context did not start: {why.decode(errors='replace').strip()}",
        )

    async def default(self, language: str) -> Context:
        async with self.default_lock:
            known = self.contexts.get(self.defaults.get(language, ""))
            if known is None or known.ended:
                known = await self.create(language, None)
                self.defaults[language] = known.id
            return known

    # -- runs -----------------------------------------------------------------------------------

    async def run(self, context: Context, req: RunCodeRequest) -> AsyncIterator[bytes]:
        yield frame(event("init", context.id))
        if context.running:  # another request started a cell after this one was accepted
            yield frame(event("error", error=busy_error(context)))
            return
        context.running = True
        queue = RunEvents(EVENT_QUEUE)
        context.run_task = asyncio.create_task(self._execute(context, req, queue))
        finished = False
        try:
            async for chunk in with_pings(queue):
                yield chunk
            finished = True
        finally:
            if not finished:  # the client went away: stop the cell, keep the context
                queue.detach()
                context.interrupt()

    async def _execute(self, context: Context, req: RunCodeRequest, queue: RunEvents) -> None:
        started = time.monotonic()
        try:
            context.execution_count += 1
            count = context.execution_count
            await queue.put(event("execution_count", execution_count=count))
            await context.send({"op": "run", "code": req.code, "count": count})
            assert context.process.stdout is not None and context.process.stderr is not None
            progress = [0]
            readers = [
                asyncio.create_task(stream_until_marker(pipe, context.marker, kind, queue, progress))
                for pipe, kind in ((context.process.stdout, "stdout"), (context.process.stderr, "stderr"))
            ]

            async def show(data: dict[str, Any]) -> None:
                await queue.put(event("result", results=wire_bundle(data), execution_count=count))

            outcome = await self._await_cell(context, req.timeout, show)
            # while the client still has events to take, the readers are making progress
            await drain_after_exit(readers, lambda: (progress[0], queue.qsize() > 0 and time.monotonic()))
            for data in outcome.results:
                await show(data)
            if outcome.error is None:
                elapsed = int((time.monotonic() - started) * 1000)
                await queue.put(event("execution_complete", execution_time=elapsed))
            else:
                await queue.put(event("error", error=outcome.error))
        except ConnectionError:
            context.end("its python is gone")
            await queue.put(event("error", error=ended_error(context)))
        finally:
            context.running = False
            await queue.put(None)

    async def _await_cell(
        self, context: Context, timeout_ms: int | None, show: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> CellOutcome:
        """The cell's outcome; a timeout interrupts it, then kills the context if it will not stop."""
        reply = asyncio.ensure_future(context.collect(show))
        done, _ = await asyncio.wait([reply], timeout=timeout_ms / 1000 if timeout_ms else None)
        if not done:
            context.interrupt()
            done, _ = await asyncio.wait([reply], timeout=INTERRUPT_GRACE_S)
            if not done:
                context.end(f"a cell ran past its {timeout_ms} ms timeout and ignored SIGINT")
            outcome = await reply
            return CellOutcome(
                results=outcome.results if outcome else [],
                error=timeout_error(timeout_ms or 0, outcome),
            )
        outcome = await reply
        if outcome is None:
            code = exit_code(await context.process.wait())
            context.end(f"its python exited with status {code}")
            return CellOutcome(error=ended_error(context))
        return outcome


def wire_bundle(data: dict[str, Any]) -> dict[str, Any]:
    """The Go execd's result shape: `text/plain` is sent as `text` (what the SDK reads)."""
    return {("text" if mime == "text/plain" else mime): value for mime, value in data.items()}


def ended_error(context: Context) -> dict[str, Any]:
    return {
        "ename": "ContextEnded",
        "evalue": f"code context {context.id} has ended ({context.ended}); create a new one",
        "traceback": [],
    }


def busy_error(context: Context) -> dict[str, Any]:
    return {
        "ename": "ContextBusy",
        "evalue": f"code context {context.id} is running another cell; wait for it or interrupt it",
        "traceback": [],
    }


def timeout_error(timeout_ms: int, outcome: CellOutcome | None) -> dict[str, Any]:
    if outcome is None:
        what = f"did not stop within {INTERRUPT_GRACE_S:g} s of SIGINT; the context was killed and has ended"
    else:
        what = "was interrupted; the context keeps its state"
    return {
        "ename": "ExecutionTimeout",
        "evalue": f"the cell ran past its {timeout_ms} ms timeout and {what}",
        "traceback": (outcome.error or {}).get("traceback", []) if outcome else [],
    }


# -- routes ------------------------------------------------------------------------------------


def contexts_of(request: Request) -> CodeContexts:
    state = request.state
    if not hasattr(state, "code_contexts"):
        state.code_contexts = CodeContexts(state.default_cwd)
    contexts: CodeContexts = state.code_contexts
    return contexts


async def create_context(request: Request) -> Response:
    req = await parse_body(request, CreateContextRequest.parse)
    context = await contexts_of(request).create(check_language(req.language), req.cwd)
    return json_response(context.describe())


async def list_contexts(request: Request) -> Response:
    return json_response(contexts_of(request).listed(request.query("language")))


async def get_context(request: Request) -> Response:
    return json_response(contexts_of(request).get(request.path_params["context_id"]).describe())


async def delete_context(request: Request) -> Response:
    contexts_of(request).delete(request.path_params["context_id"])
    return Response(200)


async def delete_contexts(request: Request) -> Response:
    language = request.query("language")
    if not language:
        raise bad_request("missing query parameter 'language' (e.g. ?language=python)", "MISSING_QUERY")
    contexts_of(request).delete_language(language)
    return Response(200)


async def run_code(request: Request) -> Response:
    req = await parse_body(request, RunCodeRequest.parse)
    contexts = contexts_of(request)
    if req.context_id:
        context = contexts.get(req.context_id)
    else:
        context = await contexts.default(check_language(req.language))
    if context.running:
        raise ApiError(409, CONFLICT, busy_error(context)["evalue"])
    return sse_response(contexts.run(context, req))


async def interrupt_code(request: Request) -> Response:
    context_id = request.query("id")
    if not context_id:
        raise bad_request(
            "missing query parameter 'id' (the context id from the run's init event)", "MISSING_QUERY"
        )
    context = contexts_of(request).get(context_id)
    if context.running:
        context.interrupt()
    return Response(200)
