"""A running server hears of `sandgate vault put` and `rm` at once, for the proxies it pushes
values to (each Kubernetes node's, lifecycle/node_client.py): a stored or rotated value is
injected and scrubbed on every node that holds a sandbox bound to it, and a removed one is gone
there, before the command returns.

Rules:
1. The server listens on a Unix socket in its state dir (`notice_socket`, mode 0600, owner
   only): whoever may connect may already read the vault beside it, so it asks no token. It
   listens only when it pushes values to nodes; the local proxy reads the vault itself and is
   told by the command directly (lifecycle/cli/groups/vault.py).
2. One notice per connection: a JSON line `{"changed": [names]}`; the answer, a JSON line, comes
   once every sandbox whose entry reads one of the names was pushed again (`{"pushed": n}`) or
   says why not (`{"error": "..."}`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

NOTICE_TIMEOUT = 120.0  # a push per sandbox reading the name, each a round trip to its node
MAX_NOTICE = 1 << 16


def notice_socket(state_dir: Path) -> Path:
    return state_dir / "vault-notices.sock"


class VaultNoticeError(RuntimeError):
    """The server did not confirm the push; the message says why."""


class VaultNotices:
    """The server's listener: `on_change(names)` pushes and returns how many sandboxes it pushed."""

    def __init__(self, state_dir: Path, on_change: Callable[[list[str]], int]) -> None:
        self.path = notice_socket(state_dir)
        self.on_change = on_change
        self._server: socketserver.ThreadingUnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.path.unlink(missing_ok=True)  # a crashed server's; the state lock says we own the dir
        notices = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.wfile.write(json.dumps(notices.answer(self.rfile.readline(MAX_NOTICE))).encode() + b"\n")

        self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        os.chmod(self.path, 0o600)  # before serving; the state dir (0700) keeps others out meanwhile
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="vault-notices", daemon=True)
        self._thread.start()

    def answer(self, line: bytes) -> dict[str, object]:
        try:
            names = json.loads(line)["changed"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError("`changed` must be a list of names")
        except (ValueError, KeyError, TypeError) as exc:
            return {"error": f'a notice is one JSON line {{"changed": [names]}} ({exc})'}
        try:
            return {"pushed": self.on_change(names)}
        except Exception as exc:  # the command says it; the server goes on
            log.exception("pushing vault entries %s again failed", names)
            return {"error": f"{type(exc).__name__}: {exc}"}

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.path.unlink(missing_ok=True)


def tell_server(state_dir: Path, names: list[str]) -> int | None:
    """Tell the server of `state_dir` that `names` changed; how many sandboxes it pushed again,
    or None when no server listens there (rule 1). Raises VaultNoticeError when it did not push."""
    path = notice_socket(state_dir)
    if not path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(NOTICE_TIMEOUT)
        try:
            sock.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # a socket file left by a server that is gone
        with contextlib.closing(sock.makefile("rwb")) as stream:
            stream.write(json.dumps({"changed": names}).encode() + b"\n")
            stream.flush()
            line = stream.readline(MAX_NOTICE)
    answer = json.loads(line) if line else {"error": "the server closed the connection"}
    if "error" in answer:
        raise VaultNoticeError(str(answer["error"]))
    return int(answer["pushed"])
