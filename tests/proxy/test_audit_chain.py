"""The audit file's hash chain: every writer (the proxy's rotating writer, a worker's oversized
line, lifecycle's lines) chains under one lock, across rotation and from other processes at
once; `verify_chain` finds an edited, removed, inserted or reordered line and a cut one; files
written before the chain stay readable."""

from __future__ import annotations

import itertools
import json
import multiprocessing
from pathlib import Path

from sandgate.proxy import verify_chain
from sandgate.proxy.audit import AuditFile
from sandgate.proxy.contract.chain import GENESIS, append_line, audit_files, line_hash

PAD = "x" * 80


def write_both(path: Path, count: int) -> None:
    """The proxy's writer (rotating at 2 KiB) and lifecycle's per-line appends, interleaved."""
    audit = AuditFile(path, 2048, 50)
    for n in range(count):
        audit.write(f'{{"proxy":{n},"pad":"{PAD}"}}\n'.encode())
        append_line(path, f'{{"lifecycle":{n}}}\n'.encode())
    audit.close()


def lifecycle_lines(path: Path, count: int) -> None:
    for n in range(count):
        append_line(path, f'{{"other":{n}}}\n'.encode())


def all_lines(path: Path) -> list[bytes]:
    return [line for file in audit_files(path) for line in file.read_bytes().splitlines()]


def test_the_chain_runs_through_rotation_and_both_writers(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    write_both(path, 60)
    assert len(audit_files(path)) > 5  # it rotated
    verdict = verify_chain(path)
    assert verdict.problems == [] and verdict.chained == verdict.lines == 120
    lines = all_lines(path)
    assert json.loads(lines[0])["prev"] == GENESIS
    for before, after in itertools.pairwise(lines):
        assert json.loads(after)["prev"] == line_hash(before)


def test_writers_in_other_processes_at_once_keep_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=write_both, args=(path, 150))] + [
        context.Process(target=lifecycle_lines, args=(path, 150)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    verdict = verify_chain(path)
    assert verdict.problems == [] and verdict.lines == 600


def test_verify_reports_edits_removals_reorders_and_cut_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for n in range(6):
        append_line(path, f'{{"n":{n}}}\n'.encode())
    clean = path.read_bytes().splitlines(keepends=True)

    def problems(lines: list[bytes]) -> list[tuple[int, str]]:
        path.write_bytes(b"".join(lines))
        return [(p.line, p.what) for p in verify_chain(path).problems]

    edited = [*clean]
    edited[2] = edited[2].replace(b'"n":2', b'"n":7')
    assert [line for line, _ in problems(edited)] == [4]  # the line after the edited one
    assert [line for line, _ in problems(clean[:2] + clean[3:])] == [3]  # removed: the next one breaks
    assert [line for line, _ in problems([clean[0], clean[2], clean[1], *clean[3:]])] == [2, 3, 4]
    assert problems(clean) == []
    path.write_bytes(b"".join(clean) + b'{"cut": "mid-li')  # a writer killed mid-line
    append_line(path, b'{"after": 1}\n')
    found = [(p.line, p.what) for p in verify_chain(path).problems]
    assert [line for line, _ in found] == [7] and "not a whole JSON line" in found[0][1]
    assert json.loads(path.read_bytes().splitlines()[-1])["after"] == 1  # the next line is whole


def test_old_unchained_lines_stay_readable_and_the_chain_starts_after_them(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"old": 1}\n{"old": 2}\n')
    append_line(path, b'{"new": 1}\n')
    verdict = verify_chain(path)
    assert (verdict.unchained_before, verdict.chained, verdict.problems) == (2, 1, [])
    assert json.loads(path.read_bytes().splitlines()[-1])["prev"] == line_hash(b'{"old": 2}')
    path.write_bytes(path.read_bytes() + b'{"sneaked": "in without a prev"}\n')
    assert [p.line for p in verify_chain(path).problems] == [4]
