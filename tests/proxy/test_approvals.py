"""The proxy's hold on requests a policy `ask`s about (proxy/approvals.py), on a real event loop:
answered from another thread (as the control API's handlers are), timed out, refused when the
sandbox's queue is full, refused when the sandbox is dropped, and ended when its client leaves."""

from __future__ import annotations

import asyncio
import threading

from sandgate.policy import Decision, Reason, RequestIdentity
from sandgate.proxy.approvals import Approvals, Held

ASKED = Decision("deny", Reason.ASK, "p.yaml:3", True)


def identity(path: str = "/x?token=secret") -> RequestIdentity:
    return RequestIdentity("https", "new.example.test", 443, "GET", path)


async def hold(approvals: Approvals, sandbox: str, timeout: float, seen: list[Held]) -> Decision:
    return await approvals.ask(sandbox, "client-1", identity(), ASKED, timeout, seen.append)


def test_an_answer_from_another_thread_releases_the_request() -> None:
    async def scenario() -> Decision:
        approvals, seen = Approvals(), []
        waiting = asyncio.create_task(hold(approvals, "sbx-1", 30, seen))
        while not seen:
            await asyncio.sleep(0)
        listed = approvals.pending()
        assert [(h["id"], h["path"], h["rule"]) for h in listed] == [
            (seen[0].id, "/x?<redacted>", "p.yaml:3")
        ]
        answering = threading.Thread(target=approvals.answer, args=(seen[0].id, True, "reviewer-1"))
        answering.start()
        answering.join()
        decision = await waiting
        assert approvals.pending() == [] and not approvals.answer(seen[0].id, True, "late")
        return decision

    decision = asyncio.run(scenario())
    assert (decision.action, decision.reason, decision.detail) == (
        "allow",
        Reason.APPROVED,
        "approved by reviewer-1",
    )
    assert decision.bindings == ()  # an approved request carries no credential


def test_a_request_nobody_answers_is_refused_at_its_timeout() -> None:
    decision = asyncio.run(hold(Approvals(), "sbx-1", 0.05, []))
    assert (decision.action, decision.reason) == ("deny", Reason.APPROVAL_TIMEOUT)


def test_a_full_queue_refuses_at_once_and_other_sandboxes_still_ask() -> None:
    async def scenario() -> tuple[Decision, int]:
        approvals, seen = Approvals(per_sandbox=2), []
        waiting = [asyncio.create_task(hold(approvals, "sbx-1", 30, seen)) for _ in range(2)]
        while len(seen) < 2:
            await asyncio.sleep(0)
        refused = await hold(approvals, "sbx-1", 30, seen)
        other = asyncio.create_task(hold(approvals, "sbx-2", 30, seen))
        while len(seen) < 3:
            await asyncio.sleep(0)
        approvals.drop_sandbox("sbx-1")
        dropped = await asyncio.gather(*waiting)
        assert all(d.reason == Reason.APPROVAL_DENIED and "dropped" in (d.detail or "") for d in dropped)
        held = len(approvals.pending())
        other.cancel()
        return refused, held

    refused, held = asyncio.run(scenario())
    assert (refused.action, refused.reason) == ("deny", Reason.APPROVAL_QUEUE_FULL)
    assert held == 1  # sbx-2's request still waits


def test_a_client_that_leaves_ends_only_its_own_holds() -> None:
    async def scenario() -> tuple[Decision, int, bool, str]:
        approvals, seen = Approvals(), []
        leaving = asyncio.create_task(hold(approvals, "sbx-1", 30, seen))
        staying = asyncio.create_task(approvals.ask("sbx-1", "client-2", identity(), ASKED, 30, seen.append))
        while len(seen) < 2:
            await asyncio.sleep(0)
        approvals.client_left("client-1")
        decision = await leaving
        held = len(approvals.pending())
        late = approvals.answer(seen[0].id, True, "reviewer-1")
        staying.cancel()
        return decision, held, late, seen[0].id

    decision, held, late, approval_id = asyncio.run(scenario())
    assert (decision.action, decision.reason) == ("deny", Reason.APPROVAL_CLIENT_GONE)
    assert decision.detail == f"approval {approval_id}: the client went away before an answer"
    assert held == 1 and late is False  # the other client's request still waits
