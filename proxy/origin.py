"""Which process inside a sandbox opened a connection, from the kernel's word, not the sandbox's.

Rules:
1. The source is the sandbox's own network namespace, read from the host: sock_diag
   (`NETLINK_SOCK_DIAG`, inet_diag) names the TCP socket whose local end is the connection's
   source address and port and whose remote end is where the sandbox connected (the original
   destination, before the redirect to the proxy: two sockets may share a local port), and its
   inode; the process is one that holds that inode
   (`/proc/<pid>/fd/* -> socket:[inode]`) among the sandbox's processes: its cgroup's list when
   lifecycle gives it (`process_lists`: a few reads, where a scan of every process on the host
   would wait for the GIL at each of hundreds of syscalls while the event loop is busy), else
   every process in that namespace (`/proc/<pid>/ns/net`). Nothing a sandbox writes is read; it
   can hand its socket to another process of its own (SCM_RIGHTS, fork), and then that holder is
   named: the process that held the connection's socket when the proxy looked.
2. A lookup starts when the front door accepts the connection and runs in a thread of its own
   (never on the event loop), bounded in time (`LOOKUP_S`) and in how many wait at once
   (`PENDING_MAX`). It never delays or changes a decision: a decision's record takes what the
   lookup found by the time it is written, or says why not (`unknown`). What the decision let
   through waits for the lookup before it goes upstream, at most `SETTLE_S` (`settled`: only
   when the proxy is so busy that the lookup thread has not run yet); a connection's last
   records (a request's whole record, a pass-through's closing one) wait for the lookup to end
   (`write_when_known`) without holding up anything else (a program that ended at once is then
   still named if the lookup read it in time).
3. A sandbox whose entry names no `netns` is not looked up, and its records' `process` stays
   null: lifecycle names it only with `exec_audit = "processes"` (a lookup costs milliseconds of
   CPU) and never on gVisor (every socket of the sandbox is held by the Sentry, one host process
   running all its programs, so the holder would name runsc).
4. Parsing is pure (`diag_request`, `socket_inodes`); the netlink socket and /proc are the edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sandgate.proxy.contract.audit import AuditRecord, ConnectionProcess
from sandgate.proxy.resolver import normalise_ip

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
ALL_STATES = 0xFFFFFFFF
DIAG_MSG_MIN = 72  # struct inet_diag_msg, up to and including idiag_inode
LOOKUP_S = 2.0  # a lookup past this gives up (a flood of processes or sockets)
PENDING_MAX = 256  # lookups queued or running at once; past it a connection is not looked up
WORKERS = 2
SETTLE_S = 0.1  # the longest a request waits, after its decision, for its connection's lookup
PENDING = "the lookup had not finished when this record was written"


def diag_request(sequence: int = 1) -> bytes:
    """A dump of every IPv4 TCP socket of the namespace (`inet_diag_req_v2`, no filter)."""
    request = struct.pack("=BBBxI", socket.AF_INET, socket.IPPROTO_TCP, 0, ALL_STATES) + bytes(48)
    flags = NLM_F_REQUEST | NLM_F_DUMP
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, flags, sequence, 0)
    return header + request


Address = tuple[str, int]


def socket_inodes(message: bytes) -> tuple[list[tuple[Address, Address, int]], bool]:
    """((local end, remote end, inode) of each socket in one datagram of the dump, done?)."""
    found: list[tuple[Address, Address, int]] = []
    offset = 0
    while offset + 16 <= len(message):
        length, kind = struct.unpack_from("=IH", message, offset)
        if length < 16 or kind in (NLMSG_DONE, NLMSG_ERROR):
            return found, True
        body = offset + 16
        if kind == SOCK_DIAG_BY_FAMILY and length >= 16 + DIAG_MSG_MIN:
            sport, dport = struct.unpack_from("!HH", message, body + 4)
            source = str(ipaddress.IPv4Address(message[body + 8 : body + 12]))
            destination = str(ipaddress.IPv4Address(message[body + 24 : body + 28]))
            inode = struct.unpack_from("=I", message, body + 68)[0]
            found.append(((source, sport), (destination, dport), inode))
        offset += (length + 3) & ~3
    return found, False


def inode_of(netns: Path, local: Address, remote: Address, deadline: float) -> int | None:
    """The inode of the TCP socket from `local` to `remote` in `netns`; None if there is none."""
    sock = _diag_socket(netns)
    try:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        sock.send(diag_request())
        while True:
            if time.monotonic() > deadline:  # a sandbox with a flood of sockets
                raise TimeoutError
            sockets, done = socket_inodes(sock.recv(65_536))
            for ends in sockets:
                if ends[:2] == (local, remote) and ends[2]:
                    return ends[2]
            if done:
                return None
    finally:
        sock.close()


def _diag_socket(netns: Path) -> socket.socket:
    """A sock_diag socket of `netns` (a socket keeps the namespace it was made in; setns moves
    only this thread, which goes back to its own before anything else runs on it)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(netns, os.O_RDONLY)
        try:
            os.setns(target, os.CLONE_NEWNET)
        finally:
            os.close(target)
        try:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        finally:
            os.setns(own, os.CLONE_NEWNET)
    finally:
        os.close(own)


def _members(netns: Path) -> Iterator[int]:
    """The pids whose network namespace is `netns`."""
    wanted = os.stat(netns)
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                found = os.stat(f"/proc/{name}/ns/net")
                if (found.st_ino, found.st_dev) == (wanted.st_ino, wanted.st_dev):
                    yield int(name)


def _listed(lists: list[str]) -> list[int] | None:
    """The pids in the sandbox's process lists (None: there are none to read)."""
    pids: set[int] = set()
    for path in lists:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(word) for word in Path(path).read_text().split())
    return sorted(pids) if pids else None


def holder(netns: Path, inode: int, deadline: float, lists: list[str] | None = None) -> int | None:
    """A process of the sandbox (its process lists, else every process in `netns`) holding the
    socket `inode` (an inode names one socket in the whole system: no other sandbox's matches)."""
    link = f"socket:[{inode}]"
    for pid in _listed(lists or []) or _members(netns):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or a kernel thread
            continue
        for fd in fds:
            if time.monotonic() > deadline:  # a flood of processes or open files
                raise TimeoutError  # (outside any suppress(OSError): TimeoutError is one)
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    return pid
    return None


def describe(pid: int) -> ConnectionProcess:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        nspid = next(line.split()[-1] for line in status if line.startswith("NSpid:"))
    except (OSError, StopIteration):
        return ConnectionProcess(pid=pid, unknown="the process ended before /proc could be read")
    return ConnectionProcess(pid=pid, sandbox_pid=int(nspid), exe=exe)


def find(netns: Path, local: Address, remote: Address, lists: list[str] | None = None) -> ConnectionProcess:
    """The process holding the sandbox's socket from `local` to `remote` (rule 1)."""
    deadline = time.monotonic() + LOOKUP_S
    try:
        inode = inode_of(netns, local, remote, deadline)
        if inode is None:
            return ConnectionProcess(unknown="the sandbox has no such socket (closed already)")
        pid = holder(netns, inode, deadline, lists)
    except TimeoutError:
        return ConnectionProcess(unknown=f"the lookup took longer than {LOOKUP_S:g} s")
    except OSError as exc:
        return ConnectionProcess(unknown=f"the sandbox's sockets could not be read: {exc}")
    if pid is None:
        return ConnectionProcess(unknown="no process holds the socket any more")
    return describe(pid)


Write = Callable[[AuditRecord], None]


def _key(address: tuple[str, int] | tuple[str, int, int, int]) -> Address:
    return normalise_ip(address[0]), address[1]


class ProcessFinder:
    """The lookups of open connections, by their sandbox end (rule 2)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="process-of")
        self._lookups: dict[Address, Future[ConnectionProcess]] = {}

    def start(
        self, peer: tuple[str, int], destination: tuple[str, int], netns: str | None, lists: list[str]
    ) -> None:
        """Look up who opened the connection from `peer` to `destination` (where the sandbox
        connected: the original destination of a redirected connection)."""
        client = _key(peer)
        if netns is None:  # rule 3
            return
        if sum(not lookup.done() for lookup in self._lookups.values()) >= PENDING_MAX:
            self._done(client, ConnectionProcess(unknown="too many lookups at once (a flood of connections)"))
        else:
            self._lookups[client] = self._pool.submit(find, Path(netns), client, _key(destination), lists)

    def of(self, peer: tuple[str, int] | None) -> ConnectionProcess | None:
        """What is known of `peer`'s process (None: no lookup for it, not a sandbox connection)."""
        lookup = self._lookups.get(_key(peer)) if peer else None
        if lookup is None:
            return None
        if not lookup.done():
            return ConnectionProcess(unknown=PENDING)
        return lookup.result()

    async def settled(self, peer: tuple[str, int] | None) -> None:
        """Wait (at most `SETTLE_S`, never on the event loop's thread) for `peer`'s lookup: called
        after the decision, before a request or a pass-through connection goes upstream, so a
        program cannot be gone before its socket is read while the proxy is busy."""
        lookup = self._lookups.get(_key(peer)) if peer else None
        if lookup is not None and not lookup.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(lookup)), SETTLE_S)

    def write_when_known(self, peer: tuple[str, int] | None, record: AuditRecord, write: Write) -> None:
        """Write `record` (a connection's last) with its process: now if the lookup is done (or
        there is none), else once it is, from the event loop, without holding anything up."""
        lookup = self._lookups.get(_key(peer)) if peer else None
        if lookup is None or lookup.done():
            write(record.model_copy(update={"process": self.of(peer)}) if lookup else record)
            return
        loop = asyncio.get_running_loop()

        def known(done: Future[ConnectionProcess]) -> None:
            loop.call_soon_threadsafe(write, record.model_copy(update={"process": done.result()}))

        lookup.add_done_callback(known)

    def forget(self, peer: tuple[str, int]) -> None:
        self._lookups.pop(_key(peer), None)

    def _done(self, client: Address, process: ConnectionProcess) -> None:
        finished: Future[ConnectionProcess] = Future()
        finished.set_result(process)
        self._lookups[client] = finished
