"""`sandgate-runsc`: the OCI runtime Docker runs for `gvisor` sandboxes; it hands every call to
runsc, after pointing a new container's network namespace at its sandgate netns.

Why: under `--network=host` gVisor reads the interfaces once, at boot. The Docker runtime's
standard path (network mode none, then move the veth in after start) would leave a gVisor
sandbox with `lo` alone; runsc must boot inside the netns sandgate prepared.

Rules:
1. Only `create` is changed: the container's env names its netns (`SANDGATE_NETNS=<name>`, set by
   runtime/docker.py); the variable is removed from the spec and the spec's network namespace
   becomes `/run/netns/<name>`. A name that is not a plain file name is refused (exit 2); a
   container without the variable is left as it is (it boots with `lo` alone: no egress at all).
2. Every other argument passes through unchanged, and the wrapper then becomes runsc (exec), so
   containerd's shim talks to runsc itself: no process of the wrapper stays behind.
3. Standalone: the standard library only (it runs under containerd's shim, in no venv's context).

dockerd's daemon.json registers it with runsc's flags, e.g.
`"runtimes": {"sandgate-runsc": {"path": "<venv>/bin/sandgate-runsc",
"runtimeArgs": ["--platform=systrap", "--network=host"]}}`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

NETNS_VAR = "SANDGATE_NETNS"
RUN_NETNS = Path("/run/netns")
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")


class Refused(Exception):
    """The spec names a netns the wrapper will not join."""


def bundle_of(argv: list[str]) -> Path | None:
    """The bundle directory of a `create` call (`--bundle X`, `--bundle=X`, `-b X`), else None."""
    if "create" not in argv:
        return None
    rest = argv[argv.index("create") + 1 :]
    for index, word in enumerate(rest):
        if word in ("--bundle", "-b", "-bundle") and index + 1 < len(rest):
            return Path(rest[index + 1])
        if word.startswith(("--bundle=", "-bundle=")):
            return Path(word.split("=", 1)[1])
    return Path.cwd()  # runc's and runsc's default


def joined(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with its network namespace pointed at the netns its env names (rule 1)."""
    process = spec.get("process", {})
    env = process.get("env", [])
    names = [item.split("=", 1)[1] for item in env if item.startswith(f"{NETNS_VAR}=")]
    if not names:
        return spec
    name = names[-1]
    if not _PLAIN_NAME.fullmatch(name) or name in (".", ".."):
        raise Refused(f"{NETNS_VAR}={name!r} is not a netns name under {RUN_NETNS}")
    process["env"] = [item for item in env if not item.startswith(f"{NETNS_VAR}=")]
    linux = spec.setdefault("linux", {})
    namespaces = [ns for ns in linux.get("namespaces", []) if ns.get("type") != "network"]
    linux["namespaces"] = [*namespaces, {"type": "network", "path": str(RUN_NETNS / name)}]
    return spec


def refuse(argv: list[str], message: str) -> NoReturn:
    """Exit 2 with `message` on stderr and in the `--log` file (JSON lines: containerd's shim
    reads the runtime's error from there, so the engine's answer says why)."""
    print(message, file=sys.stderr)
    log = next((argv[i + 1] for i, word in enumerate(argv[:-1]) if word in ("--log", "-log")), None)
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps({"level": "error", "msg": message}) + "\n")
    sys.exit(2)


def main() -> None:
    argv = sys.argv[1:]
    runsc = shutil.which("runsc", path=SEARCH_PATH)
    if runsc is None:
        sys.exit(f"sandgate-runsc: runsc is not installed (searched {SEARCH_PATH}); apt-get install runsc")
    bundle = bundle_of(argv)
    if bundle is not None:
        config = bundle / "config.json"
        try:
            spec = joined(json.loads(config.read_text(encoding="utf-8")))
        except Refused as exc:
            refuse(argv, f"sandgate-runsc: {exc}")
        config.write_text(json.dumps(spec), encoding="utf-8")
    os.execv(runsc, [runsc, *argv])


if __name__ == "__main__":
    main()
