"""Renew on access, the parts that need no sandbox: which opt-ins a create may carry, and how
often one sandbox may be renewed (the server-level behaviour is tests/conformance/test_renew_on_access.py)."""

from __future__ import annotations

import pytest

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.renew_on_access import (
    EXTENSION,
    TRACKED_SANDBOXES,
    AccessRenewals,
    check_opt_in,
    extend_seconds,
)


@pytest.mark.parametrize(
    ("value", "seconds"), [("300", 300), ("1800", 1800), ("86400", 86400), (" 600 ", 600)]
)
def test_a_whole_number_of_seconds_from_300_to_86400_opts_in(value: str, seconds: int) -> None:
    assert extend_seconds({EXTENSION: value}) == seconds
    check_opt_in({EXTENSION: value}, max_lifetime=3600)


@pytest.mark.parametrize(
    "value", ["299", "86401", "0", "-300", "300.0", "5m", "", "\uff11\uff12\uff13\uff14", "1e3"]
)
def test_anything_else_is_refused_naming_the_range(value: str) -> None:
    with pytest.raises(LifecycleError) as refused:
        check_opt_in({EXTENSION: value}, max_lifetime=3600)
    assert refused.value.kind == "invalid"
    assert "300 to 86400" in refused.value.message and EXTENSION in refused.value.message


def test_a_server_that_does_not_renew_refuses_the_opt_in_and_nothing_else() -> None:
    with pytest.raises(LifecycleError) as refused:
        check_opt_in({EXTENSION: "300"}, max_lifetime=0)
    assert refused.value.kind == "invalid" and "renew_on_access_max_lifetime = 0" in refused.value.message
    check_opt_in({"sandgate.isolation": "standard"}, max_lifetime=0)
    assert extend_seconds({}) is None


def test_one_renewal_per_sandbox_per_interval() -> None:
    now = [1000.0]
    renewals = AccessRenewals(60.0, clock=lambda: now[0])
    assert renewals.due("a")
    now[0] += 30
    assert renewals.due("b")  # each sandbox has its own minute
    assert [renewals.due("a") for _ in range(100)] == [False] * 100  # a busy sandbox: no more
    now[0] += 29.9
    assert not renewals.due("a")
    now[0] += 0.1
    assert renewals.due("a") and not renewals.due("a")
    assert not renewals.due("b")
    now[0] += 30
    assert renewals.due("b")


def test_the_limiter_forgets_the_least_recently_renewed_beyond_its_size() -> None:
    renewals = AccessRenewals(60.0, clock=lambda: 0.0)
    for number in range(TRACKED_SANDBOXES + 1):
        assert renewals.due(f"sandbox-{number}")
    assert renewals.due("sandbox-0")  # forgotten: due again (it was the oldest)
    assert not renewals.due(f"sandbox-{TRACKED_SANDBOXES}")
