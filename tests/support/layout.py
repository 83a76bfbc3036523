"""The standard filesystem layout agents and their tools expect, checked from inside a sandbox
through the OpenSandbox SDK: the directories, a passwd entry for the user, a HOME that exists,
writable /tmp and /var/tmp, and a session command that `cd`s into /var (issue 43)."""

from __future__ import annotations

from opensandbox import SandboxSync

STANDARD_DIRS = (
    "/var",
    "/var/tmp",
    "/var/cache",
    "/var/lib",
    "/var/log",
    "/opt",
    "/srv",
    "/home",
    "/usr/local",
)
# One line per fact, so a failure names what is missing; the shell is bash (execd's commands).
PROBE = "; ".join(
    [
        *(f'test -d {d} && echo "dir {d}" || echo "missing {d}"' for d in STANDARD_DIRS),
        'grep -q "^$(id -un):[^:]*:$(id -u):" /etc/passwd && echo "passwd $(id -un)" || echo "no passwd"',
        'test -d "$HOME" && echo "home exists" || echo "no home $HOME"',
        '. /etc/os-release && echo "os-release $ID" || echo "no os-release"',
        *(
            f'f=$(mktemp {d}/layout.XXXXXX) && echo ok > "$f" && rm "$f" && echo "writable {d}" '
            f'|| echo "read-only {d}"'
            for d in ("/tmp", "/var/tmp")
        ),
    ]
)


def expected(os_id: str) -> list[str]:
    return [
        *(f"dir {d}" for d in STANDARD_DIRS),
        "passwd root",  # sandboxes run as root
        "home exists",
        f"os-release {os_id}",
        "writable /tmp",
        "writable /var/tmp",
    ]


def check_standard_layout(sandbox: SandboxSync, os_id: str) -> None:
    """`os_id`: the ID /etc/os-release names (the host's for sandgate/host, `sandgate` for the
    images build.py makes)."""
    run = sandbox.commands.run(PROBE)
    lines = "\n".join(m.text for m in run.logs.stdout).splitlines()  # a message is a line
    assert lines == expected(os_id), "".join(m.text for m in run.logs.stderr)
    session = sandbox.commands.create_session()
    try:
        moved = sandbox.commands.run_in_session(session, "cd /var && pwd")
        assert moved.exit_code == 0, "".join(m.text for m in moved.logs.stderr)
        assert "".join(m.text for m in moved.logs.stdout).strip() == "/var"
        stayed = sandbox.commands.run_in_session(session, "pwd")
        assert "".join(m.text for m in stayed.logs.stdout).strip() == "/var"  # the session's shell moved
    finally:
        sandbox.commands.delete_session(session)
