"""The Python side of a code context: one persistent interpreter that runs cells like Jupyter.

Rules:
1. This file runs as a script under the sandbox's own `python3` (any Python 3.8 or later). It
   imports only the standard library and nothing of execd or sandgate, and it keeps its own
   directory off `sys.path` so user code cannot import execd's modules by accident.
2. execd talks to it over one socket, fd `argv[1]`, in frames: a 4-byte big-endian length and
   then a UTF-8 JSON object, at most `MAX_FRAME` bytes. execd sends
   `{"op": "run", "code", "count"}`. The driver answers `{"op": "ready"}` once at start,
   `{"op": "result", "data": {mime: value}}` for each value shown, and
   `{"op": "done", "error": null | {ename, evalue, traceback}}` when the cell ends.
3. Output is not framed. stdout and stderr are fds 1 and 2, which are pipes execd reads, so
   `print`, C extensions and subprocesses all stream the same way. After each cell the driver
   flushes both and writes `argv[2]` (the context's marker) to each fd, which tells execd that
   the cell's output is complete.
4. A cell runs in the `__main__` module's namespace, and that namespace persists from one cell
   to the next. If the last statement is an expression, its value is shown, unless the cell
   ends with `;`. An exception becomes the cell's error. This includes SyntaxError,
   KeyboardInterrupt and SystemExit, and the interpreter survives all of them. Top-level
   `await` works.
5. SIGINT (execd's interrupt) raises KeyboardInterrupt only while a cell runs, and never in
   the middle of a frame (it waits until the frame is sent). Between cells it is ignored, so a
   late interrupt cannot kill the context.
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import io
import json
import linecache
import os
import signal
import socket
import struct
import sys
import traceback
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

HEADER = struct.Struct(">I")
CO_COROUTINE = 0x0080
# IPython's rich-display methods and the mime type each one provides (text/plain is repr()).
REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
MAX_TEXT = 2 * 1024 * 1024  # characters of one shown value or error
MAX_FRAME = 64 * 1024 * 1024  # execd's limit too: a bigger frame ends the context


class Driver:
    def __init__(self, channel: socket.socket, marker: bytes) -> None:
        self.channel = channel
        self.marker = marker
        self.in_cell = False  # a cell's code is running: SIGINT raises KeyboardInterrupt
        self.sending = False  # a frame is half sent: SIGINT waits until it is whole
        self.deferred = False
        self.loop: asyncio.AbstractEventLoop | None = None  # made by the first cell that awaits
        self.main = types.ModuleType("__main__")
        self.main.__dict__.update(__builtins__=builtins, display=self.display)
        sys.modules["__main__"] = self.main

    # -- protocol -------------------------------------------------------------------------------

    def send(self, message: dict) -> None:
        """Send one frame whole: an interrupt that arrives meanwhile is raised after it."""
        data = encode(message)
        if len(data) > MAX_FRAME and message.get("op") == "result":
            too_big = f"[a value of {len(data)} bytes: more than execd's {MAX_FRAME}-byte limit]"
            data = encode({"op": "result", "data": {"text/plain": too_big}})
        self.sending = True
        try:
            self.channel.sendall(HEADER.pack(len(data)) + data)
        finally:
            self.sending = False
        if self.deferred and self.in_cell:
            self.deferred = False
            raise KeyboardInterrupt

    def receive(self) -> dict | None:
        header = self._read_exactly(HEADER.size)
        if header is None:
            return None
        body = self._read_exactly(HEADER.unpack(header)[0])
        return None if body is None else json.loads(body)

    def _read_exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = self.channel.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def serve(self) -> None:
        self.send({"op": "ready", "pid": os.getpid(), "python": sys.version.split()[0]})
        while True:
            request = self.receive()
            if request is None:  # execd went away
                return
            if request.get("op") == "run":
                error = self.run_cell(request["code"], int(request["count"]))
                self.send({"op": "done", "error": error})

    # -- cells ----------------------------------------------------------------------------------

    def on_sigint(self, signum: int, frame: object) -> None:
        if not self.in_cell:
            return  # between cells: a late interrupt must not hit the driver itself
        if self.sending:
            self.deferred = True
            return
        raise KeyboardInterrupt

    def run_cell(self, code: str, count: int) -> dict | None:
        filename = f"<cell {count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            body, last = compile_cell(code, filename)
            self.in_cell, self.deferred = True, False
            try:
                self.evaluate(body)
                value = self.evaluate(last) if last is not None else None
            finally:
                self.in_cell = False
            if value is not None and not code.rstrip().endswith(";"):
                self.main.__dict__["_"] = value
                self.display(value)
            return None
        except BaseException as exc:  # the cell's failure is reported, never fatal
            return describe(exc)
        finally:
            self.end_output()

    def evaluate(self, code: types.CodeType) -> object:
        result = eval(code, self.main.__dict__)
        if code.co_flags & CO_COROUTINE:  # top-level await
            if self.loop is None:
                import asyncio

                self.loop = asyncio.new_event_loop()
            result = self.loop.run_until_complete(result)
        return result

    def display(self, *values: object) -> None:
        """Show each value as a result (also available to cells as `display`)."""
        for value in values:
            self.send({"op": "result", "data": mime_bundle(value)})

    def end_output(self) -> None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):  # a cell may have closed or replaced a stream
                stream.flush()  # type: ignore[union-attr]
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                os.write(fd, self.marker)


def compile_cell(code: str, filename: str) -> tuple[types.CodeType, types.CodeType | None]:
    """The cell's statements, and its last statement separately if that is an expression."""
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
    tail = compile(last, filename, "eval", flags=flags, dont_inherit=True) if last else None
    return body, tail


def encode(message: dict) -> bytes:
    return json.dumps(message, default=str, ensure_ascii=False).encode("utf-8", "replace")


def clean(text: str) -> str:
    """Text that survives UTF-8 (lone surrogates replaced), at most MAX_TEXT characters."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "\n[... truncated by execd]"


def mime_bundle(value: object) -> dict:
    bundle: dict = {"text/plain": clean(repr(value))}
    if isinstance(value, type):
        return bundle
    for method, mime in REPR_METHODS:
        render = getattr(value, method, None)
        if not callable(render):
            continue
        try:
            data = render()
        except Exception:
            continue
        if isinstance(data, tuple):  # (data, metadata)
            data = data[0]
        if isinstance(data, bytes):
            data = base64.b64encode(data).decode()
        if data is not None and not (isinstance(data, str) and len(data) > MAX_TEXT):
            bundle[mime] = data  # too long: left out rather than cut (a cut image is no image)
    return bundle


def describe(exc: BaseException) -> dict:
    """Jupyter's error shape. The traceback starts at the cell's own frame, and frames of this
    driver are left out (a SyntaxError, raised before the cell ran, has no frames at all)."""
    report = traceback.TracebackException.from_exception(exc)
    pending = [report]
    while pending:
        part = pending.pop()
        part.stack = traceback.StackSummary.from_list(user_frames(part.stack))
        pending += [link for link in (part.__cause__, part.__context__) if link is not None]
    text = "".join(report.format())
    return {
        "ename": type(exc).__name__,
        "evalue": clean(str(exc)),
        "traceback": clean(text).rstrip("\n").split("\n"),
    }


def user_frames(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    first_cell = next((i for i, f in enumerate(stack) if f.filename.startswith("<cell ")), len(stack))
    return [f for f in stack[first_cell:] if f.filename != __file__]


def die_with_parent() -> None:
    """Best effort: if execd dies mid-cell, the kernel sends this process SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    marker = sys.argv[2].encode()
    sys.path[0] = ""  # like an interactive interpreter: the cwd, never this file's directory
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(
                encoding="utf-8", errors="backslashreplace", line_buffering=True, write_through=False
            )
    die_with_parent()
    driver = Driver(channel, marker)
    signal.signal(signal.SIGINT, driver.on_sigint)
    driver.serve()


if __name__ == "__main__":
    main()
