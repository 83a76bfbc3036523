"""`sandgate image pull|list|rm|prune` against the test registry, with the server's settings from
the environment (no server running): what a user types, and what the store holds afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import sandgate
from tests.support.registry import Registry

pytestmark = pytest.mark.root


def test_pull_list_rm_prune(registry: Registry, tmp_path: Path) -> None:
    env = {
        "SANDGATE_STATE_DIR": str(tmp_path / "state"),
        "SANDGATE_REGISTRY_MIRRORS": registry.mirror,
        "SANDGATE_REGISTRY_MIRROR_ONLY": "true",
        "SANDGATE_INSECURE_REGISTRIES": registry.private,
    }
    pulled = sandgate("image", "pull", "python:3.12", env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.startswith("pulled docker.io/library/python:3.12 (sha256:")
    private = f"{registry.private}/team/agent:1.4"
    with_password = sandgate("image", "pull", "--username", registry.username, private,
                             stdin=registry.password + "\n", env=env)  # fmt: skip
    assert with_password.returncode == 0, with_password.stderr
    assert registry.password not in with_password.stdout + with_password.stderr
    missing = sandgate("image", "pull", f"{registry.open}/team/nowhere:1.0", env=env)
    assert missing.returncode == 2 and "was not found at registry" in missing.stderr
    listed = sandgate("image", "list", env=env).stdout
    assert "docker.io/library/python:3.12" in listed and private in listed
    layers = tmp_path / "state" / "images" / "layers"
    before = {path.name for path in layers.iterdir()}
    assert sandgate("image", "rm", "python:3.12", env=env).stdout == "removed python:3.12\n"
    assert sandgate("image", "rm", "python:3.12", env=env).returncode == 2
    assert sandgate("image", "prune", env=env).stdout == "removed 1 layer(s)\n"
    assert len(before - {path.name for path in layers.iterdir()}) == 1
    assert "python:3.12" not in sandgate("image", "list", env=env).stdout
