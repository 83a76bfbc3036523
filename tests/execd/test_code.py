"""Code contexts (`/code/context`, `/code/contexts`, `/code`) on real Jupyter kernels
(ipykernel from the venv, as a `sandgate/host` sandbox has them) against a real execd.

They are driven directly with httpx (the wire format) and through the real code-interpreter SDK
(`opensandbox-code-interpreter==1.1.1`, `CodesAdapterSync` pointed straight at execd).
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from code_interpreter.models.code_sync import CodeContextSync, SupportedLanguageSync
from code_interpreter.sync.adapters.code_adapter import CodesAdapterSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd_sync import ExecutionHandlersSync

from .conftest import Execd, start_execd, stop_execd

Event = dict[str, Any]
# a 1x1 PNG, shown through IPython.display.Image
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def events_of(response: httpx.Response) -> Iterator[Event]:
    for line in response.iter_lines():
        if line.strip():
            yield json.loads(line)


def run_cell(
    client: httpx.Client,
    context_id: str,
    code: str,
    on_event: Callable[[Event], None] | None = None,
    **extra: Any,
) -> list[Event]:
    """Every event of one run except pings; `on_event` sees each one as it arrives."""
    body = {"context": {"id": context_id, "language": "python"}, "code": code, **extra}
    seen = []
    with client.stream("POST", "/code", json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for item in events_of(response):
            if item["type"] != "ping":
                seen.append(item)
                if on_event:
                    on_event(item)
    return seen


def kinds(events: list[Event]) -> list[str]:
    """Event types in order, a run of stdout or stderr events counted once: how a pipe read
    splits the output (`hello\\n` and `\\n` in one read or two) is the kernel's timing, not ours."""
    types = [e["type"] for e in events]
    return [t for i, t in enumerate(types) if i == 0 or t not in ("stdout", "stderr") or types[i - 1] != t]


def only(events: list[Event], kind: str) -> Event:
    [event] = [e for e in events if e["type"] == kind]
    return event


def stdout_text(events: list[Event]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "stdout")


@pytest.fixture
def client(execd: Execd) -> Iterator[httpx.Client]:
    with execd.client() as http:
        yield http


@pytest.fixture
def context_id(client: httpx.Client) -> Iterator[str]:
    created = client.post("/code/context", json={"language": "python"})
    assert created.status_code == 200, created.text
    assert created.json()["language"] == "python"
    yield created.json()["id"]
    client.delete(f"/code/contexts/{created.json()['id']}")


def test_cells_keep_state_and_stream_events_like_the_go_execd(client: httpx.Client, context_id: str) -> None:
    first = run_cell(client, context_id, "x = 40\nprint('hello')\nprint()\nx + 2")
    assert kinds(first) == ["init", "execution_count", "stdout", "result", "execution_complete"]
    assert first[0]["text"] == context_id
    assert first[1]["execution_count"] == 1
    assert stdout_text(first) == "hello\n\n"
    result = only(first, "result")
    assert result["results"] == {"text/plain": "42", "text": "42"} and result["execution_count"] == 1
    assert isinstance(only(first, "execution_complete")["execution_time"], int)

    second = run_cell(client, context_id, "import sys\nprint('to stderr', file=sys.stderr)\nx")
    assert second[1]["execution_count"] == 2
    assert [e["text"] for e in second if e["type"] == "stderr"] == ["to stderr\n"]
    assert [e["results"] for e in second if e["type"] == "result"] == [{"text/plain": "40", "text": "40"}]

    quiet = run_cell(client, context_id, "x = 7\nx;")  # a trailing `;` hides the value, as in Jupyter
    assert kinds(quiet) == ["init", "execution_count", "execution_complete"]
    rich = run_cell(
        client,
        context_id,
        "class Table:\n    def _repr_html_(self):\n        return '<table></table>'\n"
        "    def __repr__(self):\n        return 'Table()'\nTable()",
    )
    assert [e["results"] for e in rich if e["type"] == "result"] == [
        {"text/plain": "Table()", "text": "Table()", "text/html": "<table></table>"}
    ]
    child = run_cell(client, context_id, "import subprocess\nsubprocess.run(['echo', 'from a child'])\nNone")
    assert stdout_text(child) == "from a child\n"  # fd-level output is captured too
    children = run_cell(
        client, context_id, "for n in range(40):\n    subprocess.run(['echo', f'child {n}'])\nNone"
    )  # each one's output inside its cell, none after the cell's end (execd/kernels.py rule 6)
    assert stdout_text(children) == "".join(f"child {n}\n" for n in range(40))


GUIDE_CELL = """
            import sys
            print(sys.version)
            result = 2 + 2
            result
            """


def test_the_guides_indented_cell_magics_and_every_mime_type(client: httpx.Client, context_id: str) -> None:
    guide = run_cell(client, context_id, GUIDE_CELL)  # indented as in the guide: IPython dedents it
    assert stdout_text(guide).startswith(sys.version.split()[0])
    assert only(guide, "result")["results"] == {"text/plain": "4", "text": "4"}
    rich = run_cell(
        client,
        context_id,
        "from IPython.display import HTML, JSON, Image, display\n"
        f"display(HTML('<b>hi</b>'), JSON({{'a': 1}}), Image(data={PNG!r}))\n"
        "!echo from-a-shell-line\n"
        "%cd /tmp\n"
        "%pwd",
    )
    results = [e["results"] for e in rich if e["type"] == "result"]
    assert results[0]["text/html"] == "<b>hi</b>" and results[1]["application/json"] == {"a": 1}
    assert base64.b64decode(results[2]["image/png"]) == PNG and results[2]["text"].startswith("<IPython")
    assert results[-1] == {"text/plain": "'/tmp'", "text": "'/tmp'"}
    assert "from-a-shell-line" in stdout_text(rich)


def test_stdout_streams_while_the_cell_runs(client: httpx.Client, context_id: str, tmp_path: Path) -> None:
    # The cell waits for a file that the test writes only after it has seen the first line.
    # If output were held back until the cell ended, the cell would time out instead.
    go = tmp_path / "go"
    code = (
        "import os, time\nprint('first')\ndeadline = time.time() + 10\n"
        f"while not os.path.exists({str(go)!r}) and time.time() < deadline:\n    time.sleep(0.02)\n"
        f"print('second' if os.path.exists({str(go)!r}) else 'waited in vain')"
    )

    def release(item: Event) -> None:
        if item["type"] == "stdout" and item["text"] == "first\n":
            go.touch()

    events = run_cell(client, context_id, code, release)
    assert stdout_text(events) == "first\nsecond\n"
    assert kinds(events)[-1] == "execution_complete"


def test_exception_is_an_error_with_traceback_and_state_survives(
    client: httpx.Client, context_id: str
) -> None:
    events = run_cell(
        client, context_id, "before = 'kept'\ndef boom():\n    return 1 / 0\nprint('partial')\nboom()"
    )
    assert kinds(events) == ["init", "execution_count", "stdout", "error"]  # no complete after an error
    error = events[-1]["error"]
    assert error["ename"] == "ZeroDivisionError" and error["evalue"] == "division by zero"
    text = "\n".join(error["traceback"])  # IPython's traceback, without its terminal colours
    assert "Traceback (most recent call last)" in text and "\x1b[" not in text
    assert "Cell In[1], line 5" in text and "return 1 / 0" in text
    assert error["traceback"][-1] == "ZeroDivisionError: division by zero"

    syntax = run_cell(client, context_id, "def broken(:")
    assert syntax[-1]["error"]["ename"] == "SyntaxError"
    assert "Cell In[2], line 1" in syntax[-1]["error"]["traceback"][0]
    exits = run_cell(client, context_id, "raise SystemExit(3)")
    assert exits[-1]["error"]["ename"] == "SystemExit"
    after = run_cell(client, context_id, "before")
    kept = {"text/plain": "'kept'", "text": "'kept'"}
    assert [e["results"] for e in after if e["type"] == "result"] == [kept]


def test_interrupt_stops_the_cell_and_keeps_the_context(
    client: httpx.Client, context_id: str, execd: Execd
) -> None:
    run_cell(client, context_id, "counter = 0")
    interrupted: list[int] = []

    def interrupt_once_started(item: Event) -> None:
        if item["type"] == "stdout" and not interrupted:
            with execd.client() as other:
                interrupted.append(other.delete("/code", params={"id": context_id}).status_code)

    code = "import time\nprint('started', flush=True)\nwhile True:\n    counter += 1\n    time.sleep(0.01)"
    events = run_cell(client, context_id, code, interrupt_once_started)
    assert interrupted == [200]
    assert events[-1]["type"] == "error" and events[-1]["error"]["ename"] == "KeyboardInterrupt"
    after = run_cell(client, context_id, "counter > 0")
    assert [e["results"] for e in after if e["type"] == "result"] == [{"text/plain": "True", "text": "True"}]
    idle = client.delete("/code", params={"id": context_id})  # nothing running: a no-op
    assert idle.status_code == 200
    assert client.delete("/code", params={"id": "nope"}).status_code == 404
    assert client.delete("/code").status_code == 400


def test_interrupting_a_cell_that_floods_results_keeps_the_protocol_intact(
    client: httpx.Client, context_id: str, execd: Execd
) -> None:
    many = run_cell(client, context_id, "for i in range(300):\n    display('x' * 10000)")
    assert [len(e["results"]["text"]) for e in many if e["type"] == "result"] == [10002] * 300
    assert kinds(many)[-1] == "execution_complete"

    def interrupt(item: Event) -> None:
        if item["type"] == "stdout":
            time.sleep(0.2)  # let the cell send results for a while, then interrupt it mid-stream
            with execd.client() as other:
                other.delete("/code", params={"id": context_id})

    flood = run_cell(
        client,
        context_id,
        "print('go', flush=True)\nn = 0\nwhile True:\n    display(n)\n    n += 1",
        interrupt,
    )
    assert flood[-1]["error"]["ename"] == "KeyboardInterrupt"
    # in order, each once (the kernel's iopub may drop messages past its high-water mark)
    shown = [int(e["results"]["text"]) for e in flood if e["type"] == "result"]
    assert shown and shown == sorted(set(shown))
    after = run_cell(client, context_id, "n >= len([1])")
    assert [e["results"] for e in after if e["type"] == "result"] == [{"text/plain": "True", "text": "True"}]


def test_timeout_interrupts_then_kills_a_cell_that_ignores_sigint(
    client: httpx.Client, context_id: str
) -> None:
    timed = run_cell(client, context_id, "import time\nsurvivor = 1\ntime.sleep(30)", timeout=300)
    assert timed[-1]["error"]["ename"] == "ExecutionTimeout"
    assert "keeps its state" in timed[-1]["error"]["evalue"]
    assert [e["results"] for e in run_cell(client, context_id, "survivor") if e["type"] == "result"] == [
        {"text/plain": "1", "text": "1"}
    ]

    stubborn = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)"
    killed = run_cell(client, context_id, stubborn, timeout=200)
    assert killed[-1]["error"]["ename"] == "ExecutionTimeout"
    assert "killed" in killed[-1]["error"]["evalue"]
    gone = client.post("/code", json={"context": {"id": context_id}, "code": "1"})
    assert gone.status_code == 410 and "timeout" in gone.json()["message"]


def test_a_dead_interpreter_ends_the_context(client: httpx.Client, context_id: str) -> None:
    events = run_cell(client, context_id, "import os\nos._exit(3)")
    assert events[-1]["error"]["ename"] == "ContextEnded"
    assert "status 3" in events[-1]["error"]["evalue"]
    assert client.post("/code", json={"context": {"id": context_id}, "code": "1"}).status_code == 410
    assert client.get(f"/code/contexts/{context_id}").status_code == 410


def test_client_that_goes_away_interrupts_its_cell(
    client: httpx.Client, context_id: str, execd: Execd
) -> None:
    body = {
        "context": {"id": context_id},
        "code": "import time\nprint('running', flush=True)\ntime.sleep(60)",
    }
    with execd.client() as leaving, leaving.stream("POST", "/code", json=body) as response:
        for item in events_of(response):
            if item["type"] == "stdout":
                break  # closing the stream now drops the connection mid-cell
    deadline = time.monotonic() + 10
    while True:  # the interrupted cell ends on its own; until then the context is busy (409)
        answer = client.post("/code", json={"context": {"id": context_id}, "code": "'free'"})
        if answer.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert answer.status_code == 200
    assert '"text":"\'free\'"' in answer.text


def test_runs_in_one_context_are_serial(client: httpx.Client, context_id: str, execd: Execd) -> None:
    busy: list[tuple[int, str]] = []

    def try_second_run(item: Event) -> None:
        if item["type"] == "stdout" and not busy:
            with execd.client() as other:
                second = other.post("/code", json={"context": {"id": context_id}, "code": "1"})
                busy.append((second.status_code, second.json()["message"]))
                other.delete("/code", params={"id": context_id})

    run_cell(client, context_id, "import time\nprint('busy', flush=True)\ntime.sleep(30)", try_second_run)
    assert busy and busy[0][0] == 409 and "running another cell" in busy[0][1]


def test_list_get_and_delete_contexts(client: httpx.Client) -> None:
    client.delete("/code/contexts", params={"language": "python"})
    ids = [client.post("/code/context", json={"language": "python"}).json()["id"] for _ in range(2)]
    listed = client.get("/code/contexts", params={"language": "python"}).json()
    assert sorted(c["id"] for c in listed) == sorted(ids)
    assert client.get("/code/contexts").json() == listed
    assert client.get("/code/contexts", params={"language": "go"}).json() == []
    assert client.get(f"/code/contexts/{ids[0]}").json() == {"id": ids[0], "language": "python"}
    pid = run_cell(client, ids[0], "import os\nos.getpid()")[-2]["results"]["text"]

    assert client.delete(f"/code/contexts/{ids[0]}").status_code == 200
    assert client.get(f"/code/contexts/{ids[0]}").status_code == 404
    assert client.delete(f"/code/contexts/{ids[0]}").status_code == 404
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not Path(f"/proc/{pid}").exists(), "deleting a context must end its python process"

    assert client.delete("/code/contexts", params={"language": "python"}).status_code == 200
    assert client.get("/code/contexts").json() == []
    assert client.delete("/code/contexts").status_code == 400


def test_bad_requests_are_refused(client: httpx.Client) -> None:
    for language in ("rust", "ruby", ""):
        refused = client.post("/code/context", json={"language": language})
        assert refused.status_code == 400
    unsupported = client.post("/code/context", json={"language": "rust"}).json()
    supported = "supported: python, bash, javascript, typescript, java, go"
    assert unsupported["code"] == "UNSUPPORTED_LANGUAGE" and supported in unsupported["message"]
    run_rust = client.post("/code", json={"context": {"language": "rust"}, "code": "1"})
    assert run_rust.status_code == 400 and supported in run_rust.json()["message"]
    assert client.post("/code", json={"context": {"language": "python"}}).status_code == 400
    assert client.post("/code", json={"context": "python", "code": "1"}).status_code == 400
    assert client.post("/code", json={"context": {"id": "nope"}, "code": "1"}).status_code == 404
    assert client.get("/code/contexts/nope").status_code == 404
    assert client.post("/code/context", json={"language": "python", "cwd": "/no/such/dir"}).status_code == 400


# -- through the real code-interpreter SDK ----------------------------------------------------


@pytest.fixture
def codes(execd: Execd) -> Iterator[CodesAdapterSync]:
    adapter = CodesAdapterSync(execd.sdk_endpoint(), execd.sdk_config())
    try:
        yield adapter
    finally:
        adapter.close()


def test_sdk_runs_cells_in_a_context(codes: CodesAdapterSync) -> None:
    context = codes.create_context(SupportedLanguageSync.PYTHON)
    assert context.id and context.language == "python"
    streamed: list[str] = []
    handlers = ExecutionHandlersSync(on_stdout=lambda message: streamed.append(message.text))
    first = codes.run(
        "users = ['Alice', 'Bob']\nprint(len(users))\nlen(users) * 21", context=context, handlers=handlers
    )
    assert first.error is None and first.complete is not None
    assert first.id == context.id and first.execution_count == 1
    assert [r.text for r in first.result] == ["42"]
    assert streamed == ["2\n"] and first.text == "2\n42"

    second = codes.run("users.append('Carol')\nprint(users)\n{'n': len(users)}", context=context)
    assert [m.text for m in second.logs.stdout] == ["['Alice', 'Bob', 'Carol']\n"]
    assert [r.text for r in second.result] == ["{'n': 3}"] and second.execution_count == 2

    failed = codes.run("users[10]", context=context)
    assert failed.error is not None and failed.complete is None
    assert failed.error.name == "IndexError" and failed.error.value == "list index out of range"
    assert failed.error.traceback[-1] == "IndexError: list index out of range"

    assert codes.get_context(context.id).id == context.id
    assert context.id in [c.id for c in codes.list_contexts(SupportedLanguageSync.PYTHON)]
    codes.delete_context(context.id)
    with pytest.raises(SandboxApiException):
        codes.get_context(context.id)


def test_sdk_interrupt_and_default_context(codes: CodesAdapterSync) -> None:
    context = codes.create_context(SupportedLanguageSync.PYTHON)
    assert context.id is not None
    started = threading.Event()
    handlers = ExecutionHandlersSync(on_stdout=lambda message: started.set())
    outcome: list[Any] = []
    runner = threading.Thread(
        target=lambda: outcome.append(
            codes.run(
                "import time\nprint('go', flush=True)\ntime.sleep(60)", context=context, handlers=handlers
            )
        )
    )
    runner.start()
    try:
        assert started.wait(15), "the cell never printed"
        codes.interrupt(context.id)  # the SDK interrupts by the execution id, which is the context id
    finally:
        runner.join(15)
    assert outcome and outcome[0].error is not None and outcome[0].error.name == "KeyboardInterrupt"

    codes.run("x = 42", language=SupportedLanguageSync.PYTHON)  # no context id: the default context
    again = codes.run("result = x\nresult", language=SupportedLanguageSync.PYTHON)
    assert [r.text for r in again.result] == ["42"]
    assert [r.text for r in codes.run("x").result] == ["42"]  # no language either: python's default
    codes.delete_contexts(SupportedLanguageSync.PYTHON)
    assert codes.list_contexts(SupportedLanguageSync.PYTHON) == []


def test_sdk_unsupported_language_is_a_clear_400(codes: CodesAdapterSync) -> None:
    with pytest.raises(SandboxApiException) as refused:
        codes.create_context("ruby")
    supported = "supported: python, bash, javascript, typescript, java, go"
    assert refused.value.status_code == 400 and supported in str(refused.value)
    with pytest.raises(SandboxApiException) as run_refused:
        codes.run("1", context=CodeContextSync(language="ruby"))
    assert run_refused.value.status_code == 400


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_contexts_die_with_execd(stop: str) -> None:
    """A stopped execd ends its contexts, also one in the middle of a cell; a killed one too
    (ipykernel watches its parent, JPY_PARENT_PID, and exits when it is gone)."""
    server = start_execd()
    try:
        with server.client() as http:
            context_id = http.post("/code/context", json={"language": "python"}).json()["id"]
            pid = int(run_cell(http, context_id, "import os\nos.getpid()")[-2]["results"]["text"])
            body = {
                "context": {"id": context_id},
                "code": "import time\nprint(1, flush=True)\ntime.sleep(60)",
            }
            with http.stream("POST", "/code", json=body) as response:
                next(e for e in events_of(response) if e["type"] == "stdout")
                if stop == "sigterm":
                    stop_execd(server)
                else:
                    server.process.kill()
                    server.process.wait()
        deadline = time.monotonic() + 5
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not Path(f"/proc/{pid}").exists(), f"the context's kernel outlived execd ({stop})"
    finally:
        stop_execd(server)


def kernels_of(execd: Execd, marker: bytes = b"ipykernel_launcher") -> set[int]:
    """The pids of execd's kernel processes (its children whose command line holds `marker`)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == execd.process.pid and marker in cmdline:
            found.add(int(stat.parent.name))
    return found


def wait_for_kernels(execd: Execd, count: int) -> set[int]:
    deadline = time.monotonic() + 60
    while len(found := kernels_of(execd)) != count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) == count, f"execd has kernels {found}, expected {count}"
    return found


def test_a_spare_kernel_serves_the_next_create_and_ends_with_execd() -> None:
    """After a python context, one spare kernel waits; the next create with the same cwd and
    env takes it (the new context's pid is the spare's), one with another cwd does not (the
    spare is ended), and no spare outlives execd."""
    server = start_execd()
    try:
        with server.client() as http:
            first = http.post("/code/context", json={"language": "python"}).json()["id"]
            first_pid = int(run_cell(http, first, "import os\nos.getpid()")[-2]["results"]["text"])
            [spare] = wait_for_kernels(server, 2) - {first_pid}
            second = http.post("/code/context", json={"language": "python"}).json()["id"]
            assert run_cell(http, second, "import os\nos.getpid()")[-2]["results"]["text"] == str(spare)
            [next_spare] = wait_for_kernels(server, 3) - {first_pid, spare}
            elsewhere = http.post("/code/context", json={"language": "python", "cwd": "/tmp"}).json()["id"]
            pid = int(run_cell(http, elsewhere, "import os\nos.getpid()")[-2]["results"]["text"])
            assert (
                pid != next_spare
                and run_cell(http, elsewhere, "os.getcwd()")[-2]["results"]["text"] == "'/tmp'"
            )
            kernels = wait_for_kernels(server, 4)  # first, second, elsewhere and its spare
            assert next_spare not in kernels
        stop_execd(server)
        deadline = time.monotonic() + 5
        while any(Path(f"/proc/{k}").exists() for k in kernels) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [k for k in kernels if Path(f"/proc/{k}").exists()], "a kernel outlived execd"
    finally:
        stop_execd(server)


def test_a_language_without_a_kernel_here_is_a_400_naming_those_it_has(tmp_path: Path) -> None:
    """Java without a JDK on the sandbox's PATH (as in the code-interpreter image): a 400 that
    lists the languages this sandbox has kernels for and what to install."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/bash").symlink_to("/bin/bash")
    server = start_execd(env={"PATH": str(tmp_path / "bin")})
    try:
        with server.client() as http:
            refused = http.post("/code/context", json={"language": "java"})
        assert refused.status_code == 400 and refused.json()["code"] == "UNSUPPORTED_LANGUAGE"
        message = refused.json()["message"]
        assert "no Jupyter kernel for java" in message and "install a JDK" in message
        has = message.split("has kernels for: ")[1].split(";")[0].split(", ")
        # Go is there when bootstrap put GoNB and `go` next to execd's Python (they are found there)
        assert has in (
            ["python", "bash", "javascript", "typescript"],
            ["python", "bash", "javascript", "typescript", "go"],
        )
    finally:
        stop_execd(server)
