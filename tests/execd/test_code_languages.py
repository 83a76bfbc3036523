"""bash (bash_kernel) and JavaScript/TypeScript (Deno's kernel) code contexts against a real
execd, through the real code-interpreter SDK (`CodesAdapterSync`) and on the wire."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from code_interpreter.models.code_sync import SupportedLanguageSync
from code_interpreter.sync.adapters.code_adapter import CodesAdapterSync
from opensandbox.models.execd_sync import ExecutionHandlersSync

from .conftest import Execd, start_execd, stop_execd
from .test_code import kernels_of, kinds, run_cell, stdout_text
from .test_files import snapshot


@pytest.fixture
def codes(execd: Execd) -> Iterator[CodesAdapterSync]:
    adapter = CodesAdapterSync(execd.sdk_endpoint(), execd.sdk_config())
    try:
        yield adapter
    finally:
        adapter.close()


def interrupt_mid_cell(codes: CodesAdapterSync, context: Any, code: str) -> Any:
    """Run `code` (which prints, then blocks), interrupt it once it printed; its execution."""
    started = threading.Event()
    handlers = ExecutionHandlersSync(on_stdout=lambda message: started.set())
    outcome: list[Any] = []
    runner = threading.Thread(
        target=lambda: outcome.append(codes.run(code, context=context, handlers=handlers))
    )
    runner.start()
    try:
        assert started.wait(15), "the cell never printed"
        time.sleep(0.2)
        codes.interrupt(context.id)
    finally:
        runner.join(15)
    assert outcome, "the interrupted cell did not end"
    return outcome[0]


def test_sdk_bash_context_keeps_shell_state(codes: CodesAdapterSync, execd_root: Path) -> None:
    context = codes.create_context(SupportedLanguageSync.BASH)
    assert context.id and context.language == "bash"
    first = codes.run(
        f'GREETING=hi; cd {execd_root}; say() {{ echo "$GREETING $1"; }}; say one', context=context
    )
    assert first.error is None and first.complete is not None and first.execution_count == 1
    assert [m.text for m in first.logs.stdout] == ["hi one\n"]
    second = codes.run("say two; pwd; echo oops >&2; false", context=context)
    # bash_kernel runs bash on a terminal: stderr arrives in stdout's stream, in order
    assert "".join(m.text for m in second.logs.stdout) == f"hi two\n{execd_root}\noops\n"
    assert second.error is not None and second.complete is None  # the Jupyter bash kernel's error
    assert (second.error.name, second.error.value) == ("", "1")
    broken = codes.run("if then", context=context)  # a syntax error fails that cell only
    assert broken.error is not None and broken.error.value == "2"
    slept = interrupt_mid_cell(codes, context, "echo going; sleep 30; echo never")
    assert slept.error is not None and slept.error.name == "KeyboardInterrupt"
    assert "never" not in "".join(m.text for m in slept.logs.stdout)
    assert [m.text for m in codes.run("say three", context=context).logs.stdout] == ["hi three\n"]
    codes.run("exit 7", context=context)  # bash_kernel restarts bash: its state is gone
    assert [m.text for m in codes.run('echo "[$GREETING]"', context=context).logs.stdout] == ["[]\n"]
    codes.delete_context(context.id)


def test_sdk_javascript_and_typescript_contexts_on_denos_kernel(codes: CodesAdapterSync) -> None:
    context = codes.create_context(SupportedLanguageSync.JAVASCRIPT)
    assert context.id and context.language == "javascript"
    first = codes.run(
        "const users = ['Alice', 'Bob'];\nconsole.log(users.length);\nusers.length * 21", context=context
    )
    assert first.error is None and first.complete is not None
    assert [m.text for m in first.logs.stdout] == ["2\n"] and [r.text for r in first.result] == ["42"]
    second = codes.run("users.push('Carol'); console.error('warn'); ({ n: users.length })", context=context)
    assert [r.text for r in second.result] == ["{ n: 3 }"]
    assert [m.text for m in second.logs.stderr] == ["warn\n"]
    failed = codes.run("users.nope.length", context=context)
    assert failed.error is not None and failed.complete is None and failed.error.name == "TypeError"
    assert failed.error.traceback[0].startswith("TypeError: Cannot read properties of undefined")
    awaited = codes.run(
        "const v = await new Promise((r) => setTimeout(() => r(5), 10));\nconsole.log(v * 2)", context=context
    )
    assert awaited.error is None and [m.text for m in awaited.logs.stdout] == ["10\n"]
    # Deno's kernel implements no interrupt: SIGINT ends it, and the context with it
    looping = interrupt_mid_cell(codes, context, "console.log('spin'); while (true) {}")
    assert looping.error is not None and looping.error.name == "ContextEnded"
    assert "exited with status 130" in looping.error.value

    typed = codes.create_context(SupportedLanguageSync.TYPESCRIPT)
    assert typed.language == "typescript"
    shown = codes.run("interface P { x: number }\nconst p: P = { x: 1 };\np.x + 41", context=typed)
    assert shown.error is None and [r.text for r in shown.result] == ["42"]
    codes.delete_context(typed.id)


def test_wire_events_and_default_contexts(execd: Execd) -> None:
    with execd.client() as client:
        for language, code, expected in (
            ("bash", "echo $((6*7))", "42\n"),
            ("javascript", "console.log(6*7)", "42\n"),
        ):
            body = {"context": {"language": language}, "code": code}
            with client.stream("POST", "/code", json=body) as response:
                assert response.status_code == 200 and response.reason_phrase == "OK"
                text = response.read()
            events = [e for e in (httpx.Response(200, content=text).text.split("\n\n")) if e.strip()]
            assert '"type":"init"' in events[0] and '"type":"execution_count"' in events[1]
            context_id = [c["id"] for c in client.get("/code/contexts", params={"language": language}).json()]
            assert len(context_id) == 1
            events = run_cell(
                client, context_id[0], code, context={"id": context_id[0], "language": language}
            )
            assert kinds(events) == ["init", "execution_count", "stdout", "execution_complete"]
            assert stdout_text(events) == expected
            assert client.delete("/code/contexts", params={"language": language}).status_code == 200
            assert client.get("/code/contexts", params={"language": language}).json() == []


def test_bad_language_requests_change_nothing(execd: Execd, execd_root: Path) -> None:
    before = snapshot(execd_root)
    with execd.client() as client:
        listed = client.get("/code/contexts").json()
        for body in (
            {"language": "bash", "cwd": "/no/such/dir"},
            {"language": "javascript", "cwd": 7},
            {"language": "ruby"},
        ):
            refused = client.post("/code/context", json=body)
            assert refused.status_code == 400 and set(refused.json()) == {"code", "message"}
        no_code = client.post("/code", json={"context": {"language": "bash"}})
        assert no_code.status_code == 400
        assert client.get("/code/contexts").json() == listed
    assert snapshot(execd_root) == before


def test_an_images_bash_kernelspec_starts_without_pexpects_pause(tmp_path: Path) -> None:
    """A kernelspec that runs `python -m bash_kernel` (as the code-interpreter image's does) is
    started with pexpect's 50 ms pause before each write removed; its cells work as before."""
    spec = {"argv": [sys.executable, "-m", "bash_kernel", "-f", "{connection_file}"], "language": "bash"}
    (tmp_path / "kernels/bash").mkdir(parents=True)
    (tmp_path / "kernels/bash/kernel.json").write_text(json.dumps(spec))
    server = start_execd(env={"JUPYTER_PATH": str(tmp_path), "EXECD_SPARE_KERNELS": "0"})
    try:
        with server.client() as http:
            context_id = http.post("/code/context", json={"language": "bash"}).json()["id"]
            events = run_cell(http, context_id, "for i in 1 2; do\n  echo line-$i\ndone\necho $$")
            assert stdout_text(events).startswith("line-1\nline-2\n")
            [kernel] = kernels_of(server, b"delaybeforesend = None")
            argv = Path(f"/proc/{kernel}/cmdline").read_bytes().split(b"\0")
            assert argv[:2] == [sys.executable.encode(), b"-c"] and b"bash_kernel" in argv[2]
    finally:
        stop_execd(server)


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK on this host (bootstrap installs one)")
def test_sdk_java_context_on_jjava(codes: CodesAdapterSync) -> None:
    """Java cells run in JJava's kernel (the jjava wheel, on the host's JDK): state lasts across
    cells, the last expression is the result, println is stdout, an exception is an error."""
    context = codes.create_context(SupportedLanguageSync.JAVA)
    assert context.language == "java"
    assert codes.run("int x = 41;", context=context).error is None
    assert [r.text for r in codes.run("x + 1", context=context).result] == ["42"]
    printed = codes.run('System.out.println("hi " + x);', context=context)
    assert "".join(m.text for m in printed.logs.stdout) == "hi 41\n"
    failed = codes.run('throw new IllegalStateException("boom");', context=context)
    # JJava's error under IJava's name (OpenSandbox's): the exception in the traceback's first
    # line, its class and message in evalue
    assert failed.error is not None and failed.error.name == "EvalException"
    assert failed.error.traceback[0] == "java.lang.IllegalStateException: boom"
    assert failed.error.value == "java.lang.IllegalStateException, boom"
    divided = codes.run("int y = 10 / 0;", context=context)
    assert divided.error is not None and divided.error.name == "EvalException"
    assert divided.error.value == "java.lang.ArithmeticException, / by zero"
    uncompiled = codes.run("int z = undefinedName;", context=context)
    assert uncompiled.error is not None and uncompiled.error.name == "CompilationException"
    codes.delete_context(context.id)


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK on this host (bootstrap installs one)")
def test_sdk_java_interrupt_stops_the_cell_between_its_snippets(codes: CodesAdapterSync) -> None:
    """JJava runs a cell snippet by snippet, compiling each before it runs: an interrupt that
    comes while it compiles the next one (here a class of many methods, a second or more) finds
    nothing running and is dropped. The cell's loop after it must still be stopped, and the
    context goes on with its state."""
    context = codes.create_context(SupportedLanguageSync.JAVA)
    assert codes.run("int kept = 41;", context=context).error is None
    methods = "".join(f"    static int m{i}(int x) {{ return x + {i}; }}\n" for i in range(400))
    cell = f'System.out.println("spin");\nclass Slow {{\n{methods}}}\nwhile (true) {{ Thread.sleep(1); }}'
    spun = interrupt_mid_cell(codes, context, cell)
    assert spun.error is not None and spun.error.name == "EvaluationInterruptedException", spun.error
    assert "".join(m.text for m in spun.logs.stdout) == "spin\n"
    again = codes.run("kept + 1", context=context)
    assert again.error is None and [r.text for r in again.result] == ["42"]
    codes.delete_context(context.id)


@pytest.mark.skipif(
    shutil.which("gonb", path=str(Path(sys.executable).parent)) is None,
    reason="no GoNB next to .venv's Python (bootstrap builds it)",
)
def test_sdk_go_context_on_gonb(codes: CodesAdapterSync, execd: Execd) -> None:
    """Go cells run in GoNB: a whole program (as OpenSandbox's suite sends) prints; declarations
    last across cells, each cell's statements run as its main; a compile error is the cell's
    error; an interrupt stops a running cell and the context goes on; deleting the context ends
    gopls too, which GoNB starts in a process group of its own."""
    context = codes.create_context(SupportedLanguageSync.GO)
    assert context.language == "go"
    program = 'package main\nimport "fmt"\nfunc main() {\n    fmt.Print("Hello from Go! ", 2+2)\n}'
    hello = codes.run(program, context=context)
    assert hello.error is None, hello.error
    assert "".join(m.text for m in hello.logs.stdout) == "Hello from Go! 4"
    declared = codes.run("func double(n int) int { return 2 * n }\nvar base = 21", context=context)
    assert declared.error is None, declared.error
    used = codes.run('%%\nfmt.Println("double:", double(base))', context=context)
    assert used.error is None and "".join(m.text for m in used.logs.stdout) == "double: 42\n"
    broken = codes.run("%%\nundeclaredVariable++", context=context)
    assert broken.error is not None and "undefined: undeclaredVariable" in "".join(
        [broken.error.value, *broken.error.traceback]
    )
    spun = interrupt_mid_cell(
        codes, context, '%%\nfmt.Println("spin")\nfor i := 0; ; i++ { time.Sleep(time.Millisecond) }'
    )
    # GoNB stops the cell's program and says so on stderr; the cell itself is no error
    assert "signal: interrupt" in "".join(m.text for m in spun.logs.stderr)
    again = codes.run('%%\nfmt.Println("after:", double(4))', context=context)
    assert again.error is None and "".join(m.text for m in again.logs.stdout) == "after: 8\n"
    # the context's kernel and the spare execd started beside it, each with its gopls
    sessions = {kernel: session_members(kernel) for kernel in kernels_of(execd, b"gonb")}
    assert all(len(members) > 1 for members in sessions.values()), sessions
    codes.delete_context(context.id)
    deadline = time.monotonic() + 10
    while all(session_members(k) for k in sessions) and time.monotonic() < deadline:
        time.sleep(0.05)
    ended = [k for k in sessions if not session_members(k)]
    assert len(ended) == 1, f"no Go context's session ended whole: {sessions}"  # gopls included


def session_members(sid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found
