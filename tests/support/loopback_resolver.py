"""A UDP resolver stand-in on 127.0.0.1:<port>, for the proxy's `upstream_dns`: a thread hands
each question to `answer`, which a test's subclass defines (stay silent, relay, count)."""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class LoopbackResolver:
    """Use as a context manager: the thread runs between enter and exit."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)  # how soon the thread sees `stop`
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def answer(self, query: bytes, client: tuple[str, int]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                query, client = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            self.answer(query, client)

    def __enter__(self) -> LoopbackResolver:
        self.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
