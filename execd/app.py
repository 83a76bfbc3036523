"""The execd app: the route table, the access token, error answers, shared state and shutdown.

Rules:
1. execd imports nothing of sandgate (it runs inside the sandbox) and starts fast: the route
   table names handlers as "module:function", and a module is imported on the first request
   that needs it, never before `/ping` answers (`/ping` itself needs nothing but this module).
   The state routes share (command runner, sessions, path resolver) is made on first use too.
2. With a token configured, every route but `/ping` needs `X-EXECD-ACCESS-TOKEN` (compared in
   constant time); a missing or wrong token is a 401 before the route runs.
3. Every refusal is `{"code", "message"}` JSON; an unexpected error is a 500 that names the
   request, with the traceback on execd's stderr.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from .errors import UNAUTHORIZED, ApiError
from .web import Request, Response, Route, Router, error_response, json_response

if TYPE_CHECKING:
    from .commands import CommandRunner
    from .metrics import CpuSampler
    from .paths import PathResolver
    from .sessions import Sessions

TOKEN_HEADER = "x-execd-access-token"
OPEN_PATHS = frozenset({"/ping"})
# The file routes, also served under `/v1/filesystem/{uid}/{gid}` (as that identity, see
# identity.py) and, as not available, under `/v1/isolated/session/{id}`.
FILE_ROUTES = [
    ("POST", "/files/upload", "transfer:upload"),
    ("GET", "/files/download", "transfer:download"),
    ("GET", "/files/info", "files:files_info"),
    ("DELETE", "/files", "files:remove_files"),
    ("POST", "/files/mv", "files:move_files"),
    ("POST", "/files/permissions", "files:chmod_files"),
    ("GET", "/files/search", "files:search_files"),
    ("POST", "/files/replace", "files:replace_content"),
    ("GET", "/directories/list", "files:list_directory"),
    ("POST", "/directories", "files:make_dirs"),
    ("DELETE", "/directories", "files:remove_dirs"),
]
IDENTITY_PREFIX = "/v1/filesystem/{uid}/{gid}"
ISOLATED_SESSION = "/v1/isolated/session/{session_id}"
ROUTES: list[Route] = [
    ("GET", "/ping", "app:ping"),
    ("POST", "/command", "commands:run_command"),
    ("DELETE", "/command", "commands:interrupt_command"),
    ("GET", "/command/status/{id}", "commands:command_status"),
    ("GET", "/command/{id}/logs", "commands:command_logs"),
    ("POST", "/session", "sessions:create_session"),
    ("POST", "/session/{session_id}/run", "sessions:run_in_session"),
    ("DELETE", "/session/{session_id}", "sessions:delete_session"),
    ("GET", "/metrics", "metrics:get_metrics"),
    ("GET", "/metrics/watch", "metrics:watch_metrics"),
    *FILE_ROUTES,
    *[(method, IDENTITY_PREFIX + path, to, "identity:as_identity") for method, path, to in FILE_ROUTES],
    # code contexts (code.py; each context is a Jupyter kernel, see kernels.py)
    ("POST", "/code/context", "code:create_context"),
    ("GET", "/code/contexts", "code:list_contexts"),
    ("DELETE", "/code/contexts", "code:delete_contexts"),
    ("GET", "/code/contexts/{context_id}", "code:get_context"),
    ("DELETE", "/code/contexts/{context_id}", "code:delete_context"),
    ("POST", "/code", "code:run_code"),
    ("DELETE", "/code", "code:interrupt_code"),
    # interactive terminals (pty_sessions.py; the live channel is a WebSocket)
    ("POST", "/pty", "pty_sessions:create_pty"),
    ("GET", "/pty/{session_id}", "pty_sessions:pty_status"),
    ("DELETE", "/pty/{session_id}", "pty_sessions:delete_pty"),
    ("GET", "/pty/{session_id}/ws", "pty_sessions:pty_websocket"),
    # OSEP-0013 isolated sessions: capabilities say they are not available, the rest is a 503
    ("GET", "/v1/isolated/capabilities", "isolated:capabilities"),
    ("POST", "/v1/isolated/session", "isolated:unsupported"),
    ("GET", "/v1/isolated/sessions", "isolated:unsupported"),
    ("GET", ISOLATED_SESSION, "isolated:unsupported"),
    ("DELETE", ISOLATED_SESSION, "isolated:unsupported"),
    ("POST", ISOLATED_SESSION + "/run", "isolated:unsupported"),
    ("GET", ISOLATED_SESSION + "/runs/{run_id}", "isolated:unsupported"),
    ("GET", ISOLATED_SESSION + "/runs/{run_id}/logs", "isolated:unsupported"),
    ("GET", ISOLATED_SESSION + "/diff", "isolated:unsupported"),
    ("POST", ISOLATED_SESSION + "/commit", "isolated:unsupported"),
    *[(method, ISOLATED_SESSION + path, "isolated:unsupported") for method, path, _ in FILE_ROUTES],
]


@dataclass
class ExecdConfig:
    """What `python -m sandgate.execd` was told."""

    token: str | None = None
    root: str | None = None


class ExecdState:
    """What routes share; each part is made on first use (`request.state`)."""

    def __init__(self, config: ExecdConfig) -> None:
        if config.root is not None and not os.path.isdir(config.root):
            raise ValueError(f"--root {config.root!r} is not a directory")
        self.config = config
        self.default_cwd = os.path.realpath(config.root) if config.root else os.getcwd()

    @cached_property
    def resolver(self) -> PathResolver:
        from .paths import PathResolver

        return PathResolver(self.config.root)

    @cached_property
    def state_dir(self) -> str:
        import tempfile

        return tempfile.mkdtemp(prefix="sandgate-execd-")

    @cached_property
    def commands(self) -> CommandRunner:
        from .commands import CommandRunner

        return CommandRunner(self.state_dir, self.default_cwd)

    @cached_property
    def sessions(self) -> Sessions:
        from .sessions import Sessions

        return Sessions(self.commands)

    @cached_property
    def cpu(self) -> CpuSampler:
        from .metrics import CpuSampler

        return CpuSampler()

    def shutdown(self) -> None:
        """Kill every run and session, remove the state directory (only what was ever made)."""
        made = self.__dict__
        if "code_contexts" in made:
            made["code_contexts"].shutdown()
        if "sessions" in made:
            self.sessions.shutdown()
        if "commands" in made:
            self.commands.shutdown()
        if "state_dir" in made:
            import shutil

            shutil.rmtree(self.state_dir, ignore_errors=True)


async def ping(request: Request) -> Response:
    return Response()


class ExecdApp:
    """Request in, response out: token gate, routing, error answers."""

    def __init__(self, config: ExecdConfig) -> None:
        self.state = ExecdState(config)
        self.token = config.token.encode() if config.token else None
        self.router = Router(__package__ or "sandgate.execd", ROUTES)

    async def respond(self, request: Request) -> Response:
        try:
            if self.token is not None and request.path not in OPEN_PATHS:
                self._check_token(request)
            return await self.router.find(request)(request)
        except ApiError as error:
            return error_response(error)
        except Exception as exc:
            import traceback  # not at start-up: it pulls in ast, dis, tokenize...

            traceback.print_exc(file=sys.stderr)
            return json_response(
                {"code": "RUNTIME_ERROR", "message": f"{request.method} {request.path} failed: {exc!r}"}, 500
            )

    def _check_token(self, request: Request) -> None:
        import hmac  # not at start-up: it loads OpenSSL's libcrypto

        given = request.headers.get(TOKEN_HEADER, "").encode("latin-1")
        if not hmac.compare_digest(given, self.token or b""):
            what = "missing" if not given else "wrong"
            raise ApiError(
                401,
                UNAUTHORIZED,
                f"{what} X-EXECD-ACCESS-TOKEN header: this execd requires the sandbox's access token "
                "(the control plane adds it when it proxies; direct clients must send it)",
            )


def create_app(config: ExecdConfig) -> ExecdApp:
    return ExecdApp(config)
