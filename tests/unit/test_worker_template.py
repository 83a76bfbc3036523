"""The worker template (proxy/template.py) in a real process tree: a stand-in pool (a script, as
the pool forks its template before it has a loop) asks for a worker; the worker is the template's
child, holds the descriptors it was sent, and the chain dies with the pool however it dies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.proxy_supervisor import parent_pid

# The pool's side: fork the template, ask for worker 1/2 with three descriptors (two ends of
# socket pairs stand in for the listeners, the third is the audit pipe), print what it got,
# read one message the worker writes on the "audit pipe", then wait for a line on stdin:
# "stop", or "kill-template" (then try another fork, and wait for "stop").
POOL = r"""
import asyncio, json, os, socket, sys, time
from sandgate.proxy.template import Template, TemplateGone

def run_worker(slot):
    audit = socket.socket(fileno=slot.audit_fd)
    transparent, explicit = slot.listeners()
    said = {"slot": slot.name, "parent": os.getppid(), "blocking": transparent.getblocking()}
    audit.send(json.dumps(said).encode())
    time.sleep(600)

template = Template.start(run_worker)
pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]

async def main():
    worker = await template.fork(1, 2, tuple(b.fileno() for _, b in pairs), timeout=10)
    for _, theirs in pairs:
        theirs.close()
    said = json.loads(pairs[2][0].recv(4096))
    tree = {"pool": os.getpid(), "template": template.pid, "worker": worker.pid, "said": said}
    print(json.dumps(tree), flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() == "kill-template":
        os.kill(template.pid, 9)
        await template.ended()
        try:
            await template.fork(0, 2, tuple(a.fileno() for a, _ in pairs), timeout=10)
        except TemplateGone as exc:
            print(json.dumps({"gone": str(exc)}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def pool() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", POOL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def started(pool: subprocess.Popen[str]) -> dict[str, object]:
    assert pool.stdout is not None
    return json.loads(pool.stdout.readline())  # type: ignore[no-any-return]


def test_a_worker_is_the_templates_child_with_the_descriptors_it_was_sent(
    pool: subprocess.Popen[str],
) -> None:
    tree = started(pool)
    template, worker = int(str(tree["template"])), int(str(tree["worker"]))
    assert parent_pid(template) == tree["pool"] and parent_pid(worker) == template
    assert tree["said"] == {"slot": "1/2", "parent": template, "blocking": False}
    assert pool.stdin is not None
    pool.stdin.write("stop\n")
    pool.stdin.flush()
    pool.wait(10)
    assert wait_gone([template, worker]) == []


def test_the_template_and_its_workers_die_with_a_killed_pool(pool: subprocess.Popen[str]) -> None:
    tree = started(pool)
    pool.send_signal(signal.SIGKILL)
    pool.wait(10)
    assert wait_gone([int(str(tree["template"])), int(str(tree["worker"]))]) == []


def test_a_worker_dies_with_its_template_and_the_pool_hears_the_template_is_gone(
    pool: subprocess.Popen[str],
) -> None:
    tree = started(pool)
    assert pool.stdin is not None and pool.stdout is not None
    pool.stdin.write("kill-template\n")
    pool.stdin.flush()
    told = json.loads(pool.stdout.readline())
    assert "is gone" in told["gone"] or "forked no worker" in told["gone"], told
    assert wait_gone([int(str(tree["worker"]))]) == []
    pool.stdin.write("stop\n")
    pool.stdin.flush()
    assert pool.wait(10) == 0


def test_the_template_refuses_to_fork_from_a_process_with_threads() -> None:
    code = (
        "import threading, time\n"
        "from sandgate.proxy.template import Template\n"
        "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "Template.start(print)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "before the pool starts a thread" in done.stderr
