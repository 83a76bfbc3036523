"""The standard layout (/var, /var/tmp, /opt, /srv, /home, /usr/local, a passwd entry, HOME,
writable /tmp and /var/tmp, `cd /var` in a session) inside real sandboxes of the local runtime:
`sandgate/host` and the code-interpreter image (tests/docker/test_conformance.py has Docker's)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import SandboxSync

from tests.conformance.test_sdk import connection
from tests.support.layout import check_standard_layout
from tests.support.server import SandgateServer

# the code-interpreter fixture may build the image (several minutes on a loaded 2-core machine)
pytestmark = [pytest.mark.root, pytest.mark.timeout(1800)]


def check_image(server: SandgateServer, image: str, entrypoint: list[str], os_id: str = "sandgate") -> None:
    sandbox = SandboxSync.create(
        image,
        entrypoint=entrypoint,
        connection_config=connection(server),
        ready_timeout=timedelta(seconds=60),
    )
    try:
        check_standard_layout(sandbox, os_id)
    finally:
        sandbox.kill()
        sandbox.close()


def test_the_host_image_has_the_standard_layout(server: SandgateServer) -> None:
    host_os = dict(
        line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
    )
    check_image(server, "sandgate/host", ["sleep", "infinity"], host_os["ID"].strip('"'))


def test_the_code_interpreter_image_has_the_standard_layout(
    server: SandgateServer, code_interpreter: str
) -> None:
    check_image(server, code_interpreter, ["/opt/code-interpreter/code-interpreter.sh"])
