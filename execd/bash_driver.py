"""The bash side of a code context: one persistent `bash` whose state carries from cell to cell.

Rules (the protocol is repl_driver.py's; its docstring is the reference):
1. execd starts this script with its own Python (`-I`: standard library only, nothing of execd
   on sys.path). It runs `bash --noprofile --norc` in the same process group, with the same
   stdout and stderr (the pipes execd reads), so output streams as it is written.
2. A cell is written to a file and sourced (`. FILE < /dev/null`), so a syntax error fails that
   cell only; variables, functions, `cd` and exported names persist. The cell's exit status
   comes back on a private pipe. A non-zero status is the cell's error, as the Jupyter bash
   kernel reports it: `{ename: "", evalue: "<status>", traceback: []}`.
3. SIGINT (execd's interrupt) reaches the whole group: the running command dies and bash's
   `trap 'return 130' INT` abandons the rest of the cell (status 130); bash and its state
   survive. If bash itself exits (`exit` in a cell), the cell fails with its status and a
   fresh bash is started for the next cell (state is lost, as with the Jupyter bash kernel).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile

HEADER = struct.Struct(">I")


class BashDriver:
    def __init__(self, channel: socket.socket, marker: bytes) -> None:
        self.channel = channel
        self.marker = marker
        self.cells = tempfile.mkdtemp(prefix="execd-bash-cells-")
        self.start_bash()

    def start_bash(self) -> None:
        self.status_r, status_w = os.pipe()
        self.bash = subprocess.Popen(
            [shutil.which("bash") or "/bin/bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            pass_fds=(status_w,),
        )
        os.close(status_w)
        self.status_fd = status_w
        self.status = os.fdopen(self.status_r, "rb")
        self.command("trap 'return 130 2>/dev/null' INT")

    def command(self, text: str) -> None:
        assert self.bash.stdin is not None
        self.bash.stdin.write(text.encode() + b"\n")
        self.bash.stdin.flush()

    def run_cell(self, code: str, count: int) -> dict | None:
        cell = os.path.join(self.cells, f"cell-{count}.sh")
        with open(cell, "w", encoding="utf-8") as handle:
            handle.write(code + "\n")
        try:
            self.command(f". {quote(cell)} < /dev/null; printf '%d\\n' $? >&{self.status_fd}")
            line = self.status.readline()
        except BrokenPipeError:
            line = b""
        finally:
            os.unlink(cell)
        if not line:  # bash exited during the cell
            returncode = self.bash.wait()
            self.status.close()
            self.start_bash()
            status = 128 - returncode if returncode < 0 else returncode
            return {"ename": "", "evalue": str(status), "traceback": []}
        status = int(line)
        return None if status == 0 else {"ename": "", "evalue": str(status), "traceback": []}

    def serve(self) -> None:
        self.send({"op": "ready", "pid": os.getpid(), "bash": self.bash.pid})
        while (request := self.receive()) is not None:
            if request.get("op") == "run":
                error = self.run_cell(request["code"], int(request["count"]))
                for fd in (1, 2):
                    os.write(fd, self.marker)
                self.send({"op": "done", "error": error})

    def send(self, message: dict) -> None:
        data = json.dumps(message).encode()
        self.channel.sendall(HEADER.pack(len(data)) + data)

    def receive(self) -> dict | None:
        header = self.read_exactly(HEADER.size)
        body = self.read_exactly(HEADER.unpack(header)[0]) if header else None
        return None if body is None else json.loads(body)

    def read_exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = self.channel.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data


def quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def main() -> None:
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # meant for bash and its command
    channel = socket.socket(fileno=int(sys.argv[1]))
    driver = BashDriver(channel, sys.argv[2].encode())
    try:
        driver.serve()
    finally:
        driver.bash.kill()
        shutil.rmtree(driver.cells, ignore_errors=True)


if __name__ == "__main__":
    main()
