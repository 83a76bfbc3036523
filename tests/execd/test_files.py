"""File routes against a real execd with --root: SDK round trips, wire details, and refusals that
leave the disk untouched."""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)

from sandgate.execd.files import replace_stream
from tests.support.tiers import examples

from .conftest import Execd


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """Every entry under root with its mode, size and content (or link target)."""
    state: dict[str, tuple[int, int, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            state[str(path)] = (st.st_mode, 0, os.readlink(path))
        elif path.is_file():
            state[str(path)] = (st.st_mode, st.st_size, path.read_bytes() if st.st_size < 1 << 20 else b"big")
        else:
            state[str(path)] = (st.st_mode, 0, "dir")
    return state


def multipart(*pairs: tuple[dict[str, Any], bytes]) -> tuple[bytes, str]:
    boundary = "sandgate-test-boundary"
    body = b""
    for metadata, content in pairs:
        body += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"; filename="metadata"\r\n'
            f"Content-Type: application/json\r\n\r\n{json.dumps(metadata)}\r\n"
        ).encode()
        body += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
            + content
            + b"\r\n"
        )
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture
def tree(execd_root: Path) -> Iterator[Path]:
    """A small tree under the root, removed afterwards."""
    top = execd_root / "tree"
    (top / "src" / "pkg").mkdir(parents=True)
    (top / "src" / "main.py").write_text("print('main')\n")
    (top / "src" / "pkg" / "util.py").write_text("x = 1\n")
    (top / "src" / "pkg" / "notes.txt").write_text("notes\n")
    (top / "README.md").write_text("readme\n")
    (top / "link-to-src").symlink_to("src")
    yield top
    import shutil

    shutil.rmtree(top, ignore_errors=True)


# -- through the real SDK --------------------------------------------------------------------------


def test_sdk_write_read_info_and_permissions(execd: Execd, execd_root: Path) -> None:
    files = execd.sdk_files()
    files.write_files(
        [
            WriteEntry(path="/sdk/text.txt", data="line 1\nline 2\nline 3\n", mode=640),
            WriteEntry(path="/sdk/deep/bytes.bin", data=bytes(range(256)), mode=600),
            WriteEntry(path="/sdk/stream.bin", data=io.BytesIO(b"streamed" * 1000)),
        ]
    )
    assert (execd_root / "sdk/text.txt").stat().st_mode & 0o7777 == 0o640
    assert (execd_root / "sdk/deep/bytes.bin").read_bytes() == bytes(range(256))
    assert files.read_file("/sdk/text.txt") == "line 1\nline 2\nline 3\n"
    assert files.read_bytes("/sdk/stream.bin") == b"streamed" * 1000
    assert files.read_file("/sdk/text.txt", range_header="bytes=5-9") == "1\nlin"
    assert files.read_file("/sdk/text.txt", offset=2, limit=1) == "line 2\n"
    info = files.get_file_info(["/sdk/text.txt", "/sdk/deep"])
    assert info["/sdk/text.txt"].mode == 640 and info["/sdk/text.txt"].size == 21
    assert info["/sdk/deep"].entry_type == "directory"
    files.set_permissions([SetPermissionEntry(path="/sdk/text.txt", mode=604)])
    assert (execd_root / "sdk/text.txt").stat().st_mode & 0o7777 == 0o604
    if os.geteuid() == 0:
        files.set_permissions([SetPermissionEntry(path="/sdk/text.txt", owner="nobody", mode=644)])
        assert (execd_root / "sdk/text.txt").stat().st_uid == 65534


def test_sdk_search_list_move_replace_delete(execd: Execd, tree: Path) -> None:
    files = execd.sdk_files()
    found = files.search(SearchEntry(path="/tree", pattern="*.py"))
    assert sorted(e.path for e in found) == ["/tree/src/main.py", "/tree/src/pkg/util.py"]
    everything = files.search(SearchEntry(path="/tree", pattern="**"))
    assert "/tree/link-to-src" in {e.path for e in everything}
    assert not [e for e in everything if e.path.startswith("/tree/link-to-src/")]
    listing = files.list_directory(DirectoryListEntry(path="/tree", depth=2))
    assert [e.path for e in listing] == [
        "/tree/README.md",
        "/tree/link-to-src",
        "/tree/src",
        "/tree/src/main.py",
        "/tree/src/pkg",
    ]
    assert {e.path: e.entry_type for e in listing}["/tree/link-to-src"] == "symlink"
    files.move_files([MoveEntry(src="/tree/README.md", dest="/tree/docs/README.md")])
    assert (tree / "docs/README.md").read_text() == "readme\n"
    results = files.replace_contents_detailed(
        [ContentReplaceEntry(path="/tree/src/main.py", old_content="main", new_content="MAIN")]
    )
    assert results[0].replaced_count == 1 and (tree / "src/main.py").read_text() == "print('MAIN')\n"
    files.delete_files(["/tree/src/main.py"])
    files.create_directories([WriteEntry(path="/tree/new/nested", mode=700)])
    assert (tree / "new/nested").stat().st_mode & 0o777 == 0o700
    files.delete_directories(["/tree/new"])
    assert not (tree / "src/main.py").exists() and not (tree / "new").exists()


# -- wire details --------------------------------------------------------------------------------


def test_upload_pairs_modes_and_kept_mode(execd: Execd, execd_root: Path) -> None:
    body, content_type = multipart(
        ({"path": "/up/a.sh", "mode": 755}, b"#!/bin/sh\n"), ({"path": "/up/b.txt", "mode": "600"}, b"b")
    )
    with execd.client() as client:
        assert (
            client.post("/files/upload", content=body, headers={"content-type": content_type}).status_code
            == 200
        )
        assert (execd_root / "up/a.sh").stat().st_mode & 0o7777 == 0o755
        assert (execd_root / "up/b.txt").stat().st_mode & 0o7777 == 0o600
        body, content_type = multipart(({"path": "/up/b.txt"}, b"again"))
        client.post("/files/upload", content=body, headers={"content-type": content_type}).raise_for_status()
    assert (execd_root / "up/b.txt").read_bytes() == b"again"
    assert (execd_root / "up/b.txt").stat().st_mode & 0o7777 == 0o600
    assert not [p for p in (execd_root / "up").iterdir() if p.name.startswith(".")]


def test_download_ranges_and_lines(execd: Execd, execd_root: Path) -> None:
    (execd_root / "ranges.txt").write_bytes(b"0123456789")
    (execd_root / "lines.txt").write_bytes(b"a\nb\nc\nd")
    with execd.client() as client:
        full = client.get("/files/download", params={"path": "/ranges.txt"})
        assert full.status_code == 200 and full.content == b"0123456789"
        assert full.headers["content-length"] == "10"
        part = client.get("/files/download", params={"path": "/ranges.txt"}, headers={"Range": "bytes=2-4"})
        assert part.status_code == 206 and part.content == b"234"
        assert part.headers["content-range"] == "bytes 2-4/10"
        suffix = client.get("/files/download", params={"path": "/ranges.txt"}, headers={"Range": "bytes=-3"})
        assert suffix.content == b"789" and suffix.headers["content-range"] == "bytes 7-9/10"
        open_end = client.get(
            "/files/download", params={"path": "/ranges.txt"}, headers={"Range": "bytes=8-"}
        )
        assert open_end.content == b"89"
        beyond = client.get("/files/download", params={"path": "/ranges.txt"}, headers={"Range": "bytes=10-"})
        assert beyond.status_code == 416 and beyond.headers["content-range"] == "bytes */10"
        bad = client.get(
            "/files/download", params={"path": "/ranges.txt"}, headers={"Range": "bytes=1-2,4-5"}
        )
        assert bad.status_code == 400
        both = client.get(
            "/files/download", params={"path": "/ranges.txt", "offset": 1}, headers={"Range": "bytes=0-1"}
        )
        assert both.status_code == 400
        lines = client.get("/files/download", params={"path": "/lines.txt", "offset": 2, "limit": 2})
        assert lines.text == "b\nc\n" and lines.headers["content-type"].startswith("text/plain")
        assert client.get("/files/download", params={"path": "/lines.txt", "offset": 4}).text == "d"
        assert client.get("/files/download", params={"path": "/lines.txt", "offset": 0}).status_code == 400


def test_search_by_relative_path_pattern(execd: Execd, tree: Path) -> None:
    with execd.client() as client:
        found = client.get("/files/search", params={"path": "/tree", "pattern": "src/**/*.txt"}).json()
        assert [e["path"] for e in found] == ["/tree/src/pkg/notes.txt"]
        top_only = client.get("/files/search", params={"path": "/tree", "pattern": "*/*.py"}).json()
        assert [e["path"] for e in top_only] == ["/tree/src/main.py"]


def test_list_refuses_a_symlink_path_and_depth_zero_is_empty(execd: Execd, tree: Path) -> None:
    with execd.client() as client:
        assert client.get("/directories/list", params={"path": "/tree/link-to-src"}).status_code == 400
        assert client.get("/directories/list", params={"path": "/tree", "depth": 0}).json() == []


def test_replace_without_verbose_is_empty_and_keeps_mode(execd: Execd, execd_root: Path) -> None:
    target = execd_root / "replace.txt"
    target.write_text("a-a-a")
    target.chmod(0o751)
    with execd.client() as client:
        response = client.post("/files/replace", json={"/replace.txt": {"old": "a", "new": "bb"}})
    assert response.status_code == 200 and response.content == b""
    assert target.read_text() == "bb-bb-bb" and target.stat().st_mode & 0o777 == 0o751


@settings(max_examples=examples(200), deadline=None)
@given(
    data=st.binary(max_size=300),
    old=st.binary(min_size=1, max_size=5),
    new=st.binary(max_size=5),
    chunk=st.integers(1, 17),
)
def test_streaming_replace_equals_bytes_replace(data: bytes, old: bytes, new: bytes, chunk: int) -> None:
    source = io.BytesIO(data)
    out = io.BytesIO()
    count = replace_stream(lambda: source.read(chunk), out.write, old, new)
    assert out.getvalue() == data.replace(old, new)
    assert count == data.count(old)


# -- refusals: a clear 4xx and nothing changed on disk -----------------------------------------------


def _requests_that_must_fail(execd_root: Path) -> list[tuple[str, str, dict[str, Any], int]]:
    upload_escape = multipart(({"path": "/../outside.txt", "mode": 644}, b"x"))
    upload_bad_mode = multipart(({"path": "/refused/new/file.txt", "mode": 999}, b"x"))
    upload_bad_second = multipart(
        ({"path": "/refused/first.txt", "mode": 644}, b"x"),
        ({"path": "/refused/second.txt", "mode": "rwx"}, b"y"),
    )
    upload_no_file = (
        b'--b\r\nContent-Disposition: form-data; name="metadata"\r\n\r\n{"path": "/refused/x"}\r\n--b--\r\n',
        "multipart/form-data; boundary=b",
    )
    upload_no_path = multipart(({"mode": 644}, b"x"))

    def up(body: tuple[bytes, str]) -> dict[str, Any]:
        return {"content": body[0], "headers": {"content-type": body[1]}}

    return [
        ("GET", "/files/download", {"params": {}}, 400),
        ("GET", "/files/download", {"params": {"path": "/no/such/file"}}, 404),
        ("GET", "/files/download", {"params": {"path": "/../etc/passwd"}}, 400),
        ("GET", "/files/download", {"params": {"path": "/escape-rel/passwd"}}, 400),
        ("GET", "/files/download", {"params": {"path": "/escape-abs/passwd"}}, 404),
        ("GET", "/files/download", {"params": {"path": "/tree"}}, 400),
        ("GET", "/files/info", {"params": {"path": ["/tree/README.md", "/../etc"]}}, 400),
        ("GET", "/files/info", {"params": {"path": "/tree/missing"}}, 404),
        ("DELETE", "/files", {"params": {"path": ["/tree/README.md", "/tree/src"]}}, 400),
        ("DELETE", "/files", {"params": {"path": ["/tree/README.md", "/escape-rel/passwd"]}}, 400),
        ("DELETE", "/files", {"params": {}}, 400),
        ("POST", "/files/mv", {"json": [{"src": "/tree/README.md", "dest": "/../stolen"}]}, 400),
        ("POST", "/files/mv", {"json": [{"src": "/tree/nothing", "dest": "/tree/x"}]}, 404),
        ("POST", "/files/mv", {"json": [{"src": "/tree/README.md"}]}, 400),
        (
            "POST",
            "/files/permissions",
            {"json": {"/tree/README.md": {"mode": 777}, "/tree/src": {"mode": 8}}},
            400,
        ),
        (
            "POST",
            "/files/permissions",
            {"json": {"/tree/README.md": {"mode": 600, "owner": "no-such-user-x"}}},
            400,
        ),
        ("POST", "/files/permissions", {"json": {"/escape-rel/passwd": {"mode": 600}}}, 400),
        ("POST", "/files/replace", {"json": {"/tree/README.md": {"old": "", "new": "x"}}}, 400),
        (
            "POST",
            "/files/replace",
            {"json": {"/tree/README.md": {"old": "r", "new": "x"}, "/tree/src": {"old": "a", "new": "b"}}},
            400,
        ),
        ("GET", "/files/search", {"params": {"path": "/../"}}, 400),
        ("GET", "/files/search", {"params": {"path": "/tree", "pattern": "[abc"}}, 400),
        ("GET", "/directories/list", {"params": {"path": "/../.."}}, 400),
        ("GET", "/directories/list", {"params": {"path": "/tree", "depth": -1}}, 400),
        (
            "POST",
            "/directories",
            {"json": {"/refused/a": {"mode": 755}, "/../outside-dir": {"mode": 755}}},
            400,
        ),
        ("POST", "/directories", {"json": {"/refused/b": {"mode": 1999}}}, 400),
        ("DELETE", "/directories", {"params": {"path": "/"}}, 400),
        ("DELETE", "/directories", {"params": {"path": ["/tree/src", "/tree/README.md"]}}, 400),
        ("DELETE", "/directories", {"params": {"path": "/escape-rel"}}, 400),
        ("POST", "/files/upload", up(upload_escape), 400),
        ("POST", "/files/upload", up(upload_bad_mode), 400),
        ("POST", "/files/upload", up(upload_bad_second), 400),
        ("POST", "/files/upload", up(upload_no_file), 400),
        ("POST", "/files/upload", up(upload_no_path), 400),
        ("POST", "/files/upload", {"content": b"plain", "headers": {"content-type": "text/plain"}}, 400),
    ]


def test_bad_file_requests_change_nothing(execd: Execd, execd_root: Path, tree: Path) -> None:
    outside = execd_root.parent / "outside-of-root"
    outside.mkdir(exist_ok=True)
    (outside / "passwd").write_text("host secret\n")
    (execd_root / "escape-rel").symlink_to(os.path.relpath(outside, execd_root))
    (execd_root / "escape-abs").symlink_to(outside)
    try:
        before = snapshot(execd_root)
        outside_before = snapshot(execd_root.parent)
        with execd.client() as client:
            for method, path, options, status in _requests_that_must_fail(execd_root):
                response = client.request(method, path, **options)
                assert response.status_code == status, (method, path, options, response.text)
                error = response.json()
                assert error["code"] and len(error["message"]) > 10, error
                assert "host secret" not in response.text
        assert snapshot(execd_root) == before
        assert snapshot(execd_root.parent) == outside_before
    finally:
        (execd_root / "escape-rel").unlink()
        (execd_root / "escape-abs").unlink()


# -- 100 MiB up and down with flat memory ------------------------------------------------------------

BIG = 100 * 1024 * 1024
RSS_GROWTH_LIMIT_KIB = 48 * 1024


@contextmanager
def peak_rss(execd: Execd) -> Iterator[list[int]]:
    """Sample the execd process's RSS every 10 ms; yields a list that ends up holding the peak."""
    peak = [execd.rss_kib()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], execd.rss_kib())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


def test_100_mib_upload_and_download_with_flat_memory(execd: Execd, execd_root: Path, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with source.open("wb") as handle:
        for index in range(BIG // (1 << 20)):
            block = hashlib.sha256(str(index).encode()).digest() * (1 << 15)
            digest.update(block)
            handle.write(block)
    files = execd.sdk_files()
    files.write_file("/tiny.txt", "warm up")
    files.read_file("/tiny.txt")
    baseline = execd.rss_kib()

    with peak_rss(execd) as up_peak, source.open("rb") as handle:
        files.write_files([WriteEntry(path="/big/big.bin", data=handle, mode=644)])
    assert (execd_root / "big/big.bin").stat().st_size == BIG
    assert up_peak[0] - baseline < RSS_GROWTH_LIMIT_KIB, (baseline, up_peak[0])

    received = hashlib.sha256()
    with (
        peak_rss(execd) as down_peak,
        execd.client() as client,
        client.stream("GET", "/files/download", params={"path": "/big/big.bin"}) as response,
    ):
        assert response.status_code == 200 and response.headers["content-length"] == str(BIG)
        for chunk in response.iter_bytes(1 << 20):
            received.update(chunk)
    assert received.hexdigest() == digest.hexdigest()
    assert down_peak[0] - baseline < RSS_GROWTH_LIMIT_KIB, (baseline, down_peak[0])
    (execd_root / "big/big.bin").unlink()


def test_sdk_read_bytes_stream(execd: Execd, execd_root: Path) -> None:
    (execd_root / "streamed.bin").write_bytes(b"z" * 300_000)
    chunks = list(execd.sdk_files().read_bytes_stream("/streamed.bin", chunk_size=65536))
    assert b"".join(chunks) == b"z" * 300_000 and len(chunks) > 1


def test_info_path_is_the_clients_path(execd: Execd, execd_root: Path) -> None:
    (execd_root / "info.txt").write_text("i")
    with httpx.Client(base_url=execd.url) as client:
        info = client.get("/files/info", params={"path": "/info.txt"}).json()
    assert info["/info.txt"]["path"] == "/info.txt" and info["/info.txt"]["type"] == "file"
