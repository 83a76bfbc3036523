"""The server's vault-notice socket (lifecycle/vault_notices.py): `sandgate vault put/rm` hears
back only once the server pushed; the socket is its owner's only; no server, no wait."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from sandgate.lifecycle.vault_notices import VaultNoticeError, VaultNotices, notice_socket, tell_server


def test_a_notice_is_answered_after_the_push_with_how_many_were_pushed(tmp_path: Path) -> None:
    pushed: list[list[str]] = []

    def push(names: list[str]) -> int:
        pushed.append(names)
        return 3

    notices = VaultNotices(tmp_path, push)
    notices.start()
    try:
        assert stat.S_IMODE(notice_socket(tmp_path).stat().st_mode) == 0o600
        assert tell_server(tmp_path, ["team-token"]) == 3
        assert pushed == [["team-token"]]
    finally:
        notices.stop()
    assert not notice_socket(tmp_path).exists()
    assert tell_server(tmp_path, ["team-token"]) is None  # no server: nothing waits
    assert pushed == [["team-token"]]


def test_a_failed_push_is_the_commands_error_and_the_server_goes_on(tmp_path: Path) -> None:
    calls = []

    def push(names: list[str]) -> int:
        calls.append(names)
        if len(calls) == 1:
            raise RuntimeError("node agent https://10.0.0.7:15443: PUT -> 503")
        return 1

    notices = VaultNotices(tmp_path, push)
    notices.start()
    try:
        with pytest.raises(VaultNoticeError, match=r"10\.0\.0\.7"):
            tell_server(tmp_path, ["a"])
        assert tell_server(tmp_path, ["a"]) == 1
    finally:
        notices.stop()


def test_a_malformed_notice_changes_nothing(tmp_path: Path) -> None:
    pushed: list[list[str]] = []
    notices = VaultNotices(tmp_path, lambda names: pushed.append(names) or 0)
    notices.start()
    try:
        for line in (b"not json\n", b'{"changed": "a"}\n', b'{"other": []}\n'):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(notice_socket(tmp_path)))
                sock.sendall(line)
                assert b'"error"' in sock.makefile("rb").readline()
    finally:
        notices.stop()
    assert pushed == []


def test_a_socket_left_by_a_gone_server_is_no_server(tmp_path: Path) -> None:
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(notice_socket(tmp_path)))
    left.close()  # the file stays, nobody listens
    assert tell_server(tmp_path, ["a"]) is None
