"""`sandgate logs` run as a real subprocess against a state dir written by the proxy's writer."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.audit.conftest import generated, write_records

SANDGATE = [sys.executable, "-m", "sandgate.lifecycle.cli"]


def logs(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDGATE_")}
    return subprocess.run(
        [*SANDGATE, "--state-dir", str(state), "logs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    path = tmp_path_factory.mktemp("cli-state")
    records = generated(600)
    write_records(path, records, max_bytes=60_000)
    return path, records


def test_table_answers_what_was_denied_and_why(state: tuple[Path, list[dict[str, Any]]]) -> None:
    path, records = state
    result = logs(path, "--sandbox", "sbx-0002", "--decision", "deny", "--limit", "1000")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["TIME", "(UTC)", "SANDBOX", "KIND"]
    expected = sorted(
        (r for r in records if r["sandbox"] == "sbx-0002" and r["decision"] == "deny"), key=lambda r: r["ts"]
    )
    assert len(lines) - 1 == len(expected) > 0
    for line, record in zip(lines[1:], expected, strict=True):
        assert record["ts"][:19].replace("T", " ") in line and "deny" in line
        assert record["reason"][:40] in line
    assert "\x1b[" not in result.stdout, "no colour when stdout is not a terminal"
    coloured = logs(path, "--decision", "deny", "--limit", "3", "--color")
    assert "\x1b[31m" in coloured.stdout


def test_json_and_ocsf_output_and_cursor(state: tuple[Path, list[dict[str, Any]]]) -> None:
    path, records = state
    wanted = {r["id"] for r in records if r["binding"] == "github-token"}
    first = logs(path, "--binding", "github-token", "-o", "json", "--limit", "5")
    assert first.returncode == 0, first.stderr
    got = [json.loads(line) for line in first.stdout.splitlines()]
    assert len(got) == 5 and all(r["binding"] == "github-token" for r in got)
    assert [r["ts"] for r in got] == sorted(r["ts"] for r in got), "oldest first"
    cursor = first.stderr.split("--cursor ")[1].split()[0]
    rest = logs(path, "--binding", "github-token", "-o", "json", "--limit", "1000", "--cursor", cursor)
    ids = [json.loads(line)["id"] for line in rest.stdout.splitlines()] + [r["id"] for r in got]
    assert sorted(ids) == sorted(wanted)
    ocsf = logs(path, "--kind", "connection", "-o", "ocsf", "--limit", "10")
    events = [json.loads(line) for line in ocsf.stdout.splitlines()]
    assert len(events) == 10 and {e["class_uid"] for e in events} == {4001}


def test_summary_and_bad_input(state: tuple[Path, list[dict[str, Any]]]) -> None:
    path, records = state
    result = logs(path, "--summary", "--sandbox", "sbx-0000")
    assert result.returncode == 0, result.stderr
    mine = [r for r in records if r["sandbox"] == "sbx-0000"]
    assert f"{len(mine)} records" in result.stdout
    for title in ("Top hosts", "Denials by reason", "Injections by binding"):
        assert title in result.stdout
    bad = logs(path, "--since", "whenever")
    assert bad.returncode == 2 and "not understood" in bad.stderr


def test_follow_prints_new_records(tmp_path: Path) -> None:
    records = generated(30)
    write_records(tmp_path, records[:10])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDGATE_")}
    proc = subprocess.Popen(
        [*SANDGATE, "--state-dir", str(tmp_path), "logs", "-f", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 20
        wrote_more = False
        while len(seen) < 30 and time.monotonic() < deadline:
            if len(seen) == 10 and not wrote_more:
                write_records(tmp_path, records[10:])
                wrote_more = True
            with contextlib.suppress(queue.Empty):
                seen.append(json.loads(lines.get(timeout=0.5))["id"])
        assert seen == [r["id"] for r in records]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
