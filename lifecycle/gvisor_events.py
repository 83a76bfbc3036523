"""Every program a gVisor sandbox runs, from gVisor's own kernel: runtime monitoring.

On `isolation = "gvisor"` the host kernel sees only runsc's processes (the Sentry runs every
program of the sandbox inside itself), so the process connector (process_events.py) has nothing
to say. gVisor's runtime monitoring does: each sandbox's runsc is started with a pod-init config
(`trace_config`) whose trace points `sentry/execve` and `sentry/clone` go to the `remote` sink, a
unix socket this server owns in its state dir (masked inside sandboxes).

Rules:
1. The source is the Sentry (gVisor's kernel), outside the sandbox's programs: they cannot
   forge or silence an event short of escaping gVisor. The sandbox is the event's
   `container_id`, which runsc takes from its command line (the sandbox id), not from the
   program. runsc cannot start without its sink: a gVisor sandbox never runs unrecorded.
2. The sink speaks gVisor's wire protocol (pkg/sentry/seccheck/sinks/remote/wire): a SOCK_SEQPACKET
   connection per sandbox; runsc sends a `Handshake` (its version), the sink answers with its own;
   then each datagram is an 8-byte header (header size, message type, events dropped so far) and
   a protobuf message. The few fields read are decoded here (`fields`), no protobuf library.
3. Each execve is one `process` record with gVisor's pids (`pid` and `sandbox_pid` the pid inside
   the sandbox: the host has none for it), its parent from the clone events, the executable,
   argv (bounded) and cwd; `source: gvisor`. The environment gVisor sends is never kept. Events
   gVisor dropped (its queue full) are recorded as `events_lost`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandgate.lifecycle.exec_trail import bounded
from sandgate.lifecycle.process_events import ARGV_MAX, TRACKED_MAX, Lookup, Write

log = logging.getLogger(__name__)

WIRE_VERSION = 1
CLONE, EXECVE = 2, 3  # wire.MessageType
HEADER = struct.Struct("=HHI")  # header size, message type, dropped count
CONTEXT_FIELDS = ["container_id", "thread_id", "group_id", "cwd", "time"]
ACCEPT_POLL_S = 0.5
ENDPOINT = "gvisor-events.sock"  # in the state dir


def events_endpoint(state_dir: Path) -> Path:
    return state_dir.resolve() / ENDPOINT


def trace_config(endpoint: Path) -> dict[str, Any]:
    """The pod-init config that sends a sandbox's execs and clones to `endpoint` (rule 1)."""
    points = [
        {"name": "sentry/execve", "context_fields": CONTEXT_FIELDS},
        {"name": "sentry/clone", "context_fields": CONTEXT_FIELDS},
    ]
    sink = {"name": "remote", "config": {"endpoint": str(endpoint)}}
    return {"trace_session": {"name": "Default", "points": points, "sinks": [sink]}}


def fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of one protobuf message: varints as ints,
    length-delimited fields as bytes; fixed-size fields are skipped."""
    offset = 0
    while offset < len(message):
        key, offset = _varint(message, offset)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, offset = _varint(message, offset)
            yield number, value
        elif wire == 2:
            size, offset = _varint(message, offset)
            yield number, message[offset : offset + size]
            offset += size
        elif wire in (1, 5):
            offset += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} not read")


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def context(data: bytes) -> dict[str, Any]:
    """gVisor's ContextData: 1 time_ns, 2 thread_id, 4 thread group id, 6 container_id, 8 cwd."""
    names = {1: "time_ns", 2: "thread_id", 4: "group_id", 6: "container_id", 8: "cwd"}
    found: dict[str, Any] = {}
    for number, value in fields(data):
        if number in names:
            found[names[number]] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return found


def parse_execve(data: bytes) -> dict[str, Any]:
    """ExecveInfo: 1 context, 2 pathname, 3 argv (4, the environment, is never kept)."""
    found: dict[str, Any] = {"argv": []}
    for number, value in fields(data):
        if number == 1 and isinstance(value, bytes):
            found["context"] = context(value)
        elif number == 2 and isinstance(value, bytes):
            found["exe"] = value.decode("utf-8", "backslashreplace")
        elif number == 3 and isinstance(value, bytes) and len(found["argv"]) < 256:
            found["argv"].append(bounded(value.decode("utf-8", "backslashreplace"), ARGV_MAX))
    return found


def parse_clone(data: bytes) -> tuple[dict[str, Any], int | None]:
    """CloneInfo: 1 context (the parent), 4 the created thread group's id."""
    parent: dict[str, Any] = {}
    child = None
    for number, value in fields(data):
        if number == 1 and isinstance(value, bytes):
            parent = context(value)
        elif number == 4 and isinstance(value, int):
            child = value
    return parent, child


class GvisorEvents:
    """The sink every gVisor sandbox's runsc reports to, and the records it writes (rules 1-3)."""

    def __init__(self, endpoint: Path, lookup: Lookup, write: Write) -> None:
        self.endpoint = endpoint
        self.lookup = lookup
        self.write = write
        self._parents: dict[tuple[str, int], int] = {}  # (sandbox, tgid) -> its parent's tgid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Listen at the endpoint (raises OSError when it cannot)."""
        with contextlib.suppress(FileNotFoundError):
            self.endpoint.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(self.endpoint))
        os.chmod(self.endpoint, 0o600)
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL_S)
        self._listener = listener
        self._spawn(self._accept, "gvisor-events")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        if self._listener is not None:
            self._listener.close()

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                log.error("gvisor events: the sink failed: %s", exc)
                return
            self._spawn(self._serve, "gvisor-sandbox", conn)

    def _serve(self, conn: socket.socket) -> None:
        """One sandbox's runsc: the handshake, then its events until it goes."""
        with conn:
            conn.settimeout(ACCEPT_POLL_S)
            try:
                self._handshake(conn)
                dropped = 0
                while not self._stop.is_set():
                    try:
                        message = conn.recv(1 << 20)
                    except TimeoutError:
                        continue
                    if not message:
                        return
                    dropped = self._handle(message, dropped)
            except (OSError, ValueError, IndexError) as exc:
                log.error("gvisor events: a sandbox's stream broke off: %s", exc)

    def _handshake(self, conn: socket.socket) -> None:
        while True:
            try:
                conn.recv(1 << 16)  # runsc's Handshake: its wire version
                break
            except TimeoutError:
                if self._stop.is_set():
                    return
        conn.send(bytes([0x08, WIRE_VERSION]))  # Handshake{version: 1}

    def _handle(self, message: bytes, dropped: int) -> int:
        size, kind, lost = HEADER.unpack_from(message)
        body = message[size:]
        if kind == EXECVE:
            self._execve(parse_execve(body))
        elif kind == CLONE:
            parent, child = parse_clone(body)
            if child is not None and child != parent.get("group_id") and "container_id" in parent:
                self._remember(parent["container_id"], child, parent["group_id"])
        if lost > dropped:  # gVisor's count of what its queue could not hold, since the start
            self.write([(None, {"op": "events_lost", "times": lost, "source": "gvisor"})])
        return lost

    def _remember(self, sandbox: str, child: int, parent: int) -> None:
        with self._lock:
            if len(self._parents) >= TRACKED_MAX:
                self._parents.pop(next(iter(self._parents)))
            self._parents[(sandbox, child)] = parent

    def _execve(self, execve: dict[str, Any]) -> None:
        ctx = execve.get("context", {})
        sandbox, tgid = ctx.get("container_id"), ctx.get("group_id")
        record = self.lookup(sandbox) if sandbox else None
        if record is None or tgid is None:
            return
        with self._lock:
            parent = self._parents.get((sandbox, tgid))
        facts = {
            "op": "exec",
            "source": "gvisor",
            "pid": tgid,
            "sandbox_pid": tgid,
            "ppid": parent,
            "exe": execve.get("exe"),
            "argv": execve["argv"],
            "cwd": ctx.get("cwd"),
            "time_ns": ctx.get("time_ns"),
        }
        self.write([(record, {key: value for key, value in facts.items() if value is not None})])
