"""Which Jupyter kernel serves each code-context language: the sandbox's own first, then execd's.

Rules:
1. A language is served by the first kernelspec found under one of its names (`KERNEL_NAMES`).
   Kernelspecs are looked up in the sandbox's Jupyter data dirs, in this order: each entry of
   `$JUPYTER_PATH`, `~/.local/share/jupyter`, `/usr/local/share/jupyter`, `/usr/share/jupyter`,
   so an image's kernels (its own Python with its own packages, as in the code-interpreter image)
   win over execd's.
2. Last come the kernels of execd's own environment (written as kernelspecs into execd's state
   dir, `own_kernelspecs`): ipykernel and bash_kernel under execd's Python, Deno's kernel
   (`deno jupyter --kernel`) from the `deno` next to execd's Python or on the sandbox's PATH.
   JJava's kernel (`pip install jjava`: the wheel carries its jar and kernelspec) when `java` is
   on the sandbox's PATH. GoNB (`gonb`, with `goimports` and `gopls` beside it) next to execd's
   Python or on the sandbox's PATH, when `go` is on the sandbox's PATH or next to execd's Python
   (bootstrap links the host's there); GoNB builds each cell with that `go` and runs the binary
   (rule 7).
   This is what a `sandgate/host` sandbox runs (execd's Python is the host venv, bound read-only).
   Deno's kernel implements no interrupt (neither SIGINT nor `interrupt_request`): SIGINT ends
   it, so an interrupted javascript/typescript context ends, and a new one starts fresh.
3. A language none of them serves is `NoKernel` (a 400), whose message lists the languages this
   sandbox has kernels for and says what to install.
4. This module imports jupyter_client only when a context is created (execd starts without it).
5. A kernelspec that starts bash_kernel as `-m bash_kernel` (execd's own, the code-interpreter
   image's) starts it as `-c QUICK_BASH_KERNEL` instead, in the same Python.
6. An ipykernel (`-m ipykernel_launcher` or `-m ipykernel`) also gets `EXACT_FD_OUTPUT` to run at
   start, so a cell's fd-level output (a child process's) is all in the cell's events.
7. GoNB writes and runs its programs in `$TMPDIR`, which in a Docker sandbox is a `noexec` tmpfs:
   execd's GoNB kernelspec and the code-interpreter image's start it through `GONB_LAUNCH`, with
   `TMPDIR` a directory under `$HOME` (the sandbox's writable home), made first. Go's toolchain
   never switches itself (`GOTOOLCHAIN=local`) nor reports (`GOTELEMETRY=off`); `--raw_error`
   makes a compile error plain text (GoNB's default is an HTML page).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jupyter_client.kernelspec import KernelSpecManager

# language -> kernelspec names that serve it, most specific first
KERNEL_NAMES: dict[str, tuple[str, ...]] = {
    "python": ("python3", "python"),
    "bash": ("bash",),
    "javascript": ("deno", "javascript"),
    "typescript": ("deno", "typescript"),
    "java": ("java",),
    "go": ("gonb", "go"),
}
SUPPORTED_LANGUAGES = tuple(KERNEL_NAMES)
SYSTEM_JUPYTER_DIRS = ("/usr/local/share/jupyter", "/usr/share/jupyter")
# what to install when a language has no kernel (rule 3)
INSTALL_HINTS = {
    "python": "ipykernel (`pip install ipykernel`)",
    "bash": "bash_kernel (`pip install bash_kernel`)",
    "javascript": "Deno (`pip install deno`, whose `deno jupyter` is the kernel)",
    "typescript": "Deno (`pip install deno`, whose `deno jupyter` is the kernel)",
    "java": "a JDK (`java` on PATH, 11 or later) and JJava (`pip install jjava`, its kernelspec `java`)",
    "go": "Go (`go` on PATH) and GoNB with goimports and gopls beside it (their kernelspec `gonb`)",
}
# How a GoNB kernel starts (rule 7): argv[0] is `sh -c`'s $0, the gonb binary; $1 the connection file.
# An image may ship a warm Go build cache (`GONB_GO_CACHE_SEED`): the first kernel of a sandbox
# copies it to where `go` builds (mkdir is the lock: one copy, whoever comes second compiles what
# is not there yet), so a sandbox's first cell does not compile fmt and friends.
GONB_LAUNCH = (
    'TMPDIR="${HOME:-/tmp}/.cache/gonb-tmp"; GOCACHE="${GOCACHE:-${HOME:-/tmp}/.cache/go-build}"; '
    'export TMPDIR GOCACHE; mkdir -p "$TMPDIR" || exit 1; '
    'if [ -d "${GONB_GO_CACHE_SEED:-}" ] && mkdir "$GOCACHE" 2>/dev/null; then '
    'cp -R "$GONB_GO_CACHE_SEED"/. "$GOCACHE"/; fi; '
    'exec "$0" --kernel "$1" --raw_error'
)
GO_ENV = {"GOTOOLCHAIN": "local", "GOTELEMETRY": "off"}


# bash_kernel as `python -m bash_kernel` runs it, but with pexpect's 50 ms pause before every
# write (`delaybeforesend`, meant for password prompts that turn echo off) removed: bash_kernel
# writes each line only after bash's prompt, so the pause only slows it. Its start-up writes
# ~40 lines (3.2 s of a bash context's create here, 0.4 s without), and every cell line paid it.
# Inline (`-c`), since the kernel's Python cannot be assumed to import sandgate (rule 5).
QUICK_BASH_KERNEL = (
    "import pexpect\n"
    "class Spawn(pexpect.spawn):\n"
    "    def __init__(self, *args, **kwargs):\n"
    "        super().__init__(*args, **kwargs)\n"
    "        self.delaybeforesend = None\n"
    "pexpect.spawn = Spawn\n"
    "import runpy\n"
    "runpy.run_module('bash_kernel', run_name='__main__', alter_sys=True)\n"
)


# ipykernel sends what reaches fds 1 and 2 (a child process's output) from a thread that reads
# their pipe, and a cell's end does not wait for it: under load a child's output came after the
# cell's idle, or never (ipykernel 7.4). Run at the kernel's start: the same thread, but it reads
# and hands on each chunk under a lock, and after every cell (`post_run_cell`, before ipykernel's
# last flush and its idle) the pipes are drained: the lock held with nothing left to read means
# every byte written so far is in the stream. Bounded at 1 s, as a child may keep writing.
EXACT_FD_OUTPUT = """
import fcntl, os, select, struct, sys, termios, threading, time
def watch(stream, lock):
    while True:
        select.select([stream._fid], [], [])
        with lock:
            data = os.read(stream._fid, 65536)
            if not data or not stream._should_watch:
                return
            stream.write(data.decode(errors="replace"))
            os.write(stream._original_stdstream_copy, data)
def unread(stream):
    return struct.unpack("i", fcntl.ioctl(stream._fid, termios.FIONREAD, bytes(4)))[0]
def drain(*_):
    deadline = time.monotonic() + 1.0
    for stream, lock in watched:
        while time.monotonic() < deadline:
            with lock:
                if not unread(stream):
                    break
            time.sleep(0.002)
        stream.flush()
watched = []
for stream in (sys.stdout, sys.stderr):
    if getattr(stream, "_fid", None) is None or not getattr(stream, "_should_watch", False):
        continue
    stream._should_watch = False
    os.write(stream._original_stdstream_fd, bytes(1))
    stream.watch_fd_thread.join()
    lock = threading.Lock()
    stream._should_watch = True
    stream.watch_fd_thread = threading.Thread(target=watch, args=(stream, lock), daemon=True)
    stream.watch_fd_thread.start()
    watched.append((stream, lock))
get_ipython().events.register("post_run_cell", drain)
"""


def exact_fd_output(argv: list[str]) -> list[str]:
    """`argv` of an ipykernel with EXACT_FD_OUTPUT to run at its start (rule 6)."""
    for at in range(len(argv) - 1):
        if argv[at] == "-m" and argv[at + 1] in ("ipykernel_launcher", "ipykernel"):
            code = f"exec({EXACT_FD_OUTPUT!r}, dict(get_ipython=get_ipython))"
            return [*argv, f"--IPKernelApp.code_to_run={code}"]
    return argv


class NoKernel(Exception):
    """No kernelspec serves the language; the message names what to install."""


def sandbox_kernel_dirs(env: dict[str, str]) -> list[str]:
    roots = [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if env.get("HOME"):
        roots.append(os.path.join(env["HOME"], ".local", "share", "jupyter"))
    roots += SYSTEM_JUPYTER_DIRS
    return [os.path.join(root, "kernels") for root in roots]


def find_program(name: str, env: dict[str, str]) -> str | None:
    """`name` next to execd's Python, else on the sandbox's PATH."""
    beside_python = Path(sys.executable).with_name(name)
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which(name, path=env.get("PATH", os.defpath))


def gonb_kernelspec(gonb: str, go: str) -> dict[str, object]:
    """GoNB's kernelspec, started through GONB_LAUNCH with `go` and GoNB's tools on its PATH."""
    tools = {os.path.dirname(go), os.path.dirname(gonb)}
    path = os.pathsep.join([*sorted(tools), "${PATH}"])
    return {
        "argv": ["/bin/sh", "-c", GONB_LAUNCH, gonb, "{connection_file}"],
        "language": "go",
        "display_name": "Go (gonb)",
        "interrupt_mode": "message",
        "env": {**GO_ENV, "PATH": path},
    }


def own_kernelspecs(env: dict[str, str]) -> dict[str, dict[str, object]]:
    """The kernels execd's own environment has, as kernelspec documents (rule 2)."""
    specs: dict[str, dict[str, object]] = {}
    python = [sys.executable, "-m"]
    if importlib.util.find_spec("ipykernel") is not None:
        argv = [*python, "ipykernel_launcher", "-f", "{connection_file}"]
        specs["python3"] = {"argv": argv, "language": "python", "display_name": "Python 3"}
    if importlib.util.find_spec("bash_kernel") is not None:
        argv = [*python, "bash_kernel", "-f", "{connection_file}"]
        specs["bash"] = {"argv": argv, "language": "bash", "display_name": "Bash"}
    deno = find_program("deno", env)
    if deno is not None:
        argv = [deno, "jupyter", "--kernel", "--conn", "{connection_file}"]
        # NO_COLOR: values are shown as plain text, as Node's REPL shows them to a pipe
        env_ = {"NO_COLOR": "1"}
        specs["deno"] = {"argv": argv, "language": "typescript", "display_name": "Deno", "env": env_}
    jjava = jjava_kernelspec()
    if jjava is not None and shutil.which("java", path=env.get("PATH", os.defpath)):
        spec = json.loads((jjava / "kernel.json").read_text(encoding="utf-8"))
        spec["argv"] = [word.replace("{resource_dir}", str(jjava)) for word in spec["argv"]]
        specs["java"] = spec
    gonb, go = find_program("gonb", env), shutil.which("go", path=env.get("PATH", os.defpath))
    go = go or find_program("go", env)
    if gonb is not None and go is not None:
        specs["gonb"] = gonb_kernelspec(gonb, go)
    return specs


def jjava_kernelspec() -> Path | None:
    """The directory of the kernelspec the jjava wheel installed, found by its file list (execd
    runs with -S, so sys.prefix is the base Python's, not the venv the wheel went into)."""
    from importlib import metadata

    try:
        files = metadata.files("jjava") or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.as_posix().endswith("share/jupyter/kernels/java/kernel.json"):
            return Path(str(file.locate())).resolve().parent
    return None


def quick_bash(argv: list[str]) -> list[str]:
    """`argv` with `-m bash_kernel` replaced by `-c QUICK_BASH_KERNEL` (rule 5)."""
    for at in range(len(argv) - 1):
        if argv[at : at + 2] == ["-m", "bash_kernel"]:
            return [*argv[:at], "-c", QUICK_BASH_KERNEL, *argv[at + 2 :]]
    return argv


def kernel_manager_specs(env: dict[str, str], state_dir: str) -> KernelSpecManager:
    """A KernelSpecManager over the sandbox's kernel dirs, then execd's own kernels."""
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class Specs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            spec = super().get_kernel_spec(kernel_name)
            spec.argv = exact_fd_output(quick_bash(spec.argv))
            return spec

    own = os.path.join(state_dir, "kernels")
    for name, spec in own_kernelspecs(env).items():
        os.makedirs(os.path.join(own, name), exist_ok=True)
        with open(os.path.join(own, name, "kernel.json"), "w", encoding="utf-8") as handle:
            json.dump(spec, handle)
    return Specs(kernel_dirs=[*sandbox_kernel_dirs(env), own], ensure_native_kernel=False)


def kernel_name(language: str, specs: KernelSpecManager) -> str:
    found = specs.find_kernel_specs()
    for name in KERNEL_NAMES[language]:
        if name in found:
            return name
    available = [lang for lang, names in KERNEL_NAMES.items() if any(name in found for name in names)]
    raise NoKernel(
        f"no Jupyter kernel for {language} in this sandbox (looked for kernelspecs named "
        f"{', '.join(KERNEL_NAMES[language])} in {', '.join(specs.kernel_dirs)}); this sandbox "
        f"has kernels for: {', '.join(available) or 'none'}; install {INSTALL_HINTS[language]} in "
        "the image, or use an image that has it"
    )
