"""tests/adversarial's world with a gvisor server: its fixtures, reused, with gvisor settings."""

from __future__ import annotations

import pytest

from tests.adversarial import conftest as adversarial

# The suite's package fixtures, bound here so the imported tests find them in this package.
attacker = adversarial.attacker
canaries = adversarial.canaries
egress_proxy = adversarial.egress_proxy
internet = adversarial.internet
proxy_ports = adversarial.proxy_ports
server = adversarial.server


@pytest.fixture(scope="package")
def server_settings(request: pytest.FixtureRequest) -> dict[str, str]:
    return {**adversarial.runtime_settings(request), "SANDGATE_ISOLATION": "gvisor"}
