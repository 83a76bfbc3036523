"""OpenSandbox's Go SDK (github.com/alibaba/OpenSandbox/sdks/sandbox/go v1.2.0, from the Go module
proxy; scripts/bootstrap.sh downloads it), unchanged, against a real `sandgate serve`: the guide's
tour (tour.py) in tests/go/tour.go, built here offline from the module and build caches, run once
per mode (direct, `UseServerProxy`, direct against a server that hands out execd itself); each
step is one test.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conformance.scenarios import SDK_MODES
from tests.conformance.tour import TOUR, Run, check, run_tour, server_of
from tests.support.internet import Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
SOURCE = Path(__file__).resolve().parents[1] / "go"
BUILD_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def go_tour(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/go built with what bootstrap downloaded (no module proxy: tests reach no registry)."""
    go = shutil.which("go")
    assert go, "go is not installed (scripts/bootstrap.sh test installs it)"
    binary = tmp_path_factory.mktemp("go-tour") / "tour"
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=readonly -buildvcs=false", "GOTOOLCHAIN": "local"}
    done = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=SOURCE,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert done.returncode == 0, f"go build: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return binary


@pytest.fixture(scope="module")
def go_runs(
    go_tour: Path, server: SandgateServer, direct_execd_server: SandgateServer
) -> Callable[[str], Run]:
    """The tour in one mode, run once on first use."""

    @functools.cache
    def run(mode: str) -> Run:
        return run_tour(
            [str(go_tour)], "go", mode, server_of(mode, server, direct_execd_server), RUN_TIMEOUT_S
        )

    return run


@pytest.mark.parametrize("step", TOUR)
@pytest.mark.parametrize("mode", SDK_MODES)
def test_go_sdk(go_runs: Callable[[str], Run], internet: Internet, mode: str, step: str) -> None:
    check("go", lambda: go_runs(mode), mode, step, internet)
