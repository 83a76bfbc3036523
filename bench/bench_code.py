"""Code contexts through the host hop: context create time and the round trip of a trivial cell.

Runs as root in a network namespace of its own (the module re-executes itself after unshare):
one real `sandgate serve` (tests.support.server) and one real `sandgate/host` sandbox, reached
through serve's reverse proxy (the execd endpoint handed to the SDKs) on one keep-alive client.
Rows: `POST /code/context` for python and bash (the context deleted after) in a sandbox without
spare kernels (`EXECD_SPARE_KERNELS=0`: a kernel start each) and in one with them (execd's
default: each create takes the spare the one before left, `SPARE_WAIT_S` later, as after a
user's pause), and `POST /code` `1 + 1` in one python context (up to the last event), after 10
warm-up cells. SANDGATE_BENCH_CODE_RUNS sets the cell round trips (default 200); context creates
are a tenth.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from bench import sized
from bench.sandbox_rig import enter_own_netns, row, run_as_root_child

if TYPE_CHECKING:
    from tests.support.server import SandgateServer

CHILD_FLAG = "SANDGATE_BENCH_CODE_CHILD"
RUNS = int(os.environ.get("SANDGATE_BENCH_CODE_RUNS", sized(200, 3)))
CREATES = max(sized(3, 1), RUNS // 10)
WARM_UP = sized(10, 1)
SPARE_WAIT_S = sized(5.0, 1.0)  # a kernel's start under load is 1-4 s: the spare is ready by then


def main() -> None:
    run_as_root_child("bench.bench_code", CHILD_FLAG, "netns, nftables, mounts")


def _create(client: httpx.Client, language: str) -> tuple[str, float]:
    began = time.perf_counter()
    response = client.post("/code/context", json={"language": language})
    took = time.perf_counter() - began
    response.raise_for_status()
    return response.json()["id"], took


def _cell(client: httpx.Client, context_id: str, code: str) -> bytes:
    body = {"code": code, "context": {"id": context_id, "language": "python"}}
    with client.stream("POST", "/code", json=body) as response:
        response.raise_for_status()
        return b"".join(response.iter_raw())


def _execd(server: SandgateServer, env: dict[str, str]) -> httpx.Client:
    sandbox_id = server.create_sandbox(env=env)["id"]
    with server.client() as api:
        found = api.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772").json()
    return httpx.Client(
        base_url=f"http://{found['endpoint']}", headers=found["headers"], timeout=120, trust_env=False
    )


def _creates(client: httpx.Client, pause: float) -> dict[str, list[float]]:
    creates: dict[str, list[float]] = {"python": [], "bash": []}
    for _ in range(CREATES):
        for language, times in creates.items():
            context_id, took = _create(client, language)
            times.append(took)
            client.delete(f"/code/contexts/{context_id}").raise_for_status()
            time.sleep(pause)
    return creates


def _child() -> None:
    enter_own_netns()
    from tests.support.server import sandgate_server

    with (
        tempfile.TemporaryDirectory(prefix="sandgate-bench-code-") as temp,
        sandgate_server(Path(temp)) as server,
    ):
        with _execd(server, {"EXECD_SPARE_KERNELS": "0"}) as client:
            cold = _creates(client, pause=0.0)
        with _execd(server, {}) as client:
            spare = _creates(client, pause=SPARE_WAIT_S)
            context_id, _ = _create(client, "python")
            for _ in range(WARM_UP):
                assert b'"text":"2"' in _cell(client, context_id, "1 + 1")
            cells = []
            for _ in range(RUNS):
                began = time.perf_counter()
                _cell(client, context_id, "1 + 1")
                cells.append(time.perf_counter() - began)
    print(f"code contexts through sandgate serve's host endpoint; load average {os.getloadavg()[0]:.1f}")
    for language in ("python", "bash"):
        row(f"create {language}, no spare", cold[language])
        row(f"create {language}, spare", spare[language])
    row("cell `1 + 1` round trip", cells)


if __name__ == "__main__":
    if os.environ.get(CHILD_FLAG) == "1":
        _child()
    else:
        main()
