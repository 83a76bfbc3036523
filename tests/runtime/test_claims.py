"""A claim's subPath between the walk and the mount: the local runtime binds the directory it
walked to (held open, bwrap `--bind-fd`), so a sandbox sharing the claim that swaps a component
for a symlink right after the walk shows nothing of where the link points."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.runtime.base import BindMount
from sandgate.lifecycle.runtime.claims import fd_path, open_subdir

pytestmark = pytest.mark.root


def shown_at_mount(bind: BindMount) -> str:
    """What `ls` lists at the bind's target inside a real bwrap sandbox."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/mnt"]
    held = [bind.fd] if bind.fd is not None else []
    done = subprocess.run(
        [*argv, *bind.bwrap_args(), "ls", bind.target],
        capture_output=True,
        text=True,
        pass_fds=held,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("held", [True, False])
def test_a_subpath_swapped_for_a_link_after_the_walk(tmp_path: Path, held: bool) -> None:
    claim, outside = tmp_path / "claim", tmp_path / "outside"
    (claim / "work").mkdir(parents=True)
    (claim / "work" / "mine").write_text("the claim's")
    outside.mkdir()
    (outside / "host-secret").write_text("not the claim's")
    fd = open_subdir(claim, "work")
    try:
        walked = fd_path(fd)
        (claim / "work").rename(claim / "moved")  # what a sandbox sharing the claim can do
        (claim / "work").symlink_to(outside)
        bind = BindMount(str(walked), "/mnt/claim", read_only=True, fd=fd if held else None)
        # held: the directory walked to (moved, still the claim's); by path: the link is followed
        assert shown_at_mount(bind) == ("mine\n" if held else "host-secret\n")
    finally:
        os.close(fd)


def test_the_walk_refuses_a_planted_link(tmp_path: Path) -> None:
    (tmp_path / "claim").mkdir()
    (tmp_path / "claim" / "out").symlink_to("/")
    with pytest.raises(LifecycleError, match="symlinks are not followed"):
        open_subdir(tmp_path / "claim", "out/etc")
