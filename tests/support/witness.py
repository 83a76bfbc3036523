"""Kernel-side witnesses in a namespace the tests created: what reached it, counted by nftables,
whatever the proxy says.

Rules: `origin_syns(netns)` adds one nft table (`sandgate_test_witness`) to that namespace for as
long as the `with` block runs and deletes it after, also when the block fails; the namespace's
own teardown would remove it too. It counts TCP SYNs (a new connection, not a retransmitted
segment of an old one) to one port, so a test can say "no connection reached the origin".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

WITNESS_TABLE = "sandgate_test_witness"


class SynCounter:
    def __init__(self, netns: str) -> None:
        self.netns = netns

    def nft(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, "nft", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def count(self) -> int:
        """SYNs counted so far."""
        listing = json.loads(self.nft("-j", "list", "table", "inet", WITNESS_TABLE))
        return sum(
            expr["counter"]["packets"]
            for item in listing["nftables"]
            if "rule" in item
            for expr in item["rule"]["expr"]
            if "counter" in expr
        )


@contextmanager
def origin_syns(netns: str, port: int = 443) -> Iterator[SynCounter]:
    """Count TCP SYNs to `port` arriving in `netns` while the block runs."""
    counter = SynCounter(netns)
    counter.nft(
        "-f",
        "-",
        stdin=f"table inet {WITNESS_TABLE} {{ chain input {{ type filter hook input priority 0; "
        f"tcp dport {port} tcp flags & (syn | ack) == syn counter; }}; }}",
    )
    try:
        yield counter
    finally:
        subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", WITNESS_TABLE],
            capture_output=True,
        )
