"""The OpenSandbox JS/TS SDK from npm (tests/js, installed by bootstrap), unchanged, against a
real `sandgate serve`: the shared scenario list (scenarios.py) in direct mode and with
`useServerProxy: true`. One node process per mode runs every scenario on one sandbox
(tests/js/scenarios.mjs) and reports each; each scenario is one test here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import SCENARIOS, SDK_MODES, Result, by_mode, check, offered
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
SCRIPT = Path(__file__).resolve().parents[1] / "js" / "scenarios.mjs"
RUN_TIMEOUT_S = 240
Results = dict[str, Result]


def node(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> str:
    executable = shutil.which("node")
    assert executable, "node is not installed (scripts/bootstrap.sh test installs it)"
    done = subprocess.run(
        [executable, str(SCRIPT), *args],
        cwd=SCRIPT.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"scenarios.mjs {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def run_js(server: SandgateServer, mode: str) -> Results:
    """Every scenario in one node process; each one's result."""
    env = {**server.env(), "SANDGATE_TEST_API_HOST": API_HOST, "SANDGATE_TEST_IMAGE": server.sandbox_image}
    lines = node(mode, env=env, timeout=RUN_TIMEOUT_S).splitlines()
    return {item["scenario"]: item for item in map(json.loads, lines)}


@pytest.fixture(scope="module")
def js_results(server: SandgateServer, direct_execd_server: SandgateServer) -> Callable[[str], Results]:
    """The scenarios' results of one mode, run once on first use."""
    return by_mode(run_js, server, direct_execd_server)


def test_the_js_client_implements_the_scenario_list() -> None:
    assert json.loads(node("--list")) == offered("js")


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", SDK_MODES)
def test_js_sdk(js_results: Callable[[str], Results], mode: str, scenario: str) -> None:
    check("js", lambda: js_results(mode), scenario)
