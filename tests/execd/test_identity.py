"""`/v1/filesystem/{uid}/{gid}/...` (the SDK's `files_with_identity`) against a real execd as root:
the kernel checks every file call as that user, and refusals change nothing."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.filesystem import SetPermissionEntry, WriteEntry

from .conftest import Execd
from .test_files import multipart, snapshot

NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = f"/v1/filesystem/{NOBODY.pw_uid}/{NOBODY.pw_gid}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching file identity needs root")


@pytest.fixture(scope="module")
def layout(execd_root: Path) -> Path:
    """A root-only secret, a root-owned read-only dir, and a dir nobody may write to."""
    execd_root.chmod(0o755)
    (execd_root / "secret.txt").write_text("root only")
    (execd_root / "secret.txt").chmod(0o600)
    (execd_root / "locked").mkdir(mode=0o755)
    (execd_root / "shared").mkdir()
    (execd_root / "shared").chmod(0o777)
    return execd_root


def test_sdk_files_with_identity_write_as_that_user(execd: Execd, layout: Path) -> None:
    files = execd.sdk_files().with_identity(NOBODY.pw_uid, NOBODY.pw_gid)
    files.write_files([WriteEntry(path="/shared/mine.txt", data="hello")])
    made = layout / "shared" / "mine.txt"
    assert (made.stat().st_uid, made.stat().st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert files.read_file("/shared/mine.txt") == "hello"
    info = files.get_file_info(["/shared/mine.txt"])["/shared/mine.txt"]
    assert (info.owner, info.group) == ("nobody", "nogroup")
    files.create_directories([SetPermissionEntry(path="/shared/sub/deeper", mode=750)])
    assert (layout / "shared" / "sub" / "deeper").stat().st_uid == NOBODY.pw_uid


def test_kernel_refuses_what_the_user_may_not_do(execd: Execd, layout: Path) -> None:
    files = execd.sdk_files().with_identity(NOBODY.pw_uid, NOBODY.pw_gid)
    before = snapshot(layout)
    with pytest.raises(SandboxApiException) as read:
        files.read_file("/secret.txt")
    assert read.value.status_code == 403
    with pytest.raises(SandboxApiException) as write:
        files.write_files([WriteEntry(path="/locked/new.txt", data="x")])
    assert write.value.status_code == 403
    with pytest.raises(SandboxApiException) as chown:
        files.set_permissions([SetPermissionEntry(path="/shared", owner="nobody", mode=777)])
    assert chown.value.status_code == 403
    assert snapshot(layout) == before
    # execd's own identity is untouched: the plain route still reads the root-only file
    assert execd.sdk_files().read_file("/secret.txt") == "root only"


@pytest.mark.parametrize(
    "prefix",
    ["/v1/filesystem/nobody/0", "/v1/filesystem/4294967295/0", "/v1/filesystem/0/-1", "/v1/filesystem/1e3/0"],
)
def test_bad_identity_is_400_and_uploads_nothing(execd: Execd, layout: Path, prefix: str) -> None:
    before = snapshot(layout)
    body, content_type = multipart(({"path": "/shared/refused.txt"}, b"data"))
    with execd.client() as client:
        response = client.post(f"{prefix}/files/upload", content=body, headers={"content-type": content_type})
        listed = client.get(f"{prefix}/directories/list", params={"path": "/"})
    assert response.status_code == 400 and listed.status_code == 400
    assert response.json()["code"] == "INVALID_REQUEST_BODY" and "0..4294967294" in response.json()["message"]
    assert snapshot(layout) == before
