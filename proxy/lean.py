"""Per-event work mitmproxy does for nothing in this proxy, removed (found with py-spy: see
docs/benchmarks.md, "Profile of the intercepted path").

Rules:
1. Hook dispatch. For every event mitmproxy walks every addon (and its children) with getattr,
   wraps each call in a context manager, rebuilds the hook's argument list per addon, and
   follows every flow hook with an `update` event for its user interfaces. The proxy's addon
   chain is fixed once it runs, so `install` gives the manager a table, event name -> the hook
   functions in chain order, built on first use and dropped whenever an addon is added or
   removed. `update` costs nothing when no addon has it (none of ours does). As in mitmproxy, an
   addon's exception is logged and the next addon runs, and `AddonHalt` stops the event.
2. Type checks of HTTP messages. mitmproxy checks the type of every field of every Request and
   Response it builds (only in `__debug__` builds; `python -O` would also strip our own asserts).
   The values come from its own parsers or through its own setters, so the check goes.
3. Task names. Every task mitmproxy creates (several per request) reads an environment variable
   to say which pytest test created it; the name is kept, the lookup goes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from mitmproxy import exceptions, flow, hooks, http
from mitmproxy.addonmanager import AddonManager, traverse
from mitmproxy.utils import asyncio_utils

log = logging.getLogger(__name__)


def install(manager: AddonManager) -> None:
    """Replace the manager's event dispatch (rule 1) and mitmproxy's message checks (rule 2)."""
    http.MessageData.__post_init__ = _unchecked  # type: ignore[method-assign]
    asyncio_utils.set_task_debug_info = _task_debug_info
    table: dict[str, list[Callable[..., Any]]] = {}

    def hooks_for(name: str) -> list[Callable[..., Any]]:
        found = table.get(name)
        if found is None:
            found = table[name] = [
                func for addon in traverse(manager.chain) if callable(func := getattr(addon, name, None))
            ]
        return found

    async def trigger_event(event: hooks.Hook) -> None:
        functions = hooks_for(event.name)
        if not functions:
            return
        args = event.args()
        for function in functions:
            try:
                result = function(*args)
                if result is not None and inspect.isawaitable(result):
                    await result
            except exceptions.AddonHalt:
                return
            except exceptions.OptionsError:
                raise
            except Exception as exc:
                log.error("Addon error: %s", exc, exc_info=True)

    async def handle_lifecycle(event: hooks.Hook) -> None:
        await trigger_event(event)
        if hooks_for("update") and isinstance(message := event.args()[0], flow.Flow):
            await trigger_event(hooks.UpdateHook([message]))

    def invalidating(change: Callable[..., Any]) -> Callable[..., Any]:
        def changed(*addons: Any) -> Any:
            table.clear()
            try:
                return change(*addons)
            finally:
                table.clear()

        return changed

    manager.trigger_event = trigger_event  # type: ignore[method-assign]
    manager.handle_lifecycle = handle_lifecycle  # type: ignore[method-assign]
    manager.add = invalidating(manager.add)  # type: ignore[method-assign]
    manager.remove = invalidating(manager.remove)  # type: ignore[method-assign]


def _unchecked(self: http.MessageData) -> None:
    """In place of `MessageData.__post_init__` (rule 2)."""


def _task_debug_info(task: asyncio.Task[Any], *, name: str, client: tuple[Any, ...] | None = None) -> None:
    """`asyncio_utils.set_task_debug_info` without its environment lookup (rule 3)."""
    task.created = time.time()  # type: ignore[attr-defined]
    task.set_name(name)
    if client:
        task.client = client  # type: ignore[attr-defined]
