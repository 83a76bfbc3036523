"""One `sandgate serve` for the image suites (pulls, snapshots), pointed at the session's test
registry: `registry_mirrors` for docker.io names, the private and the silent registry allowed over
plain HTTP, and a short pull timeout so a registry that hangs fails within the test's bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.registry import Registry
from tests.support.server import SandgateServer, sandgate_server

PULL_TIMEOUT = 15  # seconds; a cold python:3.12 takes ~8 s on a loaded 2-core machine


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, registry: Registry) -> Iterator[SandgateServer]:
    env = {
        "SANDGATE_REGISTRY_MIRRORS": registry.mirror,
        "SANDGATE_REGISTRY_MIRROR_ONLY": "true",  # no test looks up a public name
        "SANDGATE_INSECURE_REGISTRIES": f"{registry.private},{registry.silent}",
        "SANDGATE_IMAGE_PULL_TIMEOUT": str(PULL_TIMEOUT),
    }
    with sandgate_server(Path(tmp_path_factory.mktemp("images")), env, log_level="info") as running:
        yield running
