"""Revocation: a policy change closes the open connections it no longer allows.

Rules:
1. Every open sandbox connection is in `ProxyState.connections` with what was allowed over it
   (`ConnState.targets`: the name, port and scheme of its connection decision and of each
   allowed request; `pins`: the addresses dialled for them) and how to close it (`close`:
   mitmproxy's connection handler is cancelled, a splice is aborted with resets).
2. After every swap of a sandbox table entry (a PUT or DELETE on the control API, in whichever
   proxy process it lands), each connection of that address is judged again against the entry
   now in force (`stale`): a target the policy now denies, a pinned address it now refuses, a
   pass-through connection whose host now needs inspection, or a sandbox that is gone (or is
   another sandbox at the same address) closes the connection. Each is written as a
   `connection` record with `event: "revoked"` (decision `deny`, the new reason and rule).
3. The bound: the table change waits for the revocation to run on the event loop and for every
   revoked connection to be closed (at most CLOSE_WAIT seconds each), so when the control API
   answers the push, no connection the new entry refuses is open any more and no request is
   decided on one. A decision already under way when the entry was swapped (waiting for DNS)
   checks the table again when it lands (`allowed_over`).
4. Allowed connections are not touched: a change that still allows a connection's destinations
   leaves it open (requests on it are judged one by one against the new entry anyway).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable

from mitmproxy import connection, ctx

from sandgate.policy import Reason
from sandgate.proxy.auditing import REVOKED, addr
from sandgate.proxy.contract.audit import AuditRecord
from sandgate.proxy.decide import GONE, Verdict, check_upstream, decide, refusal
from sandgate.proxy.state import ConnState, ProxyState, Sandbox, Target

log = logging.getLogger(__name__)

CLOSE_WAIT = 1.0  # seconds a push waits for each revoked connection to finish closing


Judged = dict[tuple[object, ...], Verdict]  # one pass's decisions, shared by its connections


def stale(
    sandbox: Sandbox | None, conn: ConnState, judged: Judged | None = None
) -> tuple[Verdict, Target | None] | None:
    """Why `conn` may no longer be open under `sandbox` (the entry now in force), or None.
    `judged` keeps the decisions of one pass: connections mostly share their destinations."""
    if sandbox is None or sandbox.id != conn.sandbox_id:
        return GONE, None
    judged = {} if judged is None else judged
    for target in sorted(conn.targets):
        name, port, scheme = target
        verdict = judged.get(target)
        if verdict is None:
            verdict = judged[target] = decide(sandbox.policy, name, port, scheme)  # type: ignore[arg-type]
        if not verdict.allowed:
            return verdict, target
        if conn.passthrough and verdict.inspect:
            return refusal(Reason.NEEDS_INSPECTION, verdict.rule), target
        pinned = conn.pins.get(name)
        if pinned is None:
            continue
        address = judged.get((pinned, port, scheme))
        if address is None:
            address = judged[(pinned, port, scheme)] = check_upstream(sandbox.policy, pinned, port, scheme)
        if not address.allowed:
            return address, target
    return None


def revoke_stale(state: ProxyState, address: str) -> list[Awaitable[object]]:
    """Close every connection of `address` the entry now in force refuses (rule 2); returns
    what to await until they are closed. Runs on the event loop."""
    closing: list[Awaitable[object]] = []
    judged: Judged = {}
    for conn in list(state.connections.values()):
        if conn.sandbox_address == address:
            revoke_if_stale(state, conn, closing, judged)
    return closing


def revoke_if_stale(
    state: ProxyState,
    conn: ConnState,
    closing: list[Awaitable[object]] | None = None,
    judged: Judged | None = None,
) -> Verdict | None:
    """Judge `conn` against the entry now in force; if it is refused, record and close it (what
    to await goes to `closing`) and return the refusal."""
    if conn.revoked or not conn.targets:
        return None
    why = stale(state.table.get(conn.sandbox_address), conn, judged)
    if why is None:
        return None
    conn.revoked = True
    state.metrics.revoked[why[0].reason] += 1
    state.audit.write(revoked_record(conn, *why))
    waiter = conn.close() if conn.close else None
    if waiter is not None and closing is not None:
        closing.append(waiter)
    return why[0]


def revoked_record(conn: ConnState, verdict: Verdict, target: Target | None) -> AuditRecord:
    name, port, scheme = target or (conn.name, None, None)
    pinned = conn.pins.get(name or "") if port else None
    record = AuditRecord.of(
        "connection",
        conn.sandbox_id,
        addr(conn.client) or "-",
        verdict.decision,
        upstream=addr((pinned, port)) if pinned and port else None,
        scheme=scheme,
        host=name,
        port=port,
        event=REVOKED,
        detail=f"policy change: {f'{name}:{port}' if target else 'sandbox'} no longer allowed; "
        "connection closed",
    )
    if conn.decision_record is not None:  # a pass-through connection: tie it to its decision
        record = record.model_copy(update={"id": f"{conn.decision_record.id}-{REVOKED}"})
    return record


def allowed_over(state: ProxyState, conn: ConnState, sandbox: Sandbox, target: Target) -> Verdict | None:
    """Note that `target` was allowed over `conn` by `sandbox`'s entry; if the table changed
    while that was being decided, judge the connection again now (rule 3): the refusal, if the
    connection was revoked."""
    conn.targets.add(target)
    if state.table.get(conn.sandbox_address) is sandbox:
        return None
    return revoke_if_stale(state, conn)


def cancel_connection(client: connection.Client, reason: str) -> asyncio.Task[None] | None:
    """Close a connection mitmproxy is handling the way it closes idle ones: cancel its
    handler (which closes the client and every server connection); the task to await."""
    try:
        handler = ctx.master.addons.get("proxyserver").connections[client.id]
        task: asyncio.Task[None] | None = handler.transports[client].handler
    except (AttributeError, KeyError) as exc:
        log.debug("%s already gone: %r", client.peername, exc)
        return None
    if task is not None:
        task.cancel(reason)
    return task


class Revoker:
    """The table's `on_change` listener in a running proxy: revocation on the event loop, and
    the push that changed the table waits for it (rule 3)."""

    def __init__(self, state: ProxyState, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.loop = loop
        self._loop_thread = threading.get_ident()

    def table_changed(self, address: str) -> None:
        if threading.get_ident() == self._loop_thread:  # a change made on the loop itself
            self.loop.create_task(self._revoke(address))
            return
        done = asyncio.run_coroutine_threadsafe(self._revoke(address), self.loop)
        with contextlib.suppress(concurrent.futures.TimeoutError):
            done.result(CLOSE_WAIT * 2)

    async def _revoke(self, address: str) -> None:
        closing = [asyncio.ensure_future(waiter) for waiter in revoke_stale(self.state, address)]
        if closing:
            await asyncio.wait(closing, timeout=CLOSE_WAIT)
