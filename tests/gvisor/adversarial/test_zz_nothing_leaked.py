"""After the attacks (this module runs last): no secret in any log, no canary ever reached."""

from __future__ import annotations

import pytest

from tests.adversarial.conftest import Attacker
from tests.adversarial.test_zz_nothing_leaked import (  # noqa: F401 (collected here on gvisor)
    assert_the_secret_is_nowhere,
    test_no_canary_was_ever_reached,
)

pytestmark = pytest.mark.root


def test_the_secret_is_in_no_log_line_and_no_state_file(attacker: Attacker) -> None:
    assert_the_secret_is_nowhere(attacker, min_records=50)  # this package runs a subset of the attacks
