"""Read the rotating audit JSONL from a saved position, following rotation by inode.

Rules:
1. A position names a file by (device, inode, head), never by path: the writer renames
   `audit.jsonl` to `audit.jsonl.1`, `.1` to `.2` ... and starts a new `audit.jsonl`, so a path
   means a different file after each rotation. `head` (the file's first bytes) guards against
   inode reuse after the oldest backup was deleted.
2. Only complete lines are consumed from the live file; a rotated file is finished, so its
   last line is consumed even without a newline.
3. After our file, the files newer than it are read oldest first (`.k-1` ... `.1`, then the
   live file), so every line is seen exactly once while the position is saved with the lines.
4. Reading never blocks and never writes; the caller stores the returned position.

If our file is gone entirely (rotated past the last backup while nobody read), reading restarts
at the oldest file that exists and `Chunk.gap` says lines may have been lost.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

HEAD_BYTES = 128


@dataclass(frozen=True)
class Position:
    device: int
    inode: int
    head: bytes  # up to HEAD_BYTES of the file's start, as seen when the position was taken
    offset: int


@dataclass(frozen=True)
class Chunk:
    lines: list[bytes]
    position: Position | None  # where to continue; None when no file exists yet
    gap: bool = False  # our file vanished or shrank: lines between may be lost


@dataclass(frozen=True)
class _Segment:
    path: Path
    device: int
    inode: int
    size: int


class RotatingLog:
    """The live file `path` and its numbered backups `path.1`, `path.2`, ..."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._backup = re.compile(re.escape(path.name) + r"\.(\d+)$")

    def segments(self) -> list[_Segment]:
        """Existing files, oldest first.

        Stat'ed newest first, one name after the other (live, .1, .2, ...): rotation moves each
        file one name older, atomically, in the same direction as this scan, so a file moving
        mid-scan may be seen twice (the first sighting is kept) but never jumped over. The
        directory listing only says how far to look: caught mid-rotation it lacks the name being
        vacated, and probing only the listed names would skip the file moving into it."""
        listed = 0
        if self.path.parent.is_dir():
            for entry in self.path.parent.iterdir():
                match = self._backup.match(entry.name)
                if match:
                    listed = max(listed, int(match.group(1)))
        seen: set[tuple[int, int]] = set()
        newest_first = []
        number = 0
        while True:
            path = self.path.with_name(f"{self.path.name}.{number}") if number else self.path
            try:
                st = path.stat()
            except FileNotFoundError:
                if number >= listed:
                    break  # past the oldest: files may have moved beyond the listing, not this far
                number += 1
                continue  # a name vacated mid-rotation; its file is further on
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                newest_first.append(_Segment(path, st.st_dev, st.st_ino, st.st_size))
            number += 1
        return newest_first[::-1]

    def read(self, position: Position | None, max_bytes: int = 4 << 20) -> Chunk:
        """Lines after `position`, up to about `max_bytes`; retried if the files move under us."""
        attempts = 20
        for attempt in range(attempts):
            try:
                return self._read_once(position, max_bytes, final=attempt == attempts - 1)
            except _Moved:
                time.sleep(0.005 * attempt)
        return Chunk([], position)

    def _read_once(self, position: Position | None, max_bytes: int, final: bool) -> Chunk:
        segments = self.segments()
        if not segments:
            return Chunk([], position)
        start, offset, gap = self._locate(segments, position)
        if gap and not final:
            raise _Moved  # probably caught mid-rotation: look again before declaring lines lost
        lines: list[bytes] = []
        budget = max_bytes
        current = position
        for index in range(start, len(segments)):
            segment = segments[index]
            is_live = index == len(segments) - 1
            got, offset, head, done = _read_segment(segment, offset, budget, finished=not is_live)
            lines.extend(got)
            budget -= sum(len(line) + 1 for line in got)
            current = Position(segment.device, segment.inode, head, offset)
            if not done or budget <= 0:
                break
            offset = 0
        return Chunk(lines, current, gap)

    @staticmethod
    def _locate(segments: list[_Segment], position: Position | None) -> tuple[int, int, bool]:
        """(segment index, offset, gap) where reading resumes."""
        if position is None:
            return 0, 0, False
        for index, segment in enumerate(segments):
            if (segment.device, segment.inode) != (position.device, position.inode):
                continue
            if _head_of(segment.path, len(position.head)) != position.head:
                break  # same inode, different file: the inode was reused
            if segment.size < position.offset:
                return index, 0, True  # truncated in place (copytruncate)
            return index, position.offset, False
        return 0, 0, True


class _Moved(Exception):
    """A file changed identity between listing and opening; list again."""


def _head_of(path: Path, length: int) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(length)
    except FileNotFoundError:
        return b""


def _read_segment(
    segment: _Segment, offset: int, budget: int, *, finished: bool
) -> tuple[list[bytes], int, bytes, bool]:
    """Complete lines from offset, the new offset, the file's head, and whether a finished
    (rotated) file was read to its end."""
    try:
        handle = segment.path.open("rb")
    except FileNotFoundError as exc:
        raise _Moved from exc
    with handle:
        st = os.fstat(handle.fileno())
        if (st.st_dev, st.st_ino) != (segment.device, segment.inode):
            raise _Moved
        head = handle.read(HEAD_BYTES)
        handle.seek(offset)
        data = handle.read(max(budget, 1 << 16))
        at_eof = handle.tell() >= st.st_size
    end = data.rfind(b"\n") + 1
    done = finished and at_eof
    if done:
        end = len(data)  # a rotated file's unterminated last line is complete
    lines = [line for line in data[:end].split(b"\n") if line.strip()]
    return lines, offset + end, head, done
