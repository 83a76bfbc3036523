"""Requests held for a reviewer (`action: ask`): the proxy's side of approvals.

Rules:
1. A request the policy answers `ask` (`Reason.ASK`) is held in the enforcement addon's request
   hook, before any upstream connection is made for it, until a reviewer answers through the
   control API (`ROUTES.answer_approval`), the policy's `askTimeout` passes, the sandbox is
   dropped, or its client closes the connection (`client_left`). Nothing of it leaves meanwhile;
   the client waits on its connection (DNS for an `ask` name is answered: the connection-level
   decision is "allow, inspect").
2. Bounded: a sandbox holds at most `HELD_PER_SANDBOX` requests; the next is refused at once
   (`Reason.APPROVAL_QUEUE_FULL`), so a sandbox cannot pile up held connections.
3. The answer becomes the request's decision, which its audit record serialises: `approved`
   (allowed once; the detail says who answered) or `approval-denied` / `approval-timeout` /
   `approval-client-gone` (the client closed its connection while held: the hold ends at once,
   the detail names the approval, and a later answer finds nothing held, rule 4).
   When a request is held, a security_event `approval-requested` names the approval id, so a
   reviewer following `sandgate logs -f` sees it at once.
4. Answers arrive on the control API's threads; they reach the event loop through
   `call_soon_threadsafe`, and an answer for an id that is no longer held is `False` (404).
5. An approval carries no credential: an approved request is forwarded as it came, without
   injection (a binding applies to what the policy allows, not to what a reviewer let through once).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandgate.policy import Decision, Reason, RequestIdentity
from sandgate.proxy.contract.audit import redact_path

HELD_PER_SANDBOX = 16
REQUESTED = "approval-requested"  # the `event` of the security_event written when a request is held


@dataclass(frozen=True)
class Answer:
    allow: bool
    by: str
    client_left: bool = False


@dataclass
class Held:
    id: str
    sandbox_id: str
    client_id: str  # mitmproxy's id of the client connection the request came on
    identity: RequestIdentity
    rule: str | None
    requested_at: float
    expires_at: float
    answer: asyncio.Future[Answer] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        identity = self.identity
        return {
            "id": self.id,
            "sandbox": self.sandbox_id,
            "method": identity.method,
            "scheme": identity.scheme,
            "host": identity.host,
            "port": identity.port,
            "path": redact_path(identity.path),
            "rule": self.rule,
            "requested_at": self.requested_at,
            "expires_at": self.expires_at,
        }


class Approvals:
    """Every request this proxy process holds, by approval id."""

    def __init__(self, per_sandbox: int = HELD_PER_SANDBOX) -> None:
        self.per_sandbox = per_sandbox
        self._held: dict[str, Held] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def pending(self) -> list[dict[str, Any]]:
        return [held.to_json() for held in list(self._held.values())]

    async def ask(
        self,
        sandbox_id: str,
        client_id: str,
        identity: RequestIdentity,
        asked: Decision,
        timeout: float,
        announce: Callable[[Held], None],
    ) -> Decision:
        """Hold the request until it is answered (rule 1) and return the decision it then gets;
        `announce` is called once it is held (rule 3)."""
        self._loop = asyncio.get_running_loop()
        if sum(held.sandbox_id == sandbox_id for held in self._held.values()) >= self.per_sandbox:
            detail = f"{self.per_sandbox} requests of this sandbox already wait for a reviewer"
            return Decision("deny", Reason.APPROVAL_QUEUE_FULL, asked.rule, True, detail=detail)
        now = time.time()
        held = Held(os.urandom(8).hex(), sandbox_id, client_id, identity, asked.rule, now, now + timeout,
                    self._loop.create_future())  # fmt: skip
        self._held[held.id] = held
        announce(held)
        return await self._outcome(held, timeout)

    async def _outcome(self, held: Held, timeout: float) -> Decision:
        try:
            answer = await asyncio.wait_for(asyncio.shield(held.answer), timeout)
        except TimeoutError:
            detail = f"no reviewer answered within {timeout:g} s (askTimeout)"
            return Decision("deny", Reason.APPROVAL_TIMEOUT, held.rule, True, detail=detail)
        finally:
            self._held.pop(held.id, None)
        if answer.client_left:
            detail = f"approval {held.id}: the client went away before an answer"
            return Decision("deny", Reason.APPROVAL_CLIENT_GONE, held.rule, True, detail=detail)
        if answer.allow:
            return Decision("allow", Reason.APPROVED, held.rule, True, detail=f"approved by {answer.by}")
        return Decision("deny", Reason.APPROVAL_DENIED, held.rule, True, detail=f"refused by {answer.by}")

    def answer(self, approval_id: str, allow: bool, by: str) -> bool:
        """Answer a held request from any thread (rule 4); False if it is not held (any more)."""
        held = self._held.get(approval_id)
        if held is None or self._loop is None:
            return False
        self._loop.call_soon_threadsafe(_settle, held.answer, Answer(allow, by))
        return True

    def drop_sandbox(self, sandbox_id: str) -> None:
        """The sandbox is gone: its held requests are refused (from any thread)."""
        for held in list(self._held.values()):
            if held.sandbox_id == sandbox_id and self._loop is not None:
                gone = Answer(False, "sandgate (the sandbox was dropped)")
                self._loop.call_soon_threadsafe(_settle, held.answer, gone)

    def client_left(self, client_id: str) -> None:
        """The client connection closed (on the event loop): its held requests end now (rule 3)."""
        for held in list(self._held.values()):
            if held.client_id == client_id:
                _settle(held.answer, Answer(False, "sandgate", client_left=True))


def _settle(future: asyncio.Future[Answer], answer: Answer) -> None:
    if not future.done():
        future.set_result(answer)
