"""The execd HTTP app: the route table, the access token, error answers, startup and shutdown.

Rules: execd imports nothing of sandgate (it runs inside the sandbox) and stays light: Starlette
and pydantic, not FastAPI, because it must answer `/ping` well under a second after it starts.
With a token configured, every route but `/ping` needs `X-EXECD-ACCESS-TOKEN` (compared in
constant time); a missing or wrong token is a 401 before the route runs.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from . import commands, files, metrics, sessions, transfer
from .errors import UNAUTHORIZED, ApiError
from .paths import PathResolver

TOKEN_HEADER = b"x-execd-access-token"
OPEN_PATHS = frozenset({"/ping"})


@dataclass
class ExecdConfig:
    """What `python -m sandgate.execd` was told."""

    token: str | None = None
    root: str | None = None


class TokenGate:
    """ASGI middleware: every route except /ping needs the access token when one is configured."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(TOKEN_HEADER, b"")
        if not hmac.compare_digest(given, self.token):
            what = "missing" if not given else "wrong"
            answer = ApiError(
                401,
                UNAUTHORIZED,
                f"{what} X-EXECD-ACCESS-TOKEN header: this execd requires the sandbox's access token "
                "(the control plane adds it when it proxies; direct clients must send it)",
            )
            await answer.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def ping(request: Request) -> Response:
    return Response(status_code=200)


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def unexpected_error(request: Request, exc: Exception) -> Response:
    return JSONResponse(
        {"code": "RUNTIME_ERROR", "message": f"{request.method} {request.url.path} failed: {exc!r}"}, 500
    )


def routes() -> list[Route]:
    return [
        Route("/ping", ping, methods=["GET"]),
        Route("/command", commands.run_command, methods=["POST"]),
        Route("/command", commands.interrupt_command, methods=["DELETE"]),
        Route("/command/status/{id}", commands.command_status, methods=["GET"]),
        Route("/command/{id}/logs", commands.command_logs, methods=["GET"]),
        Route("/session", sessions.create_session, methods=["POST"]),
        Route("/session/{session_id}/run", sessions.run_in_session, methods=["POST"]),
        Route("/session/{session_id}", sessions.delete_session, methods=["DELETE"]),
        Route("/metrics", metrics.get_metrics, methods=["GET"]),
        Route("/metrics/watch", metrics.watch_metrics, methods=["GET"]),
        Route("/files/upload", transfer.upload, methods=["POST"]),
        Route("/files/download", transfer.download, methods=["GET"]),
        Route("/files/info", files.files_info, methods=["GET"]),
        Route("/files", files.remove_files, methods=["DELETE"]),
        Route("/files/mv", files.move_files, methods=["POST"]),
        Route("/files/permissions", files.chmod_files, methods=["POST"]),
        Route("/files/search", files.search_files, methods=["GET"]),
        Route("/files/replace", files.replace_content, methods=["POST"]),
        Route("/directories/list", files.list_directory, methods=["GET"]),
        Route("/directories", files.make_dirs, methods=["POST"]),
        Route("/directories", files.remove_dirs, methods=["DELETE"]),
    ]


def create_app(config: ExecdConfig) -> ASGIApp:
    resolver = PathResolver(config.root)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state_dir = tempfile.mkdtemp(prefix="sandgate-execd-")
        app.state.resolver = resolver
        app.state.commands = commands.CommandRunner(state_dir, resolver.root if config.root else os.getcwd())
        app.state.sessions = sessions.Sessions(app.state.commands)
        app.state.cpu = metrics.CpuSampler()
        try:
            yield
        finally:
            app.state.sessions.shutdown()
            app.state.commands.shutdown()
            shutil.rmtree(state_dir, ignore_errors=True)

    app = Starlette(
        routes=routes(),
        lifespan=lifespan,
        exception_handlers={ApiError: api_error, Exception: unexpected_error},
    )
    return TokenGate(app, config.token) if config.token else app
