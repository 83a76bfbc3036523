"""Every program a sandbox runs, from the kernel's own word: the netlink process connector.

Rules:
1. The source is the kernel (`NETLINK_CONNECTOR`, `CN_IDX_PROC`): a sandbox cannot forge an
   event, and cannot stop the host from hearing one; it can only flood them, and an overflow of
   the socket (ENOBUFS) is itself recorded (`events_lost`).
2. A process belongs to a sandbox when its cgroup is the sandbox's (`sandgate-<instance>-<id>`,
   lifecycle/cgroups.py rule 2: every sandbox process is in it from its first instruction), read
   once at its exec, or when its parent is known to be one (forks are followed in memory, so a
   child that is gone before it can be read is still placed; the kernel may send a child's fork
   event after its exec, so such an exec waits for it). Host processes leave nothing here
   beyond a bounded wait of the execs of those that were gone at once.
3. Each `exec` of a sandbox process is one `process` record: pid (the host's, and the sandbox's
   own), its parent, executable, argv (bounded), cwd, uid, the kernel's time of the exec. A
   `ptrace` attach by a sandbox process is a record too. What /proc no longer shows (a process
   gone before it was read) is said so, never guessed.
4. The connector answers only in the initial network namespace: a server running in another one
   opens it in the namespace the setting `process_events_netns` names.
5. The parsing is pure (`parse_events`); the socket and /proc are the thread's edge.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandgate.lifecycle.exec_trail import bounded
from sandgate.lifecycle.sandbox_store import SandboxRecord

log = logging.getLogger(__name__)

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
NLMSG_DONE = 3
EVENT_OFFSET = 16 + 20  # nlmsghdr, cn_msg
PROC_EVENT_FORK = 0x1
PROC_EVENT_EXEC = 0x2
PROC_EVENT_PTRACE = 0x100
PROC_EVENT_EXIT = 0x80000000
RECEIVE_BUFFER = 8 * 1024 * 1024  # bytes the kernel may queue for us before it drops events
ARGV_MAX = 4096  # characters of a command line kept
STOP_POLL_S = 0.5  # how long a wait for events lasts before the thread checks it should stop
BATCH_MAX = 256  # datagrams read before the records of a batch are written
TRACKED_MAX = 65_536  # sandbox processes followed at once (their pids, parents, sandboxes)
UNPLACED_MAX = 4096  # execs waiting for the fork event that says whose child they were
CGROUP_PREFIX = "sandgate-"


@dataclass(frozen=True)
class ProcEvent:
    what: int
    timestamp_ns: int
    pid: int
    tgid: int
    other_pid: int = 0  # fork: the parent's pid; ptrace: the tracer's
    other_tgid: int = 0


def parse_events(message: bytes) -> list[ProcEvent]:
    """The process events in one datagram from the connector (one netlink message each)."""
    events = []
    offset = 0
    while offset + EVENT_OFFSET + 24 <= len(message):
        length = struct.unpack_from("=I", message, offset)[0]
        if length < EVENT_OFFSET + 16:
            break
        what, _cpu, stamp = struct.unpack_from("=IIQ", message, offset + EVENT_OFFSET)
        data = offset + EVENT_OFFSET + 16
        if what == PROC_EVENT_FORK:
            parent_pid, parent_tgid, child_pid, child_tgid = struct.unpack_from("=4i", message, data)
            events.append(ProcEvent(what, stamp, child_pid, child_tgid, parent_pid, parent_tgid))
        elif what in (PROC_EVENT_EXEC, PROC_EVENT_EXIT):
            pid, tgid = struct.unpack_from("=2i", message, data)
            events.append(ProcEvent(what, stamp, pid, tgid))
        elif what == PROC_EVENT_PTRACE:
            pid, tgid, tracer_pid, tracer_tgid = struct.unpack_from("=4i", message, data)
            events.append(ProcEvent(what, stamp, pid, tgid, tracer_pid, tracer_tgid))
        offset += (length + 3) & ~3
    return events


def sandbox_of_cgroup(text: str, prefix: str) -> str | None:
    """The sandbox id in /proc/<pid>/cgroup's text, for cgroups named `<prefix><id>`."""
    for line in text.splitlines():
        name = line.rpartition(":")[2].strip("/").split("/", 1)[0]
        if name.startswith(prefix):
            return name[len(prefix) :]
    return None


def open_connector(netns: Path | None) -> socket.socket:
    """The connector's socket, subscribed, in `netns` (rule 4) or this thread's own."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY) if netns else None
    try:
        if netns is not None:
            target = os.open(netns, os.O_RDONLY)
            try:
                os.setns(target, os.CLONE_NEWNET)
            finally:
                os.close(target)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    finally:
        if own is not None:
            os.setns(own, os.CLONE_NEWNET)
            os.close(own)
    try:
        with contextlib.suppress(OSError):  # FORCE needs CAP_NET_ADMIN; the plain size is capped
            sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER)  # SO_RCVBUFFORCE
        sock.bind((0, CN_IDX_PROC))
        operation = struct.pack("=I", PROC_CN_MCAST_LISTEN)
        cn_msg = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(operation), 0) + operation
        sock.send(struct.pack("=IHHII", 16 + len(cn_msg), NLMSG_DONE, 0, 0, 0) + cn_msg)
    except OSError:
        sock.close()
        raise
    return sock


def read_process(pid: int) -> dict[str, Any]:
    """What /proc shows of `pid` now (rule 3: what it no longer shows is said so)."""
    facts: dict[str, Any] = {}
    proc = Path(f"/proc/{pid}")
    try:
        facts["exe"] = os.readlink(proc / "exe")
        argv = (proc / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        facts["argv"] = [bounded(a.decode("utf-8", "backslashreplace"), ARGV_MAX) for a in argv[:256]]
        facts["cwd"] = os.readlink(proc / "cwd")
        for line in (proc / "status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "Uid":
                facts["uid"] = int(value.split()[0])
            elif key == "NSpid":
                facts["sandbox_pid"] = int(value.split()[-1])
            elif key == "PPid" and "ppid" not in facts:
                facts["ppid"] = int(value)
    except (OSError, ValueError, IndexError):
        facts["gone"] = "the process ended before /proc could be read"
    return facts


Lookup = Callable[[str], SandboxRecord | None]
# A batch of records to write: each the sandbox (None: no sandbox, `events_lost`) and its facts.
Write = Callable[[list[tuple[SandboxRecord | None, dict[str, Any]]]], None]


class ProcessWatcher:
    """The thread that hears every process event and records those of sandboxes (rules 1-3)."""

    def __init__(self, instance: str, lookup: Lookup, write: Write, netns: Path | None = None) -> None:
        self.prefix = f"{CGROUP_PREFIX}{instance}-"
        self.lookup = lookup
        self.write = write
        self.netns = netns
        self.lost = 0
        self._sandbox_of: dict[int, str] = {}  # tgid -> sandbox id, for followed processes
        self._parent_of: dict[int, int] = {}
        self._unplaced: dict[int, ProcEvent] = {}
        self._records: dict[
            str, SandboxRecord | None
        ] = {}  # this batch's lookups  # execs of processes gone before /proc was read
        self._writes: list[tuple[SandboxRecord | None, dict[str, Any]]] = []
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Open the connector (raises OSError when this host has none) and listen."""
        self._sock = open_connector(self.netns)
        self._sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="process-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._sock is not None:
            self._sock.close()

    def _run(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            if not select.select([self._sock], [], [], STOP_POLL_S)[0]:
                continue
            try:
                messages = self._pending()
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    log.error("process events: the connector failed: %s", exc)
                    return
                self._overflowed()
                continue
            for event in (event for message in messages for event in parse_events(message)):
                try:
                    self.handle(event)
                except Exception:  # one event's trouble must not end the watch
                    log.exception("process events: event %s not recorded", event)
            self._flush()

    def _pending(self) -> list[bytes]:
        """What the kernel has queued (bounded): /proc is read for all of it before any record is
        written, so a short-lived process is read while it still exists."""
        assert self._sock is not None
        messages: list[bytes] = []
        while len(messages) < BATCH_MAX:
            try:
                messages.append(self._sock.recv(65_536))
            except BlockingIOError:
                break
        return messages

    def _flush(self) -> None:
        """The batch's records, with one locked append; sandboxes looked up afresh next batch."""
        writes, self._writes = self._writes, []
        self._records.clear()
        if writes:
            try:
                self.write(writes)
            except Exception:
                log.exception("process events: %d records not written", len(writes))

    def handle(self, event: ProcEvent) -> None:
        if event.what == PROC_EVENT_FORK:
            if event.pid == event.tgid and (sandbox := self._sandbox_of.get(event.other_tgid)):
                self._follow(event.tgid, sandbox, event.other_tgid)
                if (early := self._unplaced.pop(event.tgid, None)) is not None:
                    self._exec(early)  # its exec came first and it was gone: placed by its parent now
        elif event.what == PROC_EVENT_EXIT:
            if event.pid == event.tgid:
                self._sandbox_of.pop(event.tgid, None)
                self._parent_of.pop(event.tgid, None)
        elif event.what == PROC_EVENT_EXEC:
            self._exec(event)
        elif event.what == PROC_EVENT_PTRACE and event.other_tgid:
            self._ptrace(event)

    def _exec(self, event: ProcEvent) -> None:
        sandbox = self._sandbox_of.get(event.tgid)
        if sandbox is None:
            try:
                sandbox = sandbox_of_cgroup(Path(f"/proc/{event.tgid}/cgroup").read_text(), self.prefix)
            except OSError:  # gone already; the kernel sends a fork event after the child may
                self._hold(event)  # have run, so its parent may still place it
                return
            if sandbox is None:
                return
        facts = read_process(event.tgid)
        parent = self._parent_of.get(event.tgid, facts.get("ppid"))
        self._follow(event.tgid, sandbox, parent)
        record = self._record(sandbox)
        if record is None:
            return
        facts = {"op": "exec", "pid": event.tgid, "ppid": parent, **facts, "kernel_ns": event.timestamp_ns}
        self._writes.append((record, facts))

    def _ptrace(self, event: ProcEvent) -> None:
        sandbox = self._sandbox_of.get(event.other_tgid)
        record = self._record(sandbox) if sandbox else None
        if record is not None:
            facts = {"op": "ptrace", "pid": event.other_tgid, "target_pid": event.tgid}
            self._writes.append((record, {**facts, "kernel_ns": event.timestamp_ns}))

    def _record(self, sandbox: str) -> SandboxRecord | None:
        """The sandbox whose events this watcher records; None for a gVisor one: the host sees
        only runsc's processes there (its execs, its ptrace of its own stubs), and gVisor's
        runtime monitoring reports the sandbox's programs (gvisor_events.py)."""
        if sandbox not in self._records:
            record = self.lookup(sandbox)
            gvisor = record is not None and record.extensions.get("sandgate.isolation") == "gvisor"
            self._records[sandbox] = None if gvisor else record
        return self._records[sandbox]

    def _hold(self, event: ProcEvent) -> None:
        if len(self._unplaced) >= UNPLACED_MAX:
            self._unplaced.pop(next(iter(self._unplaced)))
        self._unplaced[event.tgid] = event

    def _follow(self, tgid: int, sandbox: str, parent: int | None) -> None:
        if len(self._sandbox_of) >= TRACKED_MAX:  # bounded: forget the oldest followed
            oldest = next(iter(self._sandbox_of))
            self._sandbox_of.pop(oldest)
            self._parent_of.pop(oldest, None)
        self._sandbox_of[tgid] = sandbox
        if parent is not None:
            self._parent_of[tgid] = parent

    def _overflowed(self) -> None:
        self.lost += 1
        log.warning("process events: the kernel dropped events (a flood of processes)")
        self._writes.append((None, {"op": "events_lost", "times": self.lost, "at": time.time()}))
        self._flush()


def summary(facts: dict[str, Any]) -> str:
    """One line for a process record's `reason`."""
    if facts["op"] == "exec":
        what = " ".join(facts.get("argv") or []) or facts.get("exe") or "(gone before it was read)"
        return bounded(f"exec {what}", 200)
    if facts["op"] == "ptrace":
        return f"ptrace: pid {facts['pid']} attached to pid {facts['target_pid']}"
    return "process events lost: the kernel's queue overflowed (a flood of processes)"


def to_json(facts: dict[str, Any]) -> str:
    return json.dumps(facts, ensure_ascii=False)
