"""The exec trail's pure core: which execd routes are operations, what a body and an answer say,
an upload's digests as it streams, and the kernel's process event datagrams."""

from __future__ import annotations

import hashlib
import json
import re
import struct

from sandgate.execd.app import ROUTES as EXECD_ROUTES
from sandgate.lifecycle.exec_trail import (
    JSON_BODY_MAX,
    OPERATIONS,
    OTHER_OPERATION,
    Outcome,
    UploadDigests,
    body_facts,
    operation,
    query_facts,
    terminal_input,
)
from sandgate.lifecycle.process_events import (
    PROC_EVENT_EXEC,
    PROC_EVENT_FORK,
    ProcEvent,
    parse_events,
    sandbox_of_cgroup,
)


def test_routes_are_operations_or_not() -> None:
    assert operation("POST", "/command") == (OPERATIONS[("POST", "/command")], None)
    assert operation("POST", "/session/abc/run")[0].name == "session_input"  # type: ignore[index]
    assert operation("DELETE", "/code/contexts/c1")[0].name == "context_close"  # type: ignore[index]
    found = operation("POST", "/v1/filesystem/1000/1000/files/upload")
    assert found is not None and found[0].name == "write" and found[1] == "1000:1000"
    for method, path in (
        ("GET", "/ping"),
        ("GET", "/command/status/x"),
        ("GET", "/metrics"),
        ("GET", "/code/contexts"),
        ("GET", "/pty/abc"),
    ):
        assert operation(method, path) is None


def test_a_route_is_read_as_execd_reads_it_and_an_unknown_one_is_recorded() -> None:
    # execd decodes percent-escapes before routing: /comman%64 runs POST /command
    assert operation("POST", "/comman%64") == (OPERATIONS[("POST", "/command")], None)
    assert operation("POST", "/files%2Fupload")[0].name == "write"  # type: ignore[index]
    assert operation("GET", "/p%69ng") is None
    # whatever the table does not know is recorded, never skipped
    for method, path in (("POST", "/new-route"), ("post", "/command"), ("PUT", "/files/upload")):
        assert operation(method, path) == (OTHER_OPERATION, None)
    assert operation("POST", "/v1/filesystem/0/0/command") == (OTHER_OPERATION, "0:0")  # file routes only
    attach = operation("GET", "/pty/s1/ws")
    assert attach is not None and attach[0].name == "pty_attach"
    assert query_facts(attach[0], "/pty/s1/ws", "since=0") == {"session": "s1"}


def test_every_route_execd_serves_has_a_row() -> None:
    """Each of execd's routes is an operation of the table or listed as doing nothing; only the
    isolated-session routes, which execd answers 503, fall to `other`."""
    for method, path, *targets in EXECD_ROUTES:
        found = operation(method, re.sub(r"\{\w+\}", "0", path))
        unsupported = "isolated:unsupported" in targets
        assert (found is not None and found[0] is OTHER_OPERATION) == unsupported, (method, path, found)


def test_a_terminal_message_gives_what_is_typed_and_signals() -> None:
    assert terminal_input(b"\x00ls -l\r") == (b"ls -l\r", None)
    assert terminal_input('{"type": "stdin", "data": "id\\n"}') == (b"id\n", None)
    assert terminal_input('{"type": "signal", "signal": "SIGINT"}') == (b"", "SIGINT")
    for other in (b"\x01output", '{"type": "resize", "cols": 80, "rows": 24}', "not json", "[1]"):
        assert terminal_input(other) == (b"", None)


def test_a_body_says_what_the_call_does_bounded_and_without_env_values() -> None:
    run = OPERATIONS[("POST", "/command")]
    facts = body_facts(
        run, json.dumps({"argv": ["ls", "-l", "a b"], "cwd": "/w", "envs": {"TOKEN": "v"}}).encode()
    )
    assert facts == {"command": "ls -l 'a b'", "cwd": "/w", "env_names": ["TOKEN"]}
    long = body_facts(run, json.dumps({"command": "x" * 5000}).encode())["command"]
    assert long.startswith("x" * 4096) and long.endswith("[904 more characters]")
    assert body_facts(run, b"not json") == {"unparsed_body": 8}
    padded = json.dumps({"command": "id", "envs": {"PAD": "x" * (2 * 1024 * 1024)}}).encode()
    assert len(padded) <= JSON_BODY_MAX and body_facts(run, padded)["command"] == "id"
    moves = body_facts(OPERATIONS[("POST", "/files/mv")], b'[{"src": "/a", "dest": "/b"}]')
    assert moves == {"moves": [{"src": "/a", "dest": "/b"}], "paths": ["/a"]}


def test_the_answer_gives_exit_code_and_run_id_across_chunks() -> None:
    frames = (
        b'{"type":"init","text":"r1"}\n\n{"type":"stdout","text":"hi"}\n\n'
        b'{"type":"error","error":{"ename":"CommandExecError","evalue":"3"}}\n\n'
    )
    outcome = Outcome()
    for start in range(0, len(frames), 7):  # arrives cut anywhere
        outcome.feed_frames(frames[start : start + 7])
    assert outcome.facts() == {"exit_code": 3, "run_id": "r1"}
    done = Outcome()
    done.feed_frames(b'{"type":"execution_complete","execution_time":1}\n\n')
    assert done.facts() == {"exit_code": 0}


def test_an_upload_is_hashed_as_it_streams() -> None:
    content = bytes(range(256)) * 1000
    body = (
        b'--b\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n{"path": "/x/y.bin"}\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
        + content
        + b"\r\n--b--\r\n"
    )
    digests = UploadDigests.for_content_type("multipart/form-data; boundary=b")
    for start in range(0, len(body), 4093):
        digests.feed(body[start : start + 4093])
    assert digests.facts() == {
        "files": [{"path": "/x/y.bin", "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}],
        "paths": ["/x/y.bin"],
    }
    assert UploadDigests.for_content_type("text/plain").facts()["body_problem"]


def _message(what: int, *fields: int) -> bytes:
    event = struct.pack("=IIQ", what, 0, 123) + struct.pack(f"={len(fields)}i", *fields)
    event += b"\0" * (24 - 4 * len(fields))
    cn_msg = struct.pack("=IIIIHH", 1, 1, 0, 0, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(cn_msg), 3, 0, 0, 0) + cn_msg


def test_process_event_datagrams_and_cgroups_are_read() -> None:
    assert parse_events(_message(PROC_EVENT_FORK, 10, 10, 11, 11)) == [
        ProcEvent(PROC_EVENT_FORK, 123, 11, 11, 10, 10)
    ]
    assert parse_events(_message(PROC_EVENT_EXEC, 11, 11)) == [ProcEvent(PROC_EVENT_EXEC, 123, 11, 11)]
    assert parse_events(b"\0" * 8) == []
    text = "8:pids:/sandgate-ab12cd-box-1\n0::/\n"
    assert sandbox_of_cgroup(text, "sandgate-ab12cd-") == "box-1"
    assert sandbox_of_cgroup("0::/user.slice/x\n", "sandgate-ab12cd-") is None
