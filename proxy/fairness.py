"""Fairness between sandboxes: who may open another connection, and how refusals are recorded.

Rules:
1. Pure bookkeeping, no I/O: the front door asks `Admission.admit` at accept and calls
   `release` when the connection ends. Limits are per source address (a sandbox's identity),
   so one sandbox's flood spends only its own allowance.
2. Two limits (`ConnectionLimits`): open connections, and new connections per second as a token
   bucket (`accept_burst` tokens, refilled at `accept_rate` per second). A refused connection
   takes no token and holds no slot.
3. A refusal is audited, but a flood must not flood the log: per sandbox and limit, the first
   refusal is recorded at once and opens a window of `REFUSAL_WINDOW` seconds; the refusals
   inside it are only counted and written as one summary record when the window closes. So a
   sandbox costs at most two records per limit per window, whatever it sends; the metrics
   count every refusal.
4. With N proxy workers each enforces its share of every limit (`Admission(share=N)`: open
   connections and burst rounded up, the rate divided): the kernel spreads a sandbox's
   connections over the workers by a hash of their addresses and ports, so together they hold
   it to about the limit, with no counter shared between processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandgate.policy import Reason
from sandgate.proxy.contract.config import ConnectionLimits


@dataclass
class _Source:
    open: int
    tokens: float
    stamp: float  # when `tokens` was last brought up to date


class Admission:
    def __init__(self, share: int = 1) -> None:
        self.share = share  # this process enforces 1/share of each limit (rule 4)
        self._sources: dict[str, _Source] = {}

    def admit(self, source: str, limits: ConnectionLimits, now: float) -> Reason | None:
        """None: admitted (one slot and one token taken); else the limit it is over."""
        state = self._sources.get(source)
        if state is None:
            state = self._sources[source] = _Source(0, float(self._burst(limits)), now)
        self._refill(state, limits, now)
        if state.open >= -(-limits.max_connections // self.share):
            return Reason.TOO_MANY_CONNECTIONS
        if state.tokens < 1.0:
            return Reason.TOO_FAST
        state.tokens -= 1.0
        state.open += 1
        return None

    def release(self, source: str, limits: ConnectionLimits, now: float) -> None:
        state = self._sources.get(source)
        if state is None:
            return
        state.open -= 1
        self._refill(state, limits, now)
        if state.open <= 0 and state.tokens >= self._burst(limits):  # nothing left to remember
            del self._sources[source]

    def open_connections(self, source: str) -> int:
        state = self._sources.get(source)
        return state.open if state else 0

    def _burst(self, limits: ConnectionLimits) -> int:
        return -(-limits.accept_burst // self.share)

    def _refill(self, state: _Source, limits: ConnectionLimits, now: float) -> None:
        elapsed = max(0.0, now - state.stamp)
        refilled = state.tokens + elapsed * limits.accept_rate / self.share
        state.tokens = min(float(self._burst(limits)), refilled)
        state.stamp = now
