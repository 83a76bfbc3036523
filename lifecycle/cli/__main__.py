"""`python -m sandgate.lifecycle.cli`: the `sandgate` command (what the tests run in subprocesses)."""

from sandgate.lifecycle.cli import main

main()
