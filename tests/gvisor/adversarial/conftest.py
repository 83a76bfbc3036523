"""tests/adversarial's world with a gvisor server: its fixtures, reused, and `server` here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adversarial import conftest as adversarial
from tests.support.server import SandgateServer

GVISOR = {"SANDGATE_ISOLATION": "gvisor"}
# The suite's package fixtures, bound here so the imported tests find them in this package.
attacker = adversarial.attacker
canaries = adversarial.canaries
internet = adversarial.internet
proxy_ports = adversarial.proxy_ports


@pytest.fixture(scope="package")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    internet: adversarial.Internet,
    canaries: adversarial.Canaries,
    proxy_ports: adversarial.ProxyPorts,
) -> Iterator[SandgateServer]:
    with adversarial.adversarial_server(tmp_path_factory, internet, proxy_ports, GVISOR) as running:
        yield running
