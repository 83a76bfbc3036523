"""The real `sandgate` command run in this test process: the click app itself, through click's
CliRunner, with its own stdin, stdout and stderr and an environment without SANDGATE_ variables.

For tests about what a command does. Each subprocess run pays a fresh interpreter's imports
(about half a CPU second), so only tests whose point is the process itself (its imports, the
installed console script, a command that runs until stopped) start one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from click.testing import CliRunner

from sandgate.lifecycle.cli import main


@dataclass(frozen=True)
class Ran:
    """What `sandgate ARGS` ended with, named as in subprocess.CompletedProcess."""

    returncode: int
    stdout: str
    stderr: str


def sandgate(*args: str, stdin: str = "", env: Mapping[str, str] | None = None) -> Ran:
    """`sandgate ARGS` with `stdin` as its standard input, every SANDGATE_ variable unset and
    `env` set. An exception the command does not turn into an exit status fails the test."""
    unset: dict[str, str | None] = {name: None for name in os.environ if name.startswith("SANDGATE_")}
    result = CliRunner().invoke(
        main,
        list(args),
        input=stdin,
        env={**unset, **(env or {})},
        catch_exceptions=False,
        prog_name="sandgate",
    )
    return Ran(result.exit_code, result.stdout, result.stderr)
