"""No vault call on the proxy's event loop (issue 16): a slow vault stalls nobody else.

The vault is a real OpenBao (`bao server -dev`) behind a real slow path: a TCP relay on loopback
that holds every request chunk for DELAY seconds before passing it on, the way a vault across a
congested WAN link or an overloaded OpenBao answers. The proxy (a real process) must then read
values only in threads: while one request waits for a value the proxy has not read yet, and
while the control plane pushes another sandbox whose values take DELAY to read, requests on
other connections keep their normal latency. Had any hook called the vault on the loop, every
concurrent request would wait DELAY too: the measured maximum would show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import hvac
import pytest

from sandgate.proxy import SandboxEntry
from sandgate.vault import StoreSecrets, StoreSettings
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.openbao import OpenBao, free_port, openbao_dev_server

pytestmark = pytest.mark.root

DELAY = 2.0
OTHER_SANDBOX = "10.213.0.6"  # pushed, never sends: its values are what the control plane waits for
POLICY = {
    "version": 1,
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "api.example.com"},
        {"action": "allow", "target": "plain.example.com"},
    ],
    "bindings": [
        {
            "name": "late",
            "credential": "late-token",
            "match": {"hosts": ["api.example.com"], "schemes": ["http"]},
            "auth": {"type": "bearer"},
        }
    ],
}


@contextlib.contextmanager
def slow_relay(target_port: int) -> Iterator[int]:
    """127.0.0.1:<port> -> 127.0.0.1:target_port, each client chunk held DELAY seconds."""
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pump(reader, upstream_writer, DELAY), pump(upstream_reader, writer, 0))

    stop = asyncio.Event()

    async def serve() -> None:
        async with await asyncio.start_server(handle, "127.0.0.1", port):
            started.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    started.wait(5)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)


@pytest.fixture(scope="module")
def bao() -> Iterator[OpenBao]:
    with openbao_dev_server() as server:
        yield server


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, net: Internet, bao: OpenBao) -> Iterator[RunningProxy]:
    net.set_names({"api.example.com": [ORIGIN_V4], "plain.example.com": [ORIGIN_V4]})
    with slow_relay(int(bao.addr.rsplit(":", 1)[1])) as relay_port:
        vault = StoreSettings(
            backend="openbao",
            state_dir=tmp_path_factory.mktemp("vault"),
            openbao_addr=f"http://127.0.0.1:{relay_port}",
        )
        secrets = StoreSecrets(openbao_token=bao.root_token)
        running = start_proxy(Path(tmp_path_factory.mktemp("proxy")), net, vault=vault, vault_secrets=secrets)
        try:
            yield running
        finally:
            stop_proxy(running)


CONCURRENT = """
import json, threading, time, urllib.request
def get(url, headers=None):
    started = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
        body = r.read()
    return time.monotonic() - started, body
slow = {}
def injected():
    slow["seconds"], body = get("http://api.example.com/echo")
    slow["authorization"] = json.loads(body)["headers"].get("authorization")
thread = threading.Thread(target=injected)
thread.start()
time.sleep(0.2)  # the injected request is now waiting for the vault
lags = []
while thread.is_alive() and len(lags) < 200:
    lags.append(get("http://plain.example.com/")[0])
thread.join()
print(json.dumps({"slow": slow, "lags": lags}))
"""


def test_a_slow_vault_stalls_no_other_request(
    proxy: RunningProxy, client: Client, bao: OpenBao, net: Internet
) -> None:
    proxy.control.put_sandbox(SandboxEntry(sandbox_id="sbx-client", address=CLIENT_ADDR, policy=POLICY))
    # Stored after the push and never signalled: the proxy reads it when a request first needs it.
    hvac.Client(url=bao.addr, token=bao.root_token).secrets.kv.v2.create_or_update_secret(
        path="sandgate/late-token", secret={"value": "late-secret-value-1234"}, mount_point="secret"
    )
    other_policy = {**POLICY, "bindings": [{**POLICY["bindings"][0], "credential": "other-token"}]}  # type: ignore[dict-item]
    other = SandboxEntry(sandbox_id="sbx-other", address=OTHER_SANDBOX, policy=other_policy)
    pushed: dict[str, float] = {}

    def push_other() -> None:  # the control plane's push of another sandbox, also slow to read
        started = time.monotonic()
        proxy.control.put_sandbox(other)
        pushed["seconds"] = time.monotonic() - started

    pusher = threading.Thread(target=push_other)
    pusher.start()
    result = client.python(CONCURRENT, timeout=60)
    pusher.join(30)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    slow, lags = outcome["slow"], outcome["lags"]
    # The slow paths really were slow (positive controls) and the value arrived and was injected.
    assert slow["seconds"] >= DELAY and pushed["seconds"] >= DELAY, (slow, pushed)
    assert slow["authorization"] == "Bearer [REDACTED]"  # echoed back, and scrubbed
    echoed = [r for r in net.origin_requests() if r["path"] == "/echo"]
    assert echoed[-1]["headers"]["authorization"] == "Bearer late-secret-value-1234"  # injected
    # Meanwhile the loop kept serving: many requests, none anywhere near the vault's delay.
    assert len(lags) >= 5 and max(lags) < DELAY / 2, lags
