"""What an execd call does, read from the call itself: the pure core of the exec audit trail.

Every client call to a sandbox's execd passes the host's reverse proxy (api/sandbox_proxy.py),
which records it (api/exec_audit.py) with what this module reads from it.

Rules:
1. One table (`OPERATIONS`) says which execd routes are recorded, as which kind (`command` or
   `file`, rows of lifecycle/audit/kinds.py) and operation, with the operation's OCSF activity.
   The routes that do nothing to the sandbox (ping, metrics, status and log polling, listings of
   contexts, a PTY's status) are listed in `NOT_OPERATIONS` and not recorded; any other call,
   one execd may not even serve, is recorded as `other`: a route missing from the table is seen,
   never skipped. A new route is one row.
2. The path is read as execd reads it (percent-escapes decoded, web.py `Request`), so a route
   spelt with escapes (`/comman%64`) is the route execd runs.
3. What is read comes from the request as the client sent it (before execd sees it) and from the
   answer as execd sent it: never from the sandbox's own word about itself beyond its answer.
4. Bounded: a command line or cell is kept up to `TEXT_MAX` characters, at most `PATHS_MAX`
   paths per call; an environment's values are never kept (only its names).
5. No I/O: the caller feeds bytes in and takes a `Facts` dict out.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

TEXT_MAX = 4096  # characters of a command line or code cell kept in a record
PATHS_MAX = 100  # paths (and file digests) kept per call
# bytes of a JSON request body read to describe it: execd's own limit (execd/requests.py
# MAX_JSON_BODY), so every body execd would run is read; a larger one execd refuses (413)
JSON_BODY_MAX = 8 * 1024 * 1024
FRAME_MAX = 64 * 1024  # bytes of one answer frame looked at for an outcome (init, complete, error)
IDENTITY = re.compile(r"^/v1/filesystem/(?P<uid>[0-9]+)/(?P<gid>[0-9]+)(?P<rest>/.*)$")

Facts = dict[str, Any]


@dataclass(frozen=True)
class Operation:
    """One recorded execd route: its kind, its name in records and its OCSF activity."""

    kind: str
    name: str
    activity: int  # OCSF activity_id of the kind's class
    body: str = "none"  # how the request body is read: "none", "json" or "upload"


# (HTTP method, execd path) -> operation. File routes also serve under /v1/filesystem/{uid}/{gid}.
# OCSF activities: Process Activity 1 Launch, 2 Terminate, 99 Other; File System Activity 1 Create,
# 2 Read, 3 Update, 4 Delete, 5 Rename, 6 Set Attributes, 8 Get Attributes, 99 Other.
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/command"): Operation("command", "run", 1, "json"),
    ("DELETE", "/command"): Operation("command", "interrupt", 2),
    ("POST", "/session"): Operation("command", "session_open", 1, "json"),
    ("POST", "/session/*/run"): Operation("command", "session_input", 1, "json"),
    ("DELETE", "/session/*"): Operation("command", "session_close", 2),
    ("POST", "/code/context"): Operation("command", "context_open", 1, "json"),
    ("DELETE", "/code/contexts/*"): Operation("command", "context_close", 2),
    ("DELETE", "/code/contexts"): Operation("command", "context_close", 2),
    ("POST", "/code"): Operation("command", "code", 1, "json"),
    ("DELETE", "/code"): Operation("command", "interrupt", 2),
    ("POST", "/pty"): Operation("command", "pty_open", 1, "json"),
    ("DELETE", "/pty/*"): Operation("command", "pty_close", 2),
    ("GET", "/pty/*/ws"): Operation("command", "pty_attach", 1),  # the terminal's WebSocket
    ("POST", "/files/upload"): Operation("file", "write", 1, "upload"),
    ("GET", "/files/download"): Operation("file", "read", 2),
    ("GET", "/files/info"): Operation("file", "stat", 8),
    ("DELETE", "/files"): Operation("file", "delete", 4),
    ("POST", "/files/mv"): Operation("file", "move", 5, "json"),
    ("POST", "/files/permissions"): Operation("file", "chmod", 6, "json"),
    ("GET", "/files/search"): Operation("file", "search", 99),
    ("POST", "/files/replace"): Operation("file", "replace", 3, "json"),
    ("GET", "/directories/list"): Operation("file", "list", 99),
    ("POST", "/directories"): Operation("file", "mkdir", 1, "json"),
    ("DELETE", "/directories"): Operation("file", "rmdir", 4),
}
# The routes that do nothing to the sandbox: not recorded (rule 1).
NOT_OPERATIONS = frozenset({
    ("GET", "/ping"), ("GET", "/metrics"), ("GET", "/metrics/watch"), ("GET", "/command/status/*"),
    ("GET", "/command/*/logs"), ("GET", "/code/contexts"), ("GET", "/code/contexts/*"), ("GET", "/pty/*"),
    ("GET", "/v1/isolated/capabilities"),
})  # fmt: skip
# A line typed into a PTY session (api/exec_audit.py `Terminal`), or a signal sent to it.
PTY_INPUT = Operation("command", "pty_input", 1)
# Any other call: a route the table does not know, a method execd refuses, a path it has no route
# for. Recorded, with its route in the record's `detail`.
OTHER_OPERATION = Operation("command", "other", 99)


def operation(method: str, path: str) -> tuple[Operation, str | None] | None:
    """The recorded operation of a call to execd (and the user of an identity route), or None for
    a route that does nothing to the sandbox. `path` as the client sent it (rule 2)."""
    path = execd_path(path)
    user = None
    if found := IDENTITY.match(path):
        user, path = f"{found['uid']}:{found['gid']}", found["rest"]
    for pattern in map("/".join, _candidates(path.rstrip("/").split("/"))):
        op = OPERATIONS.get((method, pattern))
        if op is not None and (user is None or op.kind == "file"):
            return op, user
        if user is None and (method, pattern) in NOT_OPERATIONS:
            return None
    return OTHER_OPERATION, user


def execd_path(path: str) -> str:
    """The path execd routes by: percent-escapes decoded, as execd's web.py decodes them."""
    return unquote(path) if "%" in path else path


def _candidates(parts: list[str]) -> list[list[str]]:
    """The path itself, then with each segment after the first two in turn as `*`."""
    out = [parts]
    for index in range(2, len(parts)):
        out.append([*parts[:index], "*", *parts[index + 1 :]])
    return out


def bounded(text: str, limit: int = TEXT_MAX) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more characters]"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# The path segment that names a session, context or PTY (`/session/{id}/run`, `/code/contexts/{id}`).
SESSION_SEGMENT = {
    "session_input": 1, "session_close": 1, "context_close": 2, "pty_close": 1, "pty_attach": 1,
}  # fmt: skip


def query_facts(op: Operation, path: str, query: str) -> Facts:
    """What the route's path and query name: session, context or PTY ids, paths, a pattern."""
    params = parse_qs(query, keep_blank_values=True)
    facts: Facts = {}
    paths = params.get("path", [])
    if paths:
        facts["paths"] = paths[:PATHS_MAX]
    if pattern := params.get("pattern"):
        facts["pattern"] = bounded(pattern[0], 1024)
    if run_id := params.get("id"):
        facts["run_id"] = run_id[0]
    segments = execd_path(path).strip("/").split("/")
    at = SESSION_SEGMENT.get(op.name)
    if at is not None and len(segments) > at:
        facts["session"] = segments[at]
    return facts


def body_facts(op: Operation, body: bytes) -> Facts:
    """What a JSON request body says the operation does (a body that is not JSON: nothing)."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return {"unparsed_body": len(body)}
    reader = BODY_READERS.get(op.name)
    if reader is None or not isinstance(data, list if op.name == "move" else dict):
        return {}
    return reader(data)


def _command(data: dict[str, Any]) -> Facts:
    facts: Facts = {}
    if isinstance(argv := data.get("argv"), list) and argv:
        facts["command"] = bounded(shlex.join(str(item) for item in argv))
    elif isinstance(command := data.get("command"), str):
        facts["command"] = bounded(command)
    _copy(data, facts, "cwd", "timeout")
    if data.get("background") is True:
        facts["background"] = True
    if "uid" in data or "gid" in data:
        facts["user"] = f"{data.get('uid', '')}:{data.get('gid', '')}"
    if isinstance(envs := data.get("envs"), dict) and envs:
        facts["env_names"] = sorted(str(name) for name in envs)[:PATHS_MAX]
    return facts


def _code(data: dict[str, Any]) -> Facts:
    facts: Facts = {}
    if isinstance(code := data.get("code"), str):
        facts["code"] = bounded(code)
        facts["code_sha256"] = sha256_text(code)
    if isinstance(context := data.get("context"), dict):
        _copy(context, facts, "language")
        if isinstance(context.get("id"), str):
            facts["session"] = context["id"]
    _copy(data, facts, "language", "cwd")
    return facts


def _path_map(data: dict[str, Any]) -> Facts:
    """`{path: {...}}` bodies (mkdir, chmod): the paths and what each asks."""
    paths = list(data)[:PATHS_MAX]
    facts: Facts = {"paths": paths}
    modes = {p: v.get("mode") for p, v in data.items() if isinstance(v, dict) and v.get("mode") is not None}
    if modes:
        facts["modes"] = dict(list(modes.items())[:PATHS_MAX])
    return facts


def _replace(data: dict[str, Any]) -> Facts:
    """`{path: {old, new}}`: each path with the digest of the text it now holds in place of `old`."""
    files = [
        {"path": path, "new_sha256": sha256_text(change["new"]), "new_bytes": len(change["new"].encode())}
        for path, change in list(data.items())[:PATHS_MAX]
        if isinstance(change, dict) and isinstance(change.get("new"), str)
    ]
    return {"paths": list(data)[:PATHS_MAX], "files": files}


def _moves(data: list[Any]) -> Facts:
    """`POST /files/mv` takes a JSON array of `{src, dest}`."""
    moves = [
        {"src": item.get("src"), "dest": item.get("dest")}
        for item in data[:PATHS_MAX]
        if isinstance(item, dict)
    ]
    return {"moves": moves, "paths": [m["src"] for m in moves if isinstance(m["src"], str)]}


def _copy(source: dict[str, Any], facts: Facts, *names: str) -> None:
    for name in names:
        value = source.get(name)
        if isinstance(value, str | int) and not isinstance(value, bool):
            facts[name] = bounded(value, 1024) if isinstance(value, str) else value


BODY_READERS: dict[str, Any] = {
    "run": _command,
    "session_input": _command,
    "session_open": _command,
    "pty_open": _command,
    "context_open": _code,
    "code": _code,
    "replace": _replace,
    "mkdir": _path_map,
    "chmod": _path_map,
    "move": _moves,
}


@dataclass
class Outcome:
    """What execd's answer says: a command's exit code, a run's id, an error; a download's digest."""

    exit_code: int | None = None
    run_id: str | None = None
    error: str | None = None
    digest: Any = None  # hashlib object over the answer's body (reads)
    _pending: bytearray = field(default_factory=bytearray)

    def feed_frames(self, chunk: bytes) -> None:
        """Read execd's event frames (JSON objects separated by blank lines) for the outcome."""
        self._pending += chunk
        while (end := self._pending.find(b"\n\n")) >= 0:
            frame = bytes(self._pending[:end])
            del self._pending[: end + 2]
            self._frame(frame)
        if len(self._pending) > FRAME_MAX:  # an output frame too long to matter: skip to its end
            self._pending.clear()

    def _frame(self, frame: bytes) -> None:
        if not frame.startswith((b'{"type":"init"', b'{"type":"execution_complete"', b'{"type":"error"')):
            return
        try:
            event = json.loads(frame)
        except ValueError:
            return
        kind = event.get("type")
        if kind == "init" and isinstance(event.get("text"), str):
            self.run_id = event["text"]
        elif kind == "execution_complete" and self.exit_code is None and self.error is None:
            self.exit_code = 0
        elif kind == "error" and isinstance(error := event.get("error"), dict):
            value = str(error.get("evalue", ""))
            if error.get("ename") == "CommandExecError" and value.lstrip("-").isdigit():
                self.exit_code = int(value)
            else:
                self.error = bounded(f"{error.get('ename', '')}: {value}", 1024)

    def facts(self) -> Facts:
        out: Facts = {}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.run_id is not None:
            out["run_id"] = self.run_id
        if self.error is not None:
            out["error"] = self.error
        if self.digest is not None:
            out["read_sha256"] = self.digest.hexdigest()
        return out


@dataclass
class UploadDigests:
    """Reads a multipart upload as it streams past: each `metadata` part's path, and the sha256 and
    size of the `file` part after it (what execd writes there). A body it cannot read (not
    multipart, malformed) leaves `problem` set; the upload itself is execd's to refuse."""

    files: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None
    _parser: Any = None
    _headers: dict[bytes, bytes] = field(default_factory=dict)
    _header: list[bytearray] = field(default_factory=lambda: [bytearray(), bytearray()])
    _part: bytes = b""
    _metadata: bytearray = field(default_factory=bytearray)
    _path: str | None = None
    _hash: Any = None
    _size: int = 0

    @classmethod
    def for_content_type(cls, content_type: str) -> UploadDigests:
        from python_multipart.multipart import MultipartParser, parse_options_header

        digests = cls()
        kind, options = parse_options_header(content_type)
        if kind != b"multipart/form-data" or not options.get(b"boundary"):
            digests.problem = "not multipart/form-data with a boundary"
            return digests
        digests._parser = MultipartParser(options[b"boundary"], digests._callbacks())  # type: ignore[arg-type]
        return digests

    def _callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._headers.clear,
            "on_header_field": lambda d, s, e: self._header[0].extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header[1].extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def feed(self, chunk: bytes) -> None:
        if self._parser is None or self.problem is not None:
            return
        try:
            self._parser.write(chunk)
        except Exception as exc:  # a malformed body: execd refuses it; we only stop reading
            self.problem = f"unreadable multipart body: {exc}"[:200]

    def _header_end(self) -> None:
        name, value = self._header
        self._headers[bytes(name).lower()] = bytes(value)
        name.clear()
        value.clear()

    def _headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._part = options.get(b"name", b"")
        if self._part == b"metadata":
            self._metadata.clear()
        elif self._part == b"file":
            self._hash, self._size = hashlib.sha256(), 0

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part == b"metadata" and len(self._metadata) < JSON_BODY_MAX:
            self._metadata += data[start:end]
        elif self._part == b"file" and self._hash is not None:
            self._hash.update(data[start:end])
            self._size += end - start

    def _part_end(self) -> None:
        if self._part == b"metadata":
            try:
                path = json.loads(self._metadata).get("path")
            except (ValueError, AttributeError):
                path = None
            self._path = path if isinstance(path, str) else None
        elif self._part == b"file" and self._hash is not None and len(self.files) < PATHS_MAX:
            self.files.append({"path": self._path, "sha256": self._hash.hexdigest(), "bytes": self._size})
            self._hash = None

    def facts(self) -> Facts:
        out: Facts = {"files": self.files, "paths": [f["path"] for f in self.files if f["path"]]}
        if self.problem is not None:
            out["body_problem"] = self.problem
        return out


def terminal_input(message: bytes | str) -> tuple[bytes, str | None]:
    """What a client's WebSocket message gives a PTY session (execd/pty_sessions.py rule 2): the
    bytes it types (binary 0x00 + bytes, or JSON `stdin{data}`) and the signal it sends, if any."""
    if isinstance(message, bytes):
        return (message[1:], None) if message[:1] == b"\x00" else (b"", None)
    try:
        frame = json.loads(message)
    except ValueError:
        return b"", None
    if not isinstance(frame, dict):
        return b"", None
    if frame.get("type") == "stdin" and isinstance(frame.get("data"), str):
        return frame["data"].encode("utf-8", "surrogatepass"), None
    if frame.get("type") == "signal":
        return b"", bounded(str(frame.get("signal")), 64)
    return b"", None


def summary(op: Operation, facts: Facts) -> str:
    """One line for the record's `reason`: the operation and its command, cell or first path."""
    what = facts.get("command") or facts.get("code") or facts.get("input") or facts.get("signal") or ""
    if not what and facts.get("paths"):
        what = " ".join(str(p) for p in facts["paths"][:3])
    text = f"{op.name} {what}".strip()
    return bounded(" ".join(text.split()), 200)
