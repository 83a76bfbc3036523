"""A real PostgreSQL (Debian's `postgresql`) on a free loopback port, for the database tests.

`initdb` makes a cluster in a temporary directory owned by the `postgres` user (PostgreSQL refuses
to run as root; `setpriv` drops to it and execs, so the PID we hold is the postmaster's), with
password (SCRAM) authentication for a superuser of the test's own; the server listens on TCP only
at the address given (its Unix socket in that directory) and is stopped by its PID, also when
the test fails, and the directory removed.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pg8000.dbapi

from tests.support.openbao import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
AS_POSTGRES = ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", "--"]
USER = "sandgate"
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    password: str
    database: str
    restart: Callable[[], None] = field(default=lambda: None, compare=False, repr=False)

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{self.password}@{self.host}:{self.port}/{self.database}"

    def connect(self) -> pg8000.dbapi.Connection:
        return pg8000.dbapi.connect(
            user=USER, password=self.password, host=self.host, port=self.port, database=self.database
        )

    def run(self, *statements: str) -> list[tuple[object, ...]]:
        """Each statement in turn on a connection of the test's own (the other side of the store);
        the last one's rows."""
        connection = self.connect()
        connection.autocommit = True
        try:
            cursor = connection.cursor()
            for statement in statements:
                cursor.execute(statement)
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        finally:
            connection.close()


def available() -> bool:
    return (BIN / "postgres").exists() and shutil.which("setpriv") is not None


class _Postmaster:
    """The server process of one data directory, started and stopped by PID."""

    def __init__(self, argv: list[str], log: Path, server: Postgres) -> None:
        self.argv, self.log, self.server = argv, log, server
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                self.argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        _wait_until_ready(self.server, self.process, self.log)

    def stop(self) -> None:
        """SIGTERM (PostgreSQL's smart shutdown), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """A fast shutdown (SIGINT: clients' connections are cut, as in a failover) and a start."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=30)
        self.start()


@contextlib.contextmanager
def postgres_server(host: str = "127.0.0.1", netns: str | None = None) -> Iterator[Postgres]:
    """PostgreSQL at `host` on a free port, in the network namespace `netns` (entered with
    nsenter) or this process's; a database `sandgate` made in it. The handle's `restart` cuts
    every client's connection and starts the server again on the same data."""
    port = free_port()
    password = secrets.token_urlsafe(18)
    enter = ["nsenter", f"--net=/run/netns/{netns}", "--"] if netns else []
    workdir = Path(tempfile.mkdtemp(prefix="sandgate-pg-"))  # not under pytest's 0700 root dirs
    try:
        shutil.chown(workdir, "postgres", "postgres")
        (workdir / "pwfile").write_text(password)
        shutil.chown(workdir / "pwfile", "postgres", "postgres")
        data = workdir / "data"
        subprocess.run(
            [*AS_POSTGRES, str(BIN / "initdb"), "-D", str(data), f"--username={USER}", "--auth=scram-sha-256",
             f"--pwfile={workdir / 'pwfile'}", "--encoding=UTF8", "--locale=C"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        with (data / "pg_hba.conf").open("a") as hba:  # clients on the listening address's own network
            hba.write("host all all samenet scram-sha-256\n")
        argv = [*enter, *AS_POSTGRES, str(BIN / "postgres"), "-D", str(data), "-h", host, "-p", str(port),
                "-k", str(workdir), "-c", "fsync=off"]  # fmt: skip
        postmaster = _Postmaster(argv, workdir / "postgres.log", Postgres(host, port, password, "postgres"))
        try:
            postmaster.start()
            connection = postmaster.server.connect()
            connection.autocommit = True
            connection.cursor().execute("CREATE DATABASE sandgate")
            connection.close()
            yield Postgres(host, port, password, "sandgate", postmaster.restart)
        finally:
            postmaster.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until_ready(server: Postgres, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            server.connect().close()
            return
        except (pg8000.dbapi.Error, OSError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"postgres did not answer within {START_TIMEOUT}s:\n{log.read_text()[-2000:]}"
                ) from exc
            time.sleep(0.2)
