"""A sandbox's state as the control plane keeps it: the values it takes and its moves, one table.

Rules: a record changes state only by a move in `MOVES` (`SandboxRecord.moved`); a move from a
state the table does not list is `IllegalMove`, which the service answers 409 with the states it
would accept. A sandbox is stored once it is Running (creation is one transaction), so the
stored states are Running and Paused; Pending exists while a create is in flight. OpenSandbox's
wire enum has more (Pausing, Resuming, Stopping, Terminated, Failed): sandgate's pause and resume
are synchronous and a deleted sandbox leaves the store, so it never reports the others. Failed
is never stored either: GET shows a Running sandbox whose processes have ended (its entrypoint
failed after the create answered, or something killed it) as Failed, with the end of its log
(`Service.observed`); delete is then the only move.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SandboxState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    PAUSED = "Paused"
    FAILED = "Failed"  # shown, never stored (see above)


@dataclass(frozen=True)
class Move:
    sources: frozenset[SandboxState]
    target: SandboxState
    reason: str  # the record's `reason` after the move (OpenSandbox's status.reason)


MOVES = {
    "start": Move(frozenset({SandboxState.PENDING}), SandboxState.RUNNING, "SANDBOX_READY"),
    "pause": Move(frozenset({SandboxState.RUNNING}), SandboxState.PAUSED, "PAUSED"),
    "resume": Move(frozenset({SandboxState.PAUSED}), SandboxState.RUNNING, "RESUMED"),
}
# States whose sandbox has a network, an entry at the proxy and a runtime that may be adopted.
LIVE_STATES = frozenset({SandboxState.RUNNING, SandboxState.PAUSED})


class IllegalMove(ValueError):
    def __init__(self, verb: str, state: SandboxState) -> None:
        allowed = "/".join(sorted(MOVES[verb].sources))
        super().__init__(f"cannot {verb} a sandbox that is {state}, only one that is {allowed}")
        self.verb, self.state = verb, state


def move(state: SandboxState, verb: str) -> Move:
    """The move `verb` makes from `state`; IllegalMove if the table has none."""
    chosen = MOVES[verb]
    if state not in chosen.sources:
        raise IllegalMove(verb, state)
    return chosen
