"""`python -m sandgate.execd --host H --port P [--token T] [--root DIR]` (also `sandgate-execd`).

Rules: start-up is the sandbox's time to ready, so this imports only the app core (see app.py)
and the small asyncio + h11 server (web.py); SIGTERM/SIGINT stop accepting, cancel open
connections, kill every run and session and remove execd's temp directory.
Before anything else execd makes itself non-dumpable: the commands it runs share its uid, and
without CAP_SYS_PTRACE they can then neither ptrace it nor read its /proc memory, environ or fds
(where a client's headers and execd's token live). Its children become dumpable again at exec.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal

from .app import ExecdApp, ExecdConfig
from .entrypoint import Entrypoint
from .web import serve


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sandgate-execd", description="OpenSandbox-compatible execd")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=44772, help="port to listen on (default 44772)")
    parser.add_argument(
        "--token",
        default=os.environ.get("EXECD_ACCESS_TOKEN"),
        help="require this X-EXECD-ACCESS-TOKEN on every route but /ping (default: $EXECD_ACCESS_TOKEN)",
    )
    parser.add_argument("--root", help="resolve every file path under DIR; paths may never leave it")
    parser.add_argument(
        "--entrypoint-pid",
        type=int,
        help="(the launcher's) pid of the entrypoint it started: execd reaps it, reports its end, "
        "and stops with its status if it fails (entrypoint.py)",
    )
    parser.add_argument("--entrypoint", default="the entrypoint", help="its path, for that report")
    return parser.parse_args(argv)


async def run(app: ExecdApp, host: str, port: int, entrypoint: Entrypoint | None = None) -> int:
    """Serve until stopped; the exit status: the entrypoint's if it failed, else 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if entrypoint is not None:
        entrypoint.watch(loop, stop.set)
    try:
        await serve(app.respond, app.state, host, port, stop)
    finally:
        app.state.shutdown()
    return (entrypoint.status or 0) if entrypoint is not None else 0


PR_SET_DUMPABLE = 4


def become_undumpable() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        error = os.strerror(ctypes.get_errno())
        raise SystemExit(f"sandgate-execd: prctl(PR_SET_DUMPABLE, 0) failed: {error}")


def main(argv: list[str] | None = None) -> None:
    become_undumpable()
    args = parse_args(argv)
    if args.root and not os.path.isdir(args.root):
        raise SystemExit(f"sandgate-execd: --root {args.root!r} is not a directory")
    app = ExecdApp(ExecdConfig(token=args.token or None, root=args.root))
    entrypoint = Entrypoint(args.entrypoint_pid, args.entrypoint) if args.entrypoint_pid else None
    status = asyncio.run(run(app, args.host, args.port, entrypoint))
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
