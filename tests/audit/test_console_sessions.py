"""Console sessions: the cookie is a random token, never the key; it ends at logout, after its
lifetime, or when newer logins push it past the limit."""

from __future__ import annotations

from sandgate.lifecycle.console.session import SESSION_LIFETIME_S, Sessions
from sandgate.lifecycle.principals import BOOTSTRAP


def test_sessions_end_at_logout_after_their_lifetime_and_past_the_limit() -> None:
    now = [1000.0]
    sessions = Sessions(limit=2, clock=lambda: now[0])
    first, second = sessions.new(BOOTSTRAP), sessions.new(BOOTSTRAP)
    assert first != second and len(first) >= 40
    assert sessions.valid(first) and sessions.valid(second)
    assert not sessions.valid(None) and not sessions.valid("") and not sessions.valid("guess")

    sessions.end(second)
    assert not sessions.valid(second) and sessions.valid(first)

    third, fourth = sessions.new(BOOTSTRAP), sessions.new(BOOTSTRAP)  # the limit drops the oldest: first
    assert not sessions.valid(first) and sessions.valid(third) and sessions.valid(fourth)

    now[0] += SESSION_LIFETIME_S - 1
    assert sessions.valid(fourth)
    now[0] += 1
    assert not sessions.valid(third) and not sessions.valid(fourth)
