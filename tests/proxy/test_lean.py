"""proxy/lean.py: the table dispatch of hook events behaves as mitmproxy's own does (order,
async hooks, a failing addon logged and skipped, AddonHalt, addons added later), skips `update`
when nobody listens, and HTTP messages are no longer type-checked field by field."""

from __future__ import annotations

import asyncio
import logging

import pytest
from mitmproxy import exceptions, hooks, http
from mitmproxy.addonmanager import AddonManager
from mitmproxy.master import Master
from mitmproxy.options import Options
from mitmproxy.proxy.layers.http import HttpRequestHook
from mitmproxy.test import tflow

from sandgate.proxy import lean


class Recorder:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def request(self, flow: http.HTTPFlow) -> None:
        self.calls.append(f"{self.name}:request")


class AsyncRecorder(Recorder):
    async def request(self, flow: http.HTTPFlow) -> None:
        await asyncio.sleep(0)
        self.calls.append(f"{self.name}:async-request")


class Failing:
    def request(self, flow: http.HTTPFlow) -> None:
        raise ValueError("addon bug")


class Halting:
    def request(self, flow: http.HTTPFlow) -> None:
        raise exceptions.AddonHalt


class Updates(Recorder):
    def update(self, flows: list[object]) -> None:
        self.calls.append(f"{self.name}:update")


def manager(*addons: object) -> AddonManager:
    """mitmproxy's own test master with the lean dispatch, then the addons added."""
    addon_manager = Master(Options(), event_loop=asyncio.new_event_loop()).addons
    lean.install(addon_manager)
    addon_manager.add(*addons)
    return addon_manager


def fire(addon_manager: AddonManager, hook: hooks.Hook) -> None:
    loop = addon_manager.master.event_loop
    try:
        loop.run_until_complete(addon_manager.handle_lifecycle(hook))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())


def test_hooks_run_in_chain_order_and_async_hooks_are_awaited() -> None:
    calls: list[str] = []
    addon_manager = manager(Recorder("a", calls), AsyncRecorder("b", calls), Recorder("c", calls))
    fire(addon_manager, HttpRequestHook(tflow.tflow()))
    assert calls == ["a:request", "b:async-request", "c:request"]


def test_a_failing_addon_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    addon_manager = manager(Failing(), Recorder("after", calls))
    with caplog.at_level(logging.ERROR, logger="sandgate.proxy.lean"):
        fire(addon_manager, HttpRequestHook(tflow.tflow()))
    assert calls == ["after:request"]
    assert "addon bug" in caplog.text


def test_addon_halt_stops_the_event() -> None:
    calls: list[str] = []
    addon_manager = manager(Recorder("before", calls), Halting(), Recorder("after", calls))
    fire(addon_manager, HttpRequestHook(tflow.tflow()))
    assert calls == ["before:request"]


def test_update_follows_flow_hooks_only_when_an_addon_has_it() -> None:
    calls: list[str] = []
    addon_manager = manager(Recorder("a", calls))
    fire(addon_manager, HttpRequestHook(tflow.tflow()))
    assert calls == ["a:request"]
    addon_manager.add(Updates("u", calls))  # the table is rebuilt: the new addon is seen
    fire(addon_manager, HttpRequestHook(tflow.tflow()))
    assert calls == ["a:request", "a:request", "u:request", "u:update"]


def test_removed_addons_are_not_called() -> None:
    calls: list[str] = []
    gone = Recorder("gone", calls)
    addon_manager = manager(gone, Recorder("kept", calls))
    fire(addon_manager, HttpRequestHook(tflow.tflow()))
    addon_manager.remove(gone)
    fire(addon_manager, HttpRequestHook(tflow.tflow()))
    assert calls == ["gone:request", "kept:request", "kept:request"]


def test_messages_are_not_type_checked_field_by_field() -> None:
    manager()
    request = http.Request.make("GET", "https://example.com/")
    assert request.host == "example.com"  # built as before, by mitmproxy's own constructors
    data = http.RequestData(**{**request.data.__dict__, "port": "not a port"})  # type: ignore[arg-type]
    assert data.port == "not a port"  # mitmproxy's check would have raised TypeError


def test_task_names_no_longer_read_the_environment() -> None:
    from mitmproxy.utils import asyncio_utils

    manager()

    async def named() -> str:
        task = asyncio_utils.create_task(
            asyncio.sleep(0), name="hook", keep_ref=False, client=("10.0.0.1", 1)
        )
        await task
        return task.get_name()

    # pytest sets PYTEST_CURRENT_TEST; mitmproxy's own version appends it to every task's name
    assert asyncio.run(named()) == "hook"
