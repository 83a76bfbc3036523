"""One real `sandgate serve` (local runtime) and one test internet for this package's tests.

Package scope, not session: the internet's addresses are fixed (198.51.100.0/24), so it must be
gone before another package (tests/docker, tests/adversarial) builds its own in the same
namespace; otherwise their traffic would reach this one's origins, signed by another test CA.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet, start_internet
from tests.support.server import SandgateServer, sandgate_server

API_HOST = "api.example.com"
PATCHED_HOST = "new.example.com"  # resolvable, allowed only once a test patches it in


@pytest.fixture(scope="package")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names({API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]})
        yield net


def upstream(internet: Internet) -> dict[str, str]:
    return {"SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]), "SANDGATE_UPSTREAM_CA": str(internet.ca_cert)}


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[SandgateServer]:
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate")), upstream(internet)) as running:
        yield running


@pytest.fixture(scope="package")
def direct_execd_server(
    tmp_path_factory: pytest.TempPathFactory, internet: Internet
) -> Iterator[SandgateServer]:
    """A server that hands out each sandbox's own execd address (`execd_endpoint = "direct"`):
    a client's direct mode then talks to execd itself, not through the host's reverse proxy."""
    extra = {**upstream(internet), "SANDGATE_EXECD_ENDPOINT": "direct"}
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate-direct")), extra) as running:
        yield running
