"""Registry credentials from the vault: `registry_credentials` names a vault secret
('username:password') per registry, used when a create gives no `image.auth`; the value is put
with `sandgate vault put` and is in no log or argv afterwards."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.registry import Registry
from tests.support.server import SANDGATE, sandgate_server

pytestmark = pytest.mark.root


def test_a_private_image_pulls_with_the_vaults_login(registry: Registry, tmp_path: Path) -> None:
    env = {
        "SANDGATE_INSECURE_REGISTRIES": registry.private,
        "SANDGATE_REGISTRY_CREDENTIALS": json.dumps({registry.private: "registry-puller"}),
    }
    with sandgate_server(tmp_path, env) as server:
        put = subprocess.run(
            [*SANDGATE, "vault", "put", "registry-puller"], input=f"{registry.username}:{registry.password}",
            capture_output=True, text=True, env=server.server_env(), timeout=60,
        )  # fmt: skip
        assert put.returncode == 0, put.stderr
        sandbox = server.create_sandbox(image={"uri": f"{registry.private}/team/agent:1.4"})
        assert server.run(sandbox["id"], "cat /etc/sandgate-test").stdout == "private image"
        assert registry.password not in server.log()
