"""Every OpenSandbox client's scenario runner by name, for the runners of the scenarios on the
other runtimes (tests/docker, tests/kubernetes, tests/gvisor): each runs the same clients."""

from __future__ import annotations

import functools
from collections.abc import Callable

from tests.conformance.scenarios import MODES, SCENARIOS, Result, Runner
from tests.conformance.test_js_sdk import run_js
from tests.conformance.test_mcp_scenarios import run_mcp
from tests.conformance.test_osb_scenarios import run_osb
from tests.conformance.test_sdk_scenarios import run_python
from tests.support.server import SandgateServer

CLIENTS: dict[str, Runner] = {"python": run_python, "js": run_js, "osb": run_osb, "mcp": run_mcp}
# (client, mode, scenario): every client in every mode, each scenario one test.
CASES = [(client, mode, scenario) for client in CLIENTS for mode in MODES for scenario in SCENARIOS]


def results_once(server: SandgateServer) -> Callable[[str, str], dict[str, Result]]:
    """One client's results in one mode against `server`, run once on first use."""
    return functools.cache(lambda client, mode: CLIENTS[client](server, mode))
