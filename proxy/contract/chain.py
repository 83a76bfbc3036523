"""The audit file's hash chain: each line carries the sha256 of the line before it.

Rules:
1. A line is `{...,"prev":"<hex>"}`: `prev` is the sha256 (hex) of the line before it in the
   file, as written (without its newline); the first line of a file carries the last line of the
   file rotated before it (`<name>.1`), the first line ever `GENESIS`. So an edited, removed,
   inserted or reordered line breaks the chain at the line after it (`verify_chain`).
2. Every writer of the audit file appends through `append_chained` under an exclusive `flock`
   on the file: the proxy's writer (which also rotates under it), a worker's oversized line and
   lifecycle's records. The lock is the chain's order; O_APPEND alone would interleave writers
   that each believe they saw the last line.
3. `prev` is added to a serialised line at its end (`link`): the record's own fields are never
   re-encoded, and a reader that does not know `prev` ignores it (old files have none).
4. A file that does not end in a newline (a writer killed mid-line) is ended with one first, so
   the cut line stands alone (malformed, and reported by `verify_chain`) and the next line is whole.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GENESIS = "0" * 64
TAIL_CHUNK = 8192
BROKEN = (
    "prev hash is not the line before's: that line was edited, or lines were removed, inserted or "
    "reordered here"
)
UNCHAINED = "carries no prev hash after chained lines (a line added by another writer)"
PREV_FIELD = re.compile(rb',"prev":"([0-9a-f]{64})"}$')


def line_hash(line: bytes) -> str:
    """The hash a line's successor carries (the line without its newline)."""
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def link(lines: bytes, prev: str) -> tuple[bytes, str]:
    """`lines` (complete JSON-object lines) each with `prev` added; and the last one's hash."""
    out = []
    for line in lines.splitlines():
        if not line:
            continue
        chained = line[:-1] + b',"prev":"' + prev.encode() + b'"}'
        prev = line_hash(chained)
        out.append(chained + b"\n")
    return b"".join(out), prev


def last_line_hash(fd: int, size: int) -> str | None:
    """The hash of the last line of the open file of `size` bytes (None when it is empty)."""
    if size == 0:
        return None
    end = size - 1 if os.pread(fd, 1, size - 1) == b"\n" else size
    tail, start = b"", end  # tail is the file's bytes [start, end)
    while start > 0:
        step = min(TAIL_CHUNK, start)
        start -= step
        tail = os.pread(fd, step, start) + tail
        if (cut := tail.rfind(b"\n")) >= 0:
            return line_hash(tail[cut + 1 :])
    return line_hash(tail)


def previous_file_hash(path: Path) -> str:
    """The hash a new (empty) live file's first line carries: the last line of `<name>.1`."""
    try:
        fd = os.open(path.with_name(f"{path.name}.1"), os.O_RDONLY)
    except FileNotFoundError:
        return GENESIS
    try:
        return last_line_hash(fd, os.fstat(fd).st_size) or GENESIS
    finally:
        os.close(fd)


@dataclass
class ChainHead:
    """A writer's memory of where the file ended after its own last write: while the file is
    still that size (no other writer came between), its last hash need not be read back."""

    inode: int = -1
    size: int = -1
    last: str = GENESIS

    def prev(self, fd: int, path: Path) -> str:
        stat = os.fstat(fd)
        if (stat.st_ino, stat.st_size) == (self.inode, self.size):
            return self.last
        if stat.st_size and os.pread(fd, 1, stat.st_size - 1) != b"\n":
            os.write(fd, b"\n")  # rule 4: end a cut line
            stat = os.fstat(fd)
        found = last_line_hash(fd, stat.st_size)
        if found is not None:
            return found
        if stat.st_ino == self.inode or self.inode == -1:
            return previous_file_hash(path)
        return self.last  # this writer rotated: the new file follows the line it wrote last

    def advance(self, fd: int, last: str) -> None:
        stat = os.fstat(fd)
        self.inode, self.size, self.last = stat.st_ino, stat.st_size, last


def append_chained(fd: int, path: Path, lines: bytes, head: ChainHead, fsync: bool = False) -> None:
    """Append `lines` chained to the file's last line, with one write, under the lock the caller
    holds (flock). All or none: a part written (a full disk) is cut back, and OSError raised."""
    prev = head.prev(fd, path)
    chained, last = link(lines, prev)
    start = os.fstat(fd).st_size
    view = memoryview(chained)
    try:
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    except OSError:
        if len(view) < len(chained):
            os.ftruncate(fd, start)
        raise
    head.advance(fd, last)


def open_live(path: Path) -> int:
    """The live file, opened and locked, and still the live file once locked (a rotation between
    the open and the lock moved it: open the new one). The caller unlocks and closes it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def append_line(path: Path, line: bytes) -> None:
    """Append one line to the live audit file from a process that does not own it (lifecycle's
    records, a worker's oversized line)."""
    fd = open_live(path)
    try:
        append_chained(fd, path, line, ChainHead())
    finally:
        os.close(fd)  # also releases the lock


@dataclass
class Problem:
    file: str
    line: int
    what: str


@dataclass
class Verdict:
    """What `verify` found: lines read, lines chained, and each break."""

    lines: int = 0
    chained: int = 0
    unchained_before: int = 0  # lines written before the chain existed (old files): not checked
    problems: list[Problem] = field(default_factory=list)


def audit_files(path: Path) -> list[Path]:
    """The live file and its backups, oldest first (each name stat'ed in turn)."""
    backups = []
    n = 1
    while (backup := path.with_name(f"{path.name}.{n}")).exists():
        backups.append(backup)
        n += 1
    return [*reversed(backups), *([path] if path.exists() else [])]


def verify_chain(path: Path) -> Verdict:
    """Check the chain through every audit file, oldest first (rules 1 and 4). Lines before the
    first chained one were written before the chain existed and are counted, not checked."""
    verdict = Verdict()
    expected: str | None = None  # the hash the next line must carry (None: the oldest line kept)
    chained_seen = False
    for file in audit_files(path):
        for number, line in _lines(file):
            verdict.lines += 1
            found = PREV_FIELD.search(line)
            if not _is_json(line):
                verdict.problems.append(Problem(file.name, number, "not a whole JSON line (cut or edited)"))
            elif found is None and not chained_seen:
                verdict.unchained_before += 1
            elif found is None:
                verdict.problems.append(Problem(file.name, number, UNCHAINED))
            elif expected is not None and found.group(1).decode() != expected:
                verdict.problems.append(Problem(file.name, number, BROKEN))
            else:
                verdict.chained += 1
            chained_seen = chained_seen or found is not None
            expected = line_hash(line)
    return verdict


def _lines(file: Path) -> Iterator[tuple[int, bytes]]:
    with file.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            yield number, line.rstrip(b"\n")


def _is_json(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
