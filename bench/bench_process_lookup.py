"""What naming a connection's process costs the proxy: one `proxy/origin.py` lookup (sock_diag
in the sandbox's netns, then the socket's holder in /proc), off the event loop, per connection.

Runs as root: a child in a network namespace of its own holds a listener on lo and N client
connections open (N = 4, a sandbox with a few connections, and 400, a busy one); each of its
client sockets is looked up from outside, as the proxy does, and must name the child. Rows:
p50 and p95 of one lookup; the machine's process count is printed (the /proc scan is over them).
SANDGATE_BENCH_PROCESS_LOOKUPS sets the lookups per row (default 400).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench import sized
from bench.sandbox_rig import row, run_as_root_child

CHILD_FLAG = "SANDGATE_BENCH_PROCESS_LOOKUP_CHILD"
LOOKUPS = int(os.environ.get("SANDGATE_BENCH_PROCESS_LOOKUPS", sized("400", "40")))
SOCKETS = (4, 400)
HOLDER = """
import socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1024)
held = []
for _ in range(int(sys.argv[1])):
    held.append(socket.create_connection(listener.getsockname()))
    held.append(listener.accept()[0])
print(listener.getsockname()[1], *(s.getsockname()[1] for s in held[::2]), flush=True)
sys.stdin.read()  # until the benchmark is done
"""


def main() -> None:
    run_as_root_child("bench.bench_process_lookup", CHILD_FLAG, "setns into another network namespace")


def _child() -> None:
    from sandgate.proxy.origin import find

    processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
    print(f"process lookup: {LOOKUPS} lookups per row, {processes} processes on the machine")
    for sockets in SOCKETS:
        holder = subprocess.Popen(
            ["unshare", "-n", sys.executable, "-c", HOLDER, str(sockets)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            port, *sources = (int(word) for word in holder.stdout.readline().split())
            netns = Path(f"/proc/{holder.pid}/ns/net")
            took = []
            for index in range(LOOKUPS):
                started = time.perf_counter()
                found = find(netns, ("127.0.0.1", sources[index % len(sources)]), ("127.0.0.1", port))
                took.append(time.perf_counter() - started)
                assert found.pid == holder.pid, found
            row(f"{sockets} connections open", took)
        finally:
            holder.kill()
            holder.wait()


if __name__ == "__main__":
    if os.environ.get(CHILD_FLAG) == "1":
        _child()
    else:
        main()
