"""The architecture's dependency rules are enforced (`make lint` runs lint-imports with the
contracts in pyproject.toml), and they are not a check that cannot fail: a copy of the tree with
one reach-in of lifecycle into the proxy's engine, or mitmproxy in the proxy's contract, breaks
them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("policy", "vault", "proxy", "lifecycle", "execd")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def tree_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the components under a `sandgate` namespace package (as the editable install
    maps them), with `line` added to `module`."""
    package = tmp_path / "src" / "sandgate"
    package.mkdir(parents=True)
    for name in COMPONENTS:
        shutil.copytree(ROOT / name, package / name, ignore=shutil.ignore_patterns("__pycache__"))
    target = package / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("lifecycle/errors.py", "from sandgate.proxy.audit import AuditLog", "never the engine"),
        ("lifecycle/errors.py", "import mitmproxy", "never the engine"),
        ("proxy/contract/names.py", "import mitmproxy", "loads no engine"),
        ("vault/errors.py", "import sandgate.proxy", "point one way"),
        ("execd/errors.py", "import sandgate.policy", "imports no other component"),
    ],
)
def test_a_reach_in_breaks_a_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = tree_with(tmp_path, module, line)
    done = lint_imports(root, pythonpath=root / "src")
    assert done.returncode != 0, done.stdout
    lines = [text for text in done.stdout.splitlines() if "BROKEN" in text]
    assert len(lines) == 1 and broken in lines[0], done.stdout
