"""`sandgate logs` against a state dir written by the proxy's writer: the real command in this
process (tests/support/cli.py), and `--follow` as a real subprocess that runs until stopped."""

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
from tests.support.cli import Ran, sandgate

SANDGATE = [sys.executable, "-m", "sandgate.lifecycle.cli"]  # `--follow` runs until stopped


def logs(state: Path, *args: str) -> Ran:
    return sandgate("--state-dir", str(state), "logs", *args)


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
    for since in ("whenever", "1x"):
        bad = logs(path, "--since", since)
        assert bad.returncode == 2 and bad.stdout == ""
        assert bad.stderr.startswith(f"Error: --since: time '{since}' is not understood; use ")
        assert "90s, 15m, 1h, 2d, 1w" in bad.stderr and "RFC 3339" in bad.stderr
        assert bad.stderr.count("\n") == 1 and "pydantic" not in bad.stderr  # one line, no dump or URL


def test_sandbox_by_the_prefix_the_table_shows(tmp_path: Path) -> None:
    ids = ["449f5803-faf9-4f0d-847d-8044b8d3f15c", "449f5803-faf9-4f0d-847d-99aa00000000", "4a2cf999-0"]
    records = generated(60)
    for n, record in enumerate(records):
        record["sandbox"] = ids[n % 3]
    write_records(tmp_path, records)
    table = logs(tmp_path, "--limit", "1000").stdout.splitlines()[1:]
    shown = {line.split()[2] for line in table}  # TIME is two words, then SANDBOX
    assert shown == {"449f5803-faf9-4f0d-847d…", "4a2cf999-0"}  # two ids look alike, cut short

    ambiguous = logs(tmp_path, "--sandbox", "449f5803-faf9-4f0d-847d…")
    assert ambiguous.returncode == 1
    assert ambiguous.stderr == (
        "Error: --sandbox '449f5803-faf9-4f0d-847d…' is the start of several sandbox ids "
        f"({ids[0]}, {ids[1]}); give more of it\n"
    )
    for given, wanted in (("449f5803-faf9-4f0d-847d-80", ids[0]), ("4a2c", ids[2]), (ids[1], ids[1])):
        found = logs(tmp_path, "--sandbox", given, "-o", "json", "--limit", "1000")
        assert found.returncode == 0, found.stderr
        got = [json.loads(line)["sandbox"] for line in found.stdout.splitlines()]
        assert got == [wanted] * 20


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
