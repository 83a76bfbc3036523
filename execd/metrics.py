"""`/metrics` and `/metrics/watch`: CPU and memory of the sandbox, from /proc.

Rules: CPU use is the busy share of all CPUs between two /proc/stat samples (the previous request's
sample when it is recent, else two samples 100 ms apart); memory used is MemTotal - MemAvailable.
The watch stream sends one bare-JSON frame a second, like the command streams.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from .events import frame, now_ms, sse_response
from .web import Request, Response, json_response

WATCH_INTERVAL_S = 1.0
FRESH_SAMPLE_S = 5.0


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def memory_mib() -> tuple[float, float]:
    info: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0])
    total = info.get("MemTotal", 0)
    return total / 1024, (total - info.get("MemAvailable", info.get("MemFree", 0))) / 1024


class CpuSampler:
    def __init__(self) -> None:
        self.last: tuple[float, int, int] | None = None

    async def used_pct(self) -> float:
        if self.last is None or time.monotonic() - self.last[0] > FRESH_SAMPLE_S:
            self.last = (time.monotonic(), *cpu_times())
            await asyncio.sleep(0.1)
        _, busy0, total0 = self.last
        busy, total = cpu_times()
        self.last = (time.monotonic(), busy, total)
        return round(100.0 * (busy - busy0) / (total - total0), 2) if total > total0 else 0.0


async def snapshot(sampler: CpuSampler) -> dict[str, Any]:
    total, used = memory_mib()
    return {
        "cpu_count": float(len(os.sched_getaffinity(0))),
        "cpu_used_pct": await sampler.used_pct(),
        "mem_total_mib": round(total, 2),
        "mem_used_mib": round(used, 2),
        "timestamp": now_ms(),
    }


async def get_metrics(request: Request) -> Response:
    return json_response(await snapshot(request.state.cpu))


async def watch_metrics(request: Request) -> Response:
    sampler = CpuSampler()

    async def stream() -> AsyncIterator[bytes]:
        while True:
            yield frame(await snapshot(sampler))
            await asyncio.sleep(WATCH_INTERVAL_S)

    return sse_response(stream())
