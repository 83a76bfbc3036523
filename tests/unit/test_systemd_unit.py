"""examples/systemd/sandgate.service: systemd accepts it, it runs `sandgate serve` as root with a
0700 state dir, stops only serve with SIGTERM (serve stops its proxy; sandboxes stay for the next
start), and gives the service no mount namespace of its own (netns pins and sandbox roots are
mounts the host must see)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "examples" / "systemd" / "sandgate.service"
# Options that give a service a mount namespace of its own (systemd.exec(5), "Sandboxing").
MOUNT_NAMESPACE_OPTIONS = {
    "PrivateTmp", "PrivateDevices", "PrivateMounts", "ProtectSystem", "ProtectHome",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups",
    "ProtectProc", "ProtectHostname", "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths",
    "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths", "RootDirectory", "RootImage",
    "MountAPIVFS", "DynamicUser", "PrivateNetwork", "NetworkNamespacePath",
}  # fmt: skip


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser["Service"]


def test_the_unit_runs_serve_as_root_and_stops_only_serve() -> None:
    unit = service()
    assert unit["ExecStart"].split()[1:] == ["serve"] and unit["ExecStart"].endswith("/bin/sandgate serve")
    assert unit["User"] == "root"
    assert unit["StateDirectory"] == "sandgate" and unit["StateDirectoryMode"] == "0700"
    assert unit["KillMode"] == "mixed" and unit["Restart"] == "on-failure"
    assert not MOUNT_NAMESPACE_OPTIONS & set(unit)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    installed = Path(sys.executable).with_name("sandgate")  # this checkout's .venv, for the path check
    copy = tmp_path / "sandgate.service"
    copy.write_text(UNIT.read_text().replace("/opt/sandgate/.venv/bin/sandgate", str(installed)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "sandgate.service" not in done.stderr  # no warning about the unit itself
