"""File and directory routes other than upload/download: info, delete, move, permissions, search,
replace, and the /directories routes.

Rules: every path goes through `PathResolver` (see paths.py). A request that names several
paths is checked whole first (every path resolves, every mode parses, every owner exists), so a
bad entry is a 4xx with nothing changed; only then are the changes applied. Listings and searches
never follow a symlink into a directory. The blocking work runs in a worker thread.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import INVALID_PATH, ApiError, bad_request
from .identity import in_thread
from .paths import PathResolver, Resolved, file_info, lookup_owner, os_error, parse_mode, set_mode_and_owner
from .requests import Field, check, each_item, each_object, parse_body, query_int, query_paths
from .web import Request, Response, json_response

MAX_RESULTS = 100_000
REPLACE_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Permission:
    owner: str | None = None
    group: str | None = None
    mode: int | str | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> Permission:
        shape = {"owner": Field("str"), "group": Field("str"), "mode": Field("mode")}
        return cls(**check(data, shape, where))


@dataclass(frozen=True)
class RenameItem:
    src: str
    dest: str

    @classmethod
    def parse(cls, data: Any, where: str) -> RenameItem:
        shape = {"src": Field("str", required=True), "dest": Field("str", required=True)}
        return cls(**check(data, shape, where))


@dataclass(frozen=True)
class ReplaceItem:
    old: str
    new: str

    @classmethod
    def parse(cls, data: Any, where: str) -> ReplaceItem:
        shape = {"old": Field("str", required=True, min_length=1), "new": Field("str", required=True)}
        return cls(**check(data, shape, where))


def permissions(data: Any, where: str) -> dict[str, Permission]:
    return each_object(data, Permission.parse, where)


def renames(data: Any, where: str) -> list[RenameItem]:
    return each_item(data, RenameItem.parse, where)


def replacements(data: Any, where: str) -> dict[str, ReplaceItem]:
    return each_object(data, ReplaceItem.parse, where)


def resolver_of(request: Request) -> PathResolver:
    resolver: PathResolver = request.state.resolver
    return resolver


def resolve_all(resolver: PathResolver, paths: list[str], **options: Any) -> list[Resolved]:
    """Resolve every path or none (fds of the ones done are closed when one fails)."""
    done: list[Resolved] = []
    try:
        for path in paths:
            done.append(resolver.resolve(path, **options))
    except BaseException:
        for item in done:
            item.close()
        raise
    return done


@contextlib.contextmanager
def resolved(resolver: PathResolver, paths: list[str], **options: Any) -> Iterator[list[Resolved]]:
    items = resolve_all(resolver, paths, **options)
    try:
        yield items
    finally:
        for item in items:
            item.close()


# -- info, delete, move, permissions -------------------------------------------------------------


def _info(resolver: PathResolver, paths: list[str]) -> dict[str, Any]:
    with resolved(resolver, paths) as items:
        return {path: file_info(item.lstat(), item.path) for path, item in zip(paths, items, strict=True)}


async def files_info(request: Request) -> Response:
    return json_response(await in_thread(_info, resolver_of(request), query_paths(request)))


def _remove_files(resolver: PathResolver, paths: list[str]) -> None:
    with resolved(resolver, paths, follow_last=False) as items:
        for item in items:
            if stat.S_ISDIR(item.lstat().st_mode):
                raise bad_request(
                    f"{item.path} is a directory; delete it with DELETE /directories", INVALID_PATH
                )
        for item in items:
            try:
                os.unlink(item.name, dir_fd=item.dir_fd)
            except OSError as exc:
                raise os_error(exc, item.path) from exc


async def remove_files(request: Request) -> Response:
    await in_thread(_remove_files, resolver_of(request), query_paths(request))
    return Response()


def _move(resolver: PathResolver, moves: list[RenameItem]) -> None:
    created: list[str] = []
    try:
        with (
            resolved(resolver, [m.src for m in moves], follow_last=False) as sources,
            resolved(
                resolver, [m.dest for m in moves], follow_last=False, make_parents=True, created=created
            ) as targets,
        ):
            for source, target in zip(sources, targets, strict=True):
                source.lstat()
                if source.name == "." or target.name == ".":
                    raise bad_request(
                        f"cannot move the root directory ({source.path} -> {target.path})", INVALID_PATH
                    )
            for source, target in zip(sources, targets, strict=True):
                try:
                    os.rename(source.name, target.name, src_dir_fd=source.dir_fd, dst_dir_fd=target.dir_fd)
                except OSError as exc:
                    raise os_error(exc, f"{source.path} -> {target.path}") from exc
    except BaseException:
        remove_created(resolver, created)
        raise


async def move_files(request: Request) -> Response:
    moves = await parse_body(request, renames)
    await in_thread(_move, resolver_of(request), moves)
    return Response()


def _checked_permissions(entries: dict[str, Permission]) -> list[tuple[str, int | None, tuple[int, int]]]:
    return [
        (path, parse_mode(p.mode, path), lookup_owner(p.owner, p.group, path)) for path, p in entries.items()
    ]


def _chmod(resolver: PathResolver, entries: dict[str, Permission]) -> None:
    checked = _checked_permissions(entries)
    with resolved(resolver, [path for path, _, _ in checked]) as items:
        for item in items:
            item.lstat()
        for item, (_, mode, (uid, gid)) in zip(items, checked, strict=True):
            set_mode_and_owner(item.dir_fd, item.name, item.path, mode, uid, gid)


async def chmod_files(request: Request) -> Response:
    entries = await parse_body(request, permissions)
    await in_thread(_chmod, resolver_of(request), entries)
    return Response()


# -- search --------------------------------------------------------------------------------------


def glob_regex(pattern: str) -> re.Pattern[str]:
    """`**` crosses directories, `*` and `?` do not, `[...]` is a class (like doublestar)."""
    out, index = [], 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            close = pattern.find("]", index + 1)
            if close < 0:
                raise bad_request(f"bad glob pattern {pattern!r}: '[' without ']'")
            out.append(fnmatch.translate(pattern[index : close + 1])[4:-3])
            index = close + 1
            continue
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _search(resolver: PathResolver, path: str, pattern: str) -> list[dict[str, Any]]:
    matcher = glob_regex(pattern)
    by_relative_path = "/" in pattern
    results: list[dict[str, Any]] = []
    with resolver.resolve(path) as top:
        top_fd = _open_directory(top)
        try:
            base = top.path.rstrip("/")
            for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top_fd):
                relative_dir = "" if dirpath == "." else dirpath[2:] + "/"
                names = filenames + [d for d in dirnames if stat.S_ISLNK(_lstat(d, dir_fd).st_mode)]
                for name in sorted(names):
                    subject = relative_dir + name if by_relative_path else name
                    if matcher.match(subject):
                        st = _lstat(name, dir_fd)
                        results.append(file_info(st, f"{base}/{relative_dir}{name}"))
                        if len(results) >= MAX_RESULTS:
                            return results
        finally:
            os.close(top_fd)
    return results


def _lstat(name: str, dir_fd: int) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def _open_directory(target: Resolved) -> int:
    try:
        return os.open(
            target.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target.dir_fd
        )
    except NotADirectoryError:
        raise bad_request(f"{target.path} is not a directory", INVALID_PATH) from None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the final component is a symlink
            raise bad_request(
                f"{target.path} is a symlink; give the real directory path", INVALID_PATH
            ) from None
        raise os_error(exc, target.path) from exc


async def search_files(request: Request) -> Response:
    path = query_paths(request)[0]
    pattern = request.query("pattern") or "**"
    return json_response(await in_thread(_search, resolver_of(request), path, pattern))


# -- replace -------------------------------------------------------------------------------------


def replace_stream(
    read: Callable[[], bytes], write: Callable[[bytes], object], old: bytes, new: bytes
) -> int:
    """Replace every `old` with `new` while copying, holding at most one chunk plus len(old) bytes."""
    count, carry = 0, b""
    while True:
        chunk = read()
        data = carry + chunk
        safe = len(data) if not chunk else max(0, len(data) - (len(old) - 1))
        position = 0
        while (found := data.find(old, position)) != -1 and found < safe:
            write(data[position:found])
            write(new)
            count += 1
            position = found + len(old)
        keep_from = max(position, safe)
        write(data[position:keep_from])
        carry = data[keep_from:]
        if not chunk:
            return count


def _replace_one(item: Resolved, old: bytes, new: bytes) -> int:
    try:
        source = os.open(item.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=item.dir_fd)
    except OSError as exc:
        raise os_error(exc, item.path) from exc
    temp = f".{item.name[:200]}.replace-{secrets.token_hex(6)}"
    try:
        st = os.fstat(source)
        if not stat.S_ISREG(st.st_mode):
            raise bad_request(f"{item.path} is not a regular file", INVALID_PATH)
        target = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=item.dir_fd)
        try:
            count = replace_stream(
                lambda: os.read(source, REPLACE_CHUNK), lambda b: _write_all(target, b), old, new
            )
            os.fchmod(target, stat.S_IMODE(st.st_mode))
            with contextlib.suppress(PermissionError):
                os.fchown(target, st.st_uid, st.st_gid)
        finally:
            os.close(target)
        if count:
            os.rename(temp, item.name, src_dir_fd=item.dir_fd, dst_dir_fd=item.dir_fd)
        return count
    finally:
        os.close(source)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=item.dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replace(resolver: PathResolver, entries: dict[str, ReplaceItem]) -> dict[str, Any]:
    with resolved(resolver, list(entries)) as items:
        for item in items:
            if not stat.S_ISREG(item.lstat().st_mode):
                raise bad_request(f"{item.path} is not a regular file", INVALID_PATH)
        return {
            path: {"replacedCount": _replace_one(item, change.old.encode(), change.new.encode())}
            for (path, change), item in zip(entries.items(), items, strict=True)
        }


async def replace_content(request: Request) -> Response:
    entries = await parse_body(request, replacements)
    counts = await in_thread(_replace, resolver_of(request), entries)
    if (request.query("verbose") or "").lower() in ("1", "true", "yes"):
        return json_response(counts)
    return Response()


# -- directories ---------------------------------------------------------------------------------


def _list(resolver: PathResolver, path: str, depth: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    with resolver.resolve(path, follow_last=False) as top:
        top_fd = _open_directory(top)
        try:
            _list_into(entries, top_fd, top.path.rstrip("/"), depth)
        finally:
            os.close(top_fd)
    return entries


def _list_into(entries: list[dict[str, Any]], dir_fd: int, shown: str, depth: int) -> None:
    if depth < 1 or len(entries) >= MAX_RESULTS:
        return
    for name in sorted(os.listdir(dir_fd)):
        with contextlib.suppress(FileNotFoundError):  # removed while we list
            st = _lstat(name, dir_fd)
            entries.append(file_info(st, f"{shown}/{name}"))
            if stat.S_ISDIR(st.st_mode) and depth > 1:
                child = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
                try:
                    _list_into(entries, child, f"{shown}/{name}", depth - 1)
                finally:
                    os.close(child)


async def list_directory(request: Request) -> Response:
    path = query_paths(request)[0]
    depth = query_int(request, "depth", 1, 0) or 0
    return json_response(await in_thread(_list, resolver_of(request), path, depth))


def _make_dirs(resolver: PathResolver, entries: dict[str, Permission]) -> None:
    checked = _checked_permissions(entries)
    created: list[str] = []
    try:
        with resolved(
            resolver, [path for path, _, _ in checked], make_parents=True, created=created
        ) as items:
            for item in items:
                if item.exists() and not stat.S_ISDIR(item.lstat().st_mode):
                    raise bad_request(f"{item.path} exists and is not a directory", INVALID_PATH)
            for item, (_, mode, (uid, gid)) in zip(items, checked, strict=True):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(item.name, 0o755, dir_fd=item.dir_fd)
                set_mode_and_owner(item.dir_fd, item.name, item.path, mode, uid, gid)
    except BaseException:
        remove_created(resolver, created)
        raise


def remove_created(resolver: PathResolver, created: list[str]) -> None:
    """Undo `make_parents`: remove the directories a failed request made (only while empty)."""
    for path in reversed(created):
        with contextlib.suppress(OSError, ApiError), resolver.resolve(path, follow_last=False) as made:
            os.rmdir(made.name, dir_fd=made.dir_fd)


async def make_dirs(request: Request) -> Response:
    entries = await parse_body(request, permissions)
    await in_thread(_make_dirs, resolver_of(request), entries)
    return Response()


def _remove_dirs(resolver: PathResolver, paths: list[str]) -> None:
    with resolved(resolver, paths, follow_last=False) as items:
        for item in items:
            if item.name == ".":
                raise bad_request(f"refusing to delete the root directory ({item.path})", INVALID_PATH)
            if not stat.S_ISDIR(item.lstat().st_mode):
                raise bad_request(
                    f"{item.path} is not a directory; delete files with DELETE /files", INVALID_PATH
                )
        for item in items:
            try:
                shutil.rmtree(item.name, dir_fd=item.dir_fd)
            except OSError as exc:
                raise os_error(exc, item.path) from exc


async def remove_dirs(request: Request) -> Response:
    await in_thread(_remove_dirs, resolver_of(request), query_paths(request))
    return Response()
