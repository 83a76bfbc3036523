"""A wheel (non-editable install) must carry every package and data file the tree has."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("policy", "vault", "proxy", "lifecycle", "execd")


def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_directory_is_listed() -> None:
    found = {
        "sandgate." + ".".join(init.parent.relative_to(ROOT).parts)
        for component in COMPONENTS
        for init in (ROOT / component).rglob("__init__.py")
    }
    listed = set(setuptools_config()["packages"])
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these listed packages have no __init__.py"


def test_every_non_python_file_is_package_data() -> None:
    data = setuptools_config()["package-data"]
    for component in COMPONENTS:
        for path in (ROOT / component).rglob("*"):
            if not path.is_file() or path.suffix in {".py", ".pyc"} or "__pycache__" in path.parts:
                continue
            package_dir = next(p for p in path.parents if (p / "__init__.py").exists())
            package = "sandgate." + ".".join(package_dir.relative_to(ROOT).parts)
            relative = path.relative_to(package_dir)
            patterns = data.get(package, [])
            assert any(relative.match(pattern) for pattern in patterns), f"{path} is not package data"
