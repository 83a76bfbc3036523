"""The index follows the proxy's rotating JSONL: nothing lost, nothing doubled, resumable."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.lifecycle.audit import AuditFilter, AuditIndex, to_ocsf
from sandgate.lifecycle.audit.reader import RotatingLog
from sandgate.lifecycle.cli.groups.logs import request_text
from sandgate.proxy import INCOMPLETE, AuditRecord
from sandgate.proxy.audit import AuditLog
from tests.audit.conftest import generated, write_records


def open_index(state: Path) -> AuditIndex:
    return AuditIndex(state / "audit-index.db", state / "audit.jsonl")


def all_ids(index: AuditIndex) -> list[str]:
    return [row[0] for row in index._conn().execute("SELECT id FROM records")]


def test_rotation_during_load_loses_no_record(tmp_path: Path) -> None:
    records = generated(3000)
    index = open_index(tmp_path)
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=16_000, backups=1000)
    done = threading.Event()

    def writer() -> None:
        try:
            for record in records:
                log.write(AuditRecord.model_validate(record))
        finally:
            log.close()
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    passes = 0
    while not done.is_set() and passes < 100_000:  # index concurrently with the writer
        index.ingest(max_bytes=20_000)
        passes += 1
    thread.join()
    result = index.ingest()
    rotated = list(tmp_path.glob("audit.jsonl.*"))
    assert len(rotated) > 50, "the writer should have rotated many times during the load"
    ids = all_ids(index)
    assert len(ids) == len(set(ids)) == len(records)
    assert set(ids) == {r["id"] for r in records}
    assert not result.gap and index.ingest_stats().gaps == 0


def test_listing_taken_mid_rotation_skips_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact interleaving that lost 33 records under load: the directory is listed while the
    writer is halfway through renaming (.4 -> .5 and .3 -> .4 done, so no .3), and the writer
    finishes before the files are stat'ed. The old .2, by then at .3, must still be found."""
    live = tmp_path / "audit.jsonl"
    for number, name in enumerate(["live", "one", "two", "three", "four"]):
        (live.with_name(f"audit.jsonl.{number}") if number else live).write_text(name + "\n")
    backup = {n: live.with_name(f"audit.jsonl.{n}") for n in range(1, 6)}
    os.replace(backup[4], backup[5])
    os.replace(backup[3], backup[4])
    listing = list(tmp_path.iterdir())

    def listed_then_rotation_finishes(self: Path) -> Iterator[Path]:
        os.replace(backup[2], backup[3])
        os.replace(backup[1], backup[2])
        os.replace(live, backup[1])
        live.write_text("new\n")
        return iter(listing)

    monkeypatch.setattr(Path, "iterdir", listed_then_rotation_finishes)
    contents = [segment.path.read_text() for segment in RotatingLog(live).segments()]
    assert contents == ["four\n", "three\n", "two\n", "one\n", "live\n", "new\n"]


def test_resumes_from_saved_position_after_restart(tmp_path: Path) -> None:
    records = generated(900)
    write_records(tmp_path, records[:400], max_bytes=40_000)
    first = open_index(tmp_path)
    assert first.ingest().added == 400
    first.close()
    # The writer restarts (a new AuditLog on the same file) and rotates some more.
    write_records(tmp_path, records[400:], max_bytes=40_000)
    second = open_index(tmp_path)
    result = second.ingest()
    assert result.added == 500 and result.lines == 500, "only the new lines are read again"
    assert second.count() == 900
    assert second.ingest().lines == 0


def test_incomplete_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    record = AuditRecord.model_validate(generated(1)[0]).model_dump_json().encode()
    path = tmp_path / "audit.jsonl"
    path.write_bytes(record[:50])
    index = open_index(tmp_path)
    assert index.ingest().lines == 0
    with path.open("ab") as handle:
        handle.write(record[50:] + b"\n")
    assert index.ingest().added == 1


def test_malformed_lines_are_counted_and_skipped(tmp_path: Path) -> None:
    records = generated(3)
    write_records(tmp_path, records[:2])
    with (tmp_path / "audit.jsonl").open("a") as handle:
        handle.write('{"v":1,"kind":"request"}\nnot json at all\n')
    write_records(tmp_path, records[2:])
    index = open_index(tmp_path)
    result = index.ingest()
    assert (result.added, result.malformed) == (3, 2)
    assert index.ingest_stats().malformed_lines == 2


def test_file_rotated_away_unread_is_reported_as_gap(tmp_path: Path) -> None:
    records = generated(3000)
    write_records(tmp_path, records[:10], max_bytes=20_000, backups=2)
    index = open_index(tmp_path)
    assert index.ingest().added == 10
    # Far more than backups x max_bytes is written while nobody indexes: the oldest lines go.
    write_records(tmp_path, records[10:], max_bytes=20_000, backups=2)
    result = index.ingest()
    assert result.gap
    surviving = sum(1 for p in tmp_path.glob("audit.jsonl*") for _ in p.open())
    assert index.count() == 10 + surviving
    newest = index.page(AuditFilter(), 1).records[0]
    assert newest["id"] == records[-1]["id"]


def test_truncated_in_place_is_reread_from_start(tmp_path: Path) -> None:
    records = generated(20)
    write_records(tmp_path, records[:10])
    index = open_index(tmp_path)
    assert index.ingest().added == 10
    (tmp_path / "audit.jsonl").write_bytes(b"")  # copytruncate-style rotation
    write_records(tmp_path, records[10:12])
    result = index.ingest()
    assert result.added == 2 and result.gap
    assert index.count() == 12


def test_a_write_ahead_line_is_one_row_with_its_whole_record(tmp_path: Path) -> None:
    """A request's write-ahead line (`event: "incomplete"`) and its whole line share an id: the
    index keeps one row, the whole one, under a new seq (a follower sees it finish); a request
    whose response never ended keeps its incomplete row; a replayed line changes nothing."""
    index = open_index(tmp_path)
    log_path = tmp_path / "audit.jsonl"
    fields = {"kind": "request", "sandbox": "sbx", "client": "-", "decision": "allow", "reason": "r"}
    finished_ahead = AuditRecord(**fields, id="finished", path="/a", binding="api", event=INCOMPLETE)
    cut_off = AuditRecord(**fields, id="cut-off", path="/b", binding="api", event=INCOMPLETE)
    lines = [finished_ahead, cut_off]
    log_path.write_text("".join(record.model_dump_json() + "\n" for record in lines))
    index.ingest()
    [(first_seq, _)] = [(seq, r) for seq, r in index.after(0, AuditFilter()) if r["id"] == "finished"]
    whole = finished_ahead.model_copy(update={"event": None, "status": 200, "bytes_in": 5})
    with log_path.open("a") as handle:
        for record in (whole, finished_ahead, cut_off):  # the whole line, then two replays
            handle.write(record.model_dump_json() + "\n")
    index.ingest()
    rows = {r["id"]: (seq, r) for seq, r in index.after(0, AuditFilter())}
    assert sorted(rows) == ["cut-off", "finished"]
    seq, finished = rows["finished"]
    assert (finished["event"], finished["status"], finished["bytes_in"]) == (None, 200, 5)
    assert seq > first_seq, "the finished record is news to a follower"
    assert rows["cut-off"][1]["event"] == INCOMPLETE and rows["cut-off"][1]["status"] is None
    assert index.count(AuditFilter(sandbox="sbx")) == 2
    # and so the readers show it: the CLI's request column, the OCSF export's status
    assert request_text(rows["cut-off"][1]).endswith("[incomplete]")
    assert not request_text(finished).endswith("]")
    assert (to_ocsf(rows["cut-off"][1])["status"], to_ocsf(finished)["status"]) == ("Unknown", "Success")


def test_an_index_made_before_a_field_existed_gets_its_column(tmp_path: Path) -> None:
    old, new = generated(2)
    old["process"] = None
    new["process"] = {"pid": 4242, "sandbox_pid": 7, "exe": "/usr/bin/curl", "unknown": None}
    write_records(tmp_path, [old])
    index = open_index(tmp_path)
    index.ingest()
    index._conn().execute("ALTER TABLE records DROP COLUMN process")  # as an older server made it
    index.close()
    write_records(tmp_path, [new])
    reopened = open_index(tmp_path)
    assert reopened.ingest().added == 1
    assert reopened.get(old["id"]) == old and reopened.get(new["id"]) == new
    assert [r["id"] for r in reopened.of_process(new["sandbox"], 4242)] == [new["id"]]
