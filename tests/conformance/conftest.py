"""One real `sandgate serve` (local runtime) and one test internet for the whole conformance run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.internet import DNS_ADDR, ORIGIN_V4, Internet, start_internet
from tests.support.server import SandgateServer, sandgate_server

API_HOST = "api.example.com"


@pytest.fixture(scope="session")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as net:
        net.set_names({API_HOST: [ORIGIN_V4]})
        yield net


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[SandgateServer]:
    extra = {"SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]), "SANDGATE_UPSTREAM_CA": str(internet.ca_cert)}
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate")), extra) as running:
        yield running
