"""File bodies in and out: multipart upload and streaming download, never loading a file whole.

Rules:
1. Upload is a sequence of part pairs: `metadata` (JSON `{path, owner, group, mode}`, mode as
   octal digits written as a decimal integer) then `file`. Each file streams into a hidden temp
   file next to its target; only when the whole request parsed and every part was valid are the
   temp files renamed into place. Any failure removes the temp files and the parent directories
   this request created, so a refused upload changes nothing on disk.
2. Download streams from an fd opened with `O_NOFOLLOW` after safe resolution: the whole file
   (200), one byte range (`Range: bytes=a-b`, 206, 416 when unsatisfiable), or lines
   `offset` (1-based) .. `offset+limit-1` as text (mutually exclusive with `Range`).
3. Disk I/O runs in worker threads, so a slow disk never stalls other requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .errors import INVALID_PATH, RANGE_NOT_SATISFIABLE, ApiError, bad_request
from .files import remove_created
from .identity import in_thread
from .paths import PathResolver, Resolved, lookup_owner, os_error, parse_mode
from .requests import Field, check, query_int
from .web import Request, Response, iterate_in_thread

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartParser

CHUNK = 1024 * 1024
MAX_METADATA = 64 * 1024
DEFAULT_FILE_MODE = 0o644


@dataclass(frozen=True)
class FileMetadata:
    path: str
    owner: str | None = None
    group: str | None = None
    mode: int | str | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> FileMetadata:
        shape = {
            "path": Field("str", required=True),
            "owner": Field("str"),
            "group": Field("str"),
            "mode": Field("mode"),
        }
        return cls(**check(data, shape, where))


@dataclass
class PendingFile:
    """One uploaded file, written to `temp` in `target`'s directory, waiting to be renamed."""

    target: Resolved
    temp: str
    fd: int
    mode: int | None
    owner: tuple[int, int]
    size: int = 0


@dataclass
class UploadParser:
    """Multipart callbacks (run in a worker thread) that stream each file part to disk."""

    resolver: PathResolver
    pending: list[PendingFile] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)
    _headers: dict[bytes, bytes] = field(default_factory=dict)
    _field: bytearray = field(default_factory=bytearray)
    _value: bytearray = field(default_factory=bytearray)
    _part: str = ""
    _metadata: bytearray = field(default_factory=bytearray)
    _next: FileMetadata | None = None
    _current: PendingFile | None = None

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda d, s, e: self._field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._value.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _part_begin(self) -> None:
        self._headers.clear()
        self._part = ""

    def _header_end(self) -> None:
        self._headers[bytes(self._field).lower()] = bytes(self._value)
        self._field.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._part = options.get(b"name", b"").decode("utf-8", errors="replace")
        if self._part == "metadata":
            self._metadata.clear()
        elif self._part == "file":
            if self._next is None:
                raise bad_request(
                    "multipart part 'file' has no 'metadata' part before it; send metadata first"
                )
            self._current = self._open_target(self._next)
            self._next = None
        else:
            raise bad_request(
                f"unexpected multipart part {self._part!r}; parts are 'metadata' then 'file' pairs"
            )

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part == "metadata":
            self._metadata += data[start:end]
            if len(self._metadata) > MAX_METADATA:
                raise bad_request(f"metadata part is larger than {MAX_METADATA} bytes")
        elif self._current is not None:
            view = memoryview(data)[start:end]
            while view:
                written = os.write(self._current.fd, view)
                view = view[written:]
            self._current.size += end - start

    def _part_end(self) -> None:
        if self._part == "metadata":
            try:
                data = json.loads(self._metadata)
            except ValueError:
                raise bad_request('metadata part is not JSON like {"path": ..., "mode": 644}') from None
            self._next = FileMetadata.parse(data, "upload metadata")
        elif self._current is not None:
            self._current = None

    def _open_target(self, meta: FileMetadata) -> PendingFile:
        mode = parse_mode(meta.mode, meta.path)
        owner = lookup_owner(meta.owner, meta.group, meta.path)
        target = self.resolver.resolve(meta.path, make_parents=True, created=self.created_dirs)
        try:
            existing = os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if target.name == "." or (existing is not None and not stat.S_ISREG(existing.st_mode)):
            target.close()
            raise bad_request(f"upload target {target.path} exists and is not a regular file", INVALID_PATH)
        if mode is None and existing is not None:
            mode = stat.S_IMODE(existing.st_mode)
        temp = f".{target.name[:200]}.upload-{secrets.token_hex(6)}"
        try:
            fd = os.open(
                temp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=target.dir_fd,
            )
        except OSError as exc:
            target.close()
            raise os_error(exc, target.path) from exc
        pending = PendingFile(target, temp, fd, mode, owner)
        self.pending.append(pending)
        return pending

    def commit(self) -> list[str]:
        """Apply modes/owners and rename every temp file into place."""
        if self._next is not None:
            raise bad_request(f"metadata for {self._next.path} has no 'file' part after it")
        for item in self.pending:
            try:
                os.fchmod(item.fd, item.mode if item.mode is not None else DEFAULT_FILE_MODE)
                if item.owner != (-1, -1):
                    os.fchown(item.fd, *item.owner)
            except OSError as exc:
                raise os_error(exc, item.target.path) from exc
        for item in self.pending:
            os.rename(
                item.temp, item.target.name, src_dir_fd=item.target.dir_fd, dst_dir_fd=item.target.dir_fd
            )
            item.temp = ""
        return [item.target.path for item in self.pending]

    def close(self) -> None:
        """Release fds; remove temp files and created directories unless committed."""
        for item in self.pending:
            os.close(item.fd)
            if item.temp:
                with contextlib.suppress(OSError):
                    os.unlink(item.temp, dir_fd=item.target.dir_fd)
            item.target.close()
        if not (self.pending and all(not item.temp for item in self.pending)):
            remove_created(self.resolver, self.created_dirs)


def multipart_boundary(request: Request) -> bytes:
    from python_multipart.multipart import parse_options_header

    kind, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise bad_request("upload needs Content-Type: multipart/form-data with a boundary")
    return boundary


async def upload(request: Request) -> Response:
    from python_multipart.multipart import MultipartParser  # imported on the first upload only

    parser = UploadParser(request.state.resolver)
    multipart = MultipartParser(multipart_boundary(request), parser.callbacks())  # type: ignore[arg-type]
    batch = bytearray()
    try:
        async for chunk in request.stream():
            batch += chunk
            if len(batch) >= CHUNK:
                await in_thread(_feed, multipart, bytes(batch))
                batch.clear()
        await in_thread(_feed, multipart, bytes(batch))
        await in_thread(multipart.finalize)
        if not parser.pending:
            raise bad_request("upload carried no 'metadata' + 'file' part pair")
        await in_thread(parser.commit)
    finally:
        await in_thread(parser.close)
    return Response()


def _feed(multipart: MultipartParser, data: bytes) -> None:
    try:
        multipart.write(data)
    except ApiError:
        raise
    except Exception as exc:  # python-multipart raises its own error types for malformed bodies
        raise bad_request(f"malformed multipart body: {exc}") from None


# -- download ----------------------------------------------------------------------------------

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str, size: int) -> tuple[int, int]:
    """One `bytes=a-b` / `bytes=a-` / `bytes=-n` range as (first, last) inclusive."""
    match = _RANGE.match(header.strip())
    if not match or match.group(1) == match.group(2) == "":
        raise bad_request(
            f"unsupported Range {header!r}: give one range like bytes=0-1023, bytes=1024- or bytes=-512"
        )
    first_s, last_s = match.groups()
    if first_s == "":
        first, last = max(0, size - int(last_s)), size - 1
    else:
        first, last = int(first_s), min(int(last_s), size - 1) if last_s else size - 1
    if first >= size or first > last:
        raise ApiError(
            416,
            RANGE_NOT_SATISFIABLE,
            f"range {header!r} is outside the file ({size} bytes)",
            {"Content-Range": f"bytes */{size}"},
        )
    return first, last


def read_span(fd: int, first: int, length: int) -> Iterator[bytes]:
    try:
        offset, end = first, first + length
        while offset < end:
            chunk = os.pread(fd, min(CHUNK, end - offset), offset)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def read_lines(fd: int, offset: int, limit: int | None) -> Iterator[bytes]:
    """Lines offset..offset+limit-1 (1-based), read a chunk at a time."""
    try:
        line, sent, position = 1, 0, 0
        while limit is None or sent < limit:
            chunk = os.pread(fd, CHUNK, position)
            if not chunk:
                return
            position += len(chunk)
            start = 0
            while start < len(chunk) and (limit is None or sent < limit):
                newline = chunk.find(b"\n", start)
                stop = len(chunk) if newline < 0 else newline + 1
                if line >= offset:
                    yield chunk[start:stop]
                if newline >= 0:
                    if line >= offset:
                        sent += 1
                    line += 1
                start = stop
    finally:
        os.close(fd)


def open_for_read(resolver: PathResolver, path: str | None) -> tuple[int, os.stat_result, str]:
    with resolver.resolve(path) as target:
        try:
            fd = os.open(target.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target.dir_fd)
        except OSError as exc:
            raise os_error(exc, target.path) from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise bad_request(
                f"{target.path} is not a regular file; only files can be downloaded", INVALID_PATH
            )
        return fd, st, target.path


async def download(request: Request) -> Response:
    offset = query_int(request, "offset", None, 1)
    limit = query_int(request, "limit", None, 1)
    range_header = request.headers.get("range")
    if range_header and (offset is not None or limit is not None):
        raise bad_request("Range and offset/limit are mutually exclusive: use one or the other")
    fd, st, path = await in_thread(open_for_read, request.state.resolver, request.query("path"))
    try:
        if offset is not None or limit is not None:
            lines = iterate_in_thread(read_lines(fd, offset or 1, limit))
            return Response(200, lines, content_type="text/plain; charset=utf-8")
        name = quote(os.path.basename(path))
        headers = {"Accept-Ranges": "bytes", "Content-Disposition": f"attachment; filename*=UTF-8''{name}"}
        if range_header:
            first, last = parse_range(range_header, st.st_size)
            headers |= {
                "Content-Range": f"bytes {first}-{last}/{st.st_size}",
                "Content-Length": str(last - first + 1),
            }
            span = iterate_in_thread(read_span(fd, first, last - first + 1))
            return Response(206, span, headers, "application/octet-stream")
        headers["Content-Length"] = str(st.st_size)
        return Response(
            200, iterate_in_thread(read_span(fd, 0, st.st_size)), headers, "application/octet-stream"
        )
    except BaseException:
        os.close(fd)
        raise
