"""Test session set-up.

The whole pytest process moves into a fresh network namespace before any test runs (as root).
That namespace plays "the host": servers, proxies and sandboxes made by the tests attach to it,
and it has no route to the machine's real network, so no test packet can leave the machine, and
concurrent test runs on one machine cannot collide on interface names, routes or nft tables.
Named sandbox namespaces (/run/netns) are global, so their names carry random ids.
In the fast tier (`make test-fast`) properties run fewer examples (tests/support/tiers.py).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.dockerd import PrivateDockerd
    from tests.support.registry import Registry
from hypothesis import settings

from tests.support.tiers import FAST, FAST_DEFAULT_EXAMPLES

if FAST:
    settings.register_profile("fast", max_examples=FAST_DEFAULT_EXAMPLES)
    settings.load_profile("fast")


def pytest_configure(config: pytest.Config) -> None:
    if os.geteuid() != 0 or os.environ.get("SANDGATE_TEST_SHARED_NETNS") == "1":
        return
    # The kernel's process connector answers only in the initial namespace: servers that follow
    # sandbox processes open it in this one (`process_events_netns`).
    host_netns = os.open("/proc/self/ns/net", os.O_RDONLY)
    os.environ["SANDGATE_TEST_HOST_NETNS"] = f"/proc/{os.getpid()}/fd/{host_netns}"
    os.unshare(os.CLONE_NEWNET)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


# A module whose tests all need root says so in one line (`pytestmark = pytest.mark.root`).
ROOT_MODULE = re.compile(r"^pytestmark = pytest\.mark\.root$", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m "not root"` (make test-fast) a root module is not even imported: all its tests
    would be deselected, after imports (SDKs, schemathesis, ...) that cost each worker a second."""
    if config.getoption("markexpr") != "not root" or not collection_path.match("test_*.py"):
        return None
    return True if ROOT_MODULE.search(collection_path.read_text()) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces, nftables, mounts)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dockerd() -> Iterator[PrivateDockerd]:
    """One private Docker engine for the whole session (tests/support/dockerd.py)."""
    from tests.support.dockerd import private_dockerd

    with private_dockerd() as daemon:
        yield daemon


@pytest.fixture(scope="session")
def sandbox_images(dockerd: PrivateDockerd) -> str:
    """The digest of the images now in the private dockerd (`sandgate/base`, `sandgate/python`),
    built (or loaded from the build cache) once per session."""
    from tests.docker.conftest import load_image_builder

    return str(load_image_builder().build_images(dockerd.client))


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One real OCI registry for the whole session (tests/support/registry.py): `library/python:3.12`
    and the other test images pushed once; suites push their own with `registry.push(...)`."""
    from tests.support.registry import fill, start_registry

    with start_registry(tmp_path_factory.mktemp("registry")) as running:
        fill(running)
        yield running
