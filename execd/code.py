"""`/code/context`, `/code/contexts`, `/code`: code contexts on real Jupyter kernels.

Rules:
1. A context is one Jupyter kernel, started and driven with jupyter_client (kernels.py says
   which kernel serves which language). It runs in its own process group with the context's
   cwd and the sandbox's environment (execd's env file included); its connection file and its
   start-up output live in execd's state dir. jupyter_client is imported on the first context.
2. A run is one `execute_request`. Its iopub messages become the SDK's events: `init` (text =
   the context id, which is also the id to interrupt), `execution_count` (from
   `execute_input`), `stdout`/`stderr` (`stream`), one `result` per `execute_result` or
   `display_data` with every MIME type of its bundle (`text/plain` sent as `text`, as the Go
   execd does, since that is the field the SDK reads), then `execution_complete`, or `error`
   with the kernel's `ename`, `evalue`, `traceback` (terminal colours removed) in its place
   (an exception thrown by a Java cell is `EvalException`, as OpenSandbox's IJava names it).
   The run ends at the kernel's
   `idle` status for that request.
3. Runs in one context are serial: a second concurrent run gets a 409. An interrupt
   (`DELETE /code?id=`) is a kernel interrupt (SIGINT to its process group, or an
   `interrupt_request` for a kernel whose spec asks for messages); the cell fails and the
   context keeps its state. A client that goes away interrupts its cell in the same way. An
   `interrupt_request` is sent again every `INTERRUPT_REPEAT_S` while the same cell runs: JJava
   runs a cell snippet by snippet and drops one that comes while it compiles the next (nothing
   of the cell is running then), so the cell would run on.
4. A run's optional `timeout` (ms, an execd extension) interrupts the cell. If the cell is still
   running `INTERRUPT_GRACE_S` after that, the kernel is killed. A killed kernel, or one that
   died (checked every `LIVENESS_POLL_S` while a cell waits), has ended its context: the run
   gets an error saying so, later runs a 410, and a new context starts a new kernel. Deleting
   a context kills its kernel's session: its process group and any group the kernel made (GoNB
   starts gopls in one of its own).
5. `python`, `bash`, `javascript`, `typescript`, `java` and `go` are the languages; creating or
   running any other is a 400 that lists them; so is one this sandbox has no kernel for (the
   message lists those it has, and what to install). Listing or deleting by another language
   matches nothing. A run without a context id uses the language's default context, created on
   first use.
6. Spare kernels: once a language has had a context, execd starts one more kernel of it in the
   background, so the next create takes a started kernel instead of waiting for one (a kernel's
   start is 0.5-3 s; taking a spare is milliseconds). At most one spare per language that was
   used; it is taken only if the sandbox's environment (execd's env file included) and the
   cwd are what they were when it started, otherwise it is ended and a kernel starts fresh. A
   spare that died is never handed out. Spares end with execd. `EXECD_SPARE_KERNELS=0` in
   execd's environment turns them off (each costs an idle kernel: ~50 MB for ipykernel).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .commands import EVENT_QUEUE
from .errors import CONFLICT, ApiError, bad_request, not_found
from .events import event, frame, sse_response, with_pings
from .kernels import SUPPORTED_LANGUAGES, NoKernel, kernel_manager_specs, kernel_name
from .process import child_env, exit_code, expand_cwd, kill_session
from .requests import Field, check, parse_body
from .web import Request, Response, json_response

if TYPE_CHECKING:
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager

READY_TIMEOUT_S = 60.0  # a kernel's start on a loaded machine (ipykernel imports IPython)
INTERRUPT_GRACE_S = 2.0
INTERRUPT_REPEAT_S = 0.25
LIVENESS_POLL_S = 0.5
LATE_OUTPUT_GRACE_S = {"javascript": 0.1, "typescript": 0.1}  # see Context.late_output
REPLY_WAIT_S = 2.0  # for the execute_reply, which a kernel sends around its idle status
STARTUP_LOG_TAIL = 4096
UNSUPPORTED_LANGUAGE = "UNSUPPORTED_LANGUAGE"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


class KernelEnded(Exception):
    """The context's kernel is gone (it died or was killed); `Context.ended` says why."""


@dataclass
class Context:
    id: str
    language: str
    manager: AsyncKernelManager
    client: AsyncKernelClient
    running: bool = False
    cells: int = 0  # the cells started: which one an interrupt is for
    ended: str = ""
    # the tasks it started (held here: the event loop keeps only weak references)
    tasks: set[asyncio.Future[Any]] = field(default_factory=set)

    def keep(self, task: asyncio.Future[Any]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language}

    @property
    def pid(self) -> int:
        process = getattr(self.manager.provisioner, "process", None)
        return process.pid if process is not None else 0

    async def interrupt(self) -> None:
        """Interrupt the running cell; a message is sent again while that cell runs (rule 3)."""
        if self.ended:
            return
        await self.manager.interrupt_kernel()
        if self.manager.kernel_spec is not None and self.manager.kernel_spec.interrupt_mode == "message":
            self.keep(asyncio.ensure_future(self._interrupt_again(self.cells)))

    async def _interrupt_again(self, cell: int) -> None:
        while True:
            await asyncio.sleep(INTERRUPT_REPEAT_S)
            if self.ended or not self.running or self.cells != cell:
                return
            await self.manager.interrupt_kernel()

    def end(self, why: str) -> None:
        """Kill the kernel's process group now; its files are removed in the background."""
        if self.ended:
            return
        self.ended = why
        if self.pid:
            kill_session(self.pid)
        self.client.stop_channels()
        self.keep(asyncio.ensure_future(self.manager.shutdown_kernel(now=True)))

    async def exit_status(self) -> int | None:
        """The kernel's exit status if it has exited, else None."""
        provisioner = self.manager.provisioner
        status = await provisioner.poll() if provisioner is not None else 0
        return None if status is None else exit_code(status)

    async def execute(self, code: str, queue_: RunEvents) -> dict[str, Any] | None:
        """Run one cell, putting its output events on `queue_`; returns its error or None."""
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        error: list[dict[str, Any]] = []
        while True:
            try:
                message = await self.client.get_iopub_msg(timeout=LIVENESS_POLL_S)
            except queue.Empty:
                if self.ended:
                    raise KernelEnded from None
                status = await self.exit_status()
                if status is not None:
                    self.end(f"its {self.language} kernel exited with status {status}")
                    raise KernelEnded from None
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            content = message["content"]
            if message["msg_type"] == "status" and content.get("execution_state") == "idle":
                aborted = await self.aborted(msg_id)  # read always: replies must not pile up
                await self.late_output(msg_id, queue_, error)
                return error[-1] if error else aborted
            await self.relay(message["msg_type"], content, queue_, error)

    async def relay(
        self, kind: str, content: dict[str, Any], queue_: RunEvents, error: list[dict[str, Any]]
    ) -> None:
        """One iopub message of the cell as its event (an error is kept in `error` for the end)."""
        if kind == "execute_input":
            await queue_.put(event("execution_count", execution_count=content.get("execution_count")))
        elif kind == "stream":
            await queue_.put(event(content.get("name", "stdout"), content.get("text", "")))
        elif kind in ("execute_result", "display_data"):
            results = wire_bundle(content.get("data") or {})
            await queue_.put(event("result", results=results, execution_count=content.get("execution_count")))
        elif kind == "error":
            error.append(
                java_eval_error(plain_error(content)) if self.language == "java" else plain_error(content)
            )

    async def late_output(self, msg_id: str, queue_: RunEvents, error: list[dict[str, Any]]) -> None:
        """Output of the cell that comes after its idle status: Deno's kernel publishes a cell's
        output from another task than its status, so under load some of it arrives after idle;
        for its languages execd waits until `LATE_OUTPUT_GRACE_S` pass without a message."""
        grace = LATE_OUTPUT_GRACE_S.get(self.language, 0.0)
        while True:
            try:
                message = await self.client.get_iopub_msg(timeout=grace)
            except queue.Empty:
                return
            if message["parent_header"].get("msg_id") == msg_id:
                await self.relay(message["msg_type"], message["content"], queue_, error)

    async def aborted(self, msg_id: str) -> dict[str, Any] | None:
        """An error for a cell the kernel aborted without an error message (bash_kernel's answer
        to an interrupt), read from its `execute_reply`; None for any other reply."""
        deadline = time.monotonic() + REPLY_WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                reply = await self.client.get_shell_msg(timeout=left)
            except queue.Empty:
                return None
            if reply["parent_header"].get("msg_id") == msg_id:
                if reply["content"].get("status") in ("abort", "aborted"):
                    return {
                        "ename": "KeyboardInterrupt",
                        "evalue": "the kernel aborted the cell",
                        "traceback": [],
                    }
                return None
        return None


@dataclass
class Spare:
    """A kernel started ahead for the next create of its language (rule 6), and what it was
    started with (cwd, environment): it serves only a create that would start it the same."""

    started_with: tuple[str, tuple[tuple[str, str], ...]]
    kernel: asyncio.Task[Context]


class CodeContexts:
    """Every code context of this execd: created, run, interrupted and ended on request."""

    def __init__(self, default_cwd: str, state_dir: str, spares: bool = True) -> None:
        self.default_cwd = default_cwd
        self.state_dir = state_dir
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}
        self.default_lock = asyncio.Lock()
        self.use_spares = spares
        self.spares: dict[str, Spare] = {}
        self.unclaimed: dict[str, Context] = {}  # kernels started but in no context yet (spares)
        # Kernels end with execd: when its event loop shuts down it cancels this task, which
        # kills every kernel; atexit covers an exit that skips the loop's shutdown.
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
        for context in [*self.contexts.values(), *self.unclaimed.values()]:
            if context.pid:
                kill_session(context.pid)

    async def _end_all_when_cancelled(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            self.shutdown()

    # -- creation -------------------------------------------------------------------------------

    async def create(self, language: str, cwd: str | None) -> Context:
        env = child_env(None, None)
        directory = expand_cwd(cwd, env, self.default_cwd)
        started_with = (directory, tuple(sorted(env.items())))
        context = await self._take_spare(language, started_with)
        context = context or await self._start(language, env, directory)
        self.contexts[context.id] = self.unclaimed.pop(context.id, context)
        if self.use_spares:
            spare = asyncio.ensure_future(self._start(language, env, directory))
            spare.add_done_callback(_retrieve_error)  # a spare that failed is only not taken
            self.spares[language] = Spare(started_with, spare)
        return context

    async def _take_spare(self, language: str, started_with: tuple[str, Any]) -> Context | None:
        """The language's spare kernel if it would have been started the same and is alive."""
        spare = self.spares.pop(language, None)
        if spare is None:
            return None
        if spare.started_with != started_with:
            spare.kernel.add_done_callback(self._end_unused)
            return None
        try:
            context = await spare.kernel
        except ApiError:
            return None  # a fresh start reports why
        if context.ended or await context.exit_status() is not None:
            self._end_unused(spare.kernel)
            return None
        return context

    def _end_unused(self, kernel: asyncio.Future[Context]) -> None:
        if not kernel.cancelled() and kernel.exception() is None:
            context = kernel.result()
            context.end("a spare kernel not taken")
            self.unclaimed.pop(context.id, None)

    async def _start(self, language: str, env: dict[str, str], directory: str) -> Context:
        from jupyter_client.manager import AsyncKernelManager

        specs = kernel_manager_specs(env, self.state_dir)
        try:
            name = kernel_name(language, specs)
        except NoKernel as exc:
            raise bad_request(str(exc), UNSUPPORTED_LANGUAGE) from None
        context_id = uuid.uuid4().hex
        files = os.path.join(self.state_dir, f"kernel-{context_id}")
        manager = AsyncKernelManager(
            kernel_name=name, kernel_spec_manager=specs, connection_file=files + ".json"
        )
        with open(files + ".log", "wb") as log:
            try:
                await manager.start_kernel(env=env, cwd=directory, stdout=log, stderr=log)
            except Exception as exc:
                raise ApiError(
                    500, "RUNTIME_ERROR", f"cannot start the {language} kernel ({name}): {exc}"
                ) from None
        client = manager.client()
        client.start_channels()
        context = Context(context_id, language, manager, client)
        self.unclaimed[context.id] = context
        try:
            await client.wait_for_ready(timeout=READY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            context.end("it did not start")
            self.unclaimed.pop(context.id, None)
            raise ApiError(
                500,
                "RUNTIME_ERROR",
                f"the {language} kernel ({name}) did not start: {exc}; its output: {startup_log(files)}",
            ) from None
        return context

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
        context.cells += 1
        events = RunEvents(EVENT_QUEUE)
        context.keep(asyncio.ensure_future(self._execute(context, req, events)))
        finished = False
        try:
            async for chunk in with_pings(events):
                yield chunk
            finished = True
        finally:
            if not finished:  # the client went away: stop the cell, keep the context
                events.detach()
                if context.running:
                    context.keep(asyncio.ensure_future(context.interrupt()))

    async def _execute(self, context: Context, req: RunCodeRequest, events: RunEvents) -> None:
        started = time.monotonic()
        try:
            error = await self._await_cell(context, req, events)
            if error is None:
                elapsed = int((time.monotonic() - started) * 1000)
                await events.put(event("execution_complete", execution_time=elapsed))
            else:
                await events.put(event("error", error=error))
        except KernelEnded:
            await events.put(event("error", error=ended_error(context)))
        finally:
            context.running = False
            await events.put(None)

    async def _await_cell(
        self, context: Context, req: RunCodeRequest, events: RunEvents
    ) -> dict[str, Any] | None:
        """The cell's error or None; a timeout interrupts it, then kills the kernel if it will not stop."""
        cell = asyncio.ensure_future(context.execute(req.code, events))
        timeout_ms = req.timeout
        done, _ = await asyncio.wait([cell], timeout=timeout_ms / 1000 if timeout_ms else None)
        if done:
            return cell.result()
        await context.interrupt()
        done, _ = await asyncio.wait([cell], timeout=INTERRUPT_GRACE_S)
        if not done:
            cell.cancel()
            context.end(f"a cell ran past its {timeout_ms} ms timeout and ignored the interrupt")
        interrupted = cell.result() if done else None
        return timeout_error(timeout_ms or 0, bool(done), interrupted)


def _retrieve_error(kernel: asyncio.Future[Context]) -> None:
    """Mark a spare's failure as seen (asyncio would log it as never retrieved)."""
    if not kernel.cancelled():
        kernel.exception()


def wire_bundle(data: dict[str, Any]) -> dict[str, Any]:
    """The bundle with `text/plain` also as `text`: the Go execd renames it to `text`, which the
    Python SDK reads; the Go SDK reads only `text/plain` (the spec's name), JS and C# either."""
    bundle = dict(data)
    if "text/plain" in data:
        bundle["text"] = data["text/plain"]
    return bundle


def plain_error(content: dict[str, Any]) -> dict[str, Any]:
    """The kernel's error without terminal colours (IPython colours its tracebacks for a
    notebook; an agent or a log reads plain text)."""
    return {
        "ename": ANSI_ESCAPE.sub("", str(content.get("ename") or "")),
        "evalue": ANSI_ESCAPE.sub("", str(content.get("evalue") or "")),
        "traceback": [ANSI_ESCAPE.sub("", str(line)) for line in content.get("traceback") or []],
    }


# JJava reports an exception thrown by a cell's code as RuntimeException("<class>, <message>");
# OpenSandbox's code-interpreter (IJava) and the clients written against it call that error
# `EvalException` (rule 2), so a Java context names it so; evalue and traceback stay JJava's.
JJAVA_THROWN = re.compile(r"^[\w$]+(\.[\w$]+)+, ")


def java_eval_error(error: dict[str, Any]) -> dict[str, Any]:
    if error["ename"] == "RuntimeException" and JJAVA_THROWN.match(error["evalue"]):
        return {**error, "ename": "EvalException"}
    return error


def startup_log(files: str) -> str:
    try:
        with open(files + ".log", "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - STARTUP_LOG_TAIL))
            return log.read().decode(errors="replace").strip() or "(none)"
    except OSError:
        return "(none)"


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


def timeout_error(timeout_ms: int, stopped: bool, interrupted: dict[str, Any] | None) -> dict[str, Any]:
    if stopped:
        what = "was interrupted; the context keeps its state"
    else:
        what = (
            f"did not stop within {INTERRUPT_GRACE_S:g} s of the interrupt; "
            "its kernel was killed and the context has ended"
        )
    return {
        "ename": "ExecutionTimeout",
        "evalue": f"the cell ran past its {timeout_ms} ms timeout and {what}",
        "traceback": (interrupted or {}).get("traceback") or [],
    }


# -- routes ------------------------------------------------------------------------------------


def contexts_of(request: Request) -> CodeContexts:
    state = request.state
    if not hasattr(state, "code_contexts"):
        spares = os.environ.get("EXECD_SPARE_KERNELS", "1") != "0"
        state.code_contexts = CodeContexts(state.default_cwd, state.state_dir, spares)
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
        await context.interrupt()
    return Response(200)
