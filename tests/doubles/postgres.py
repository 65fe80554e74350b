"""A throwaway PostgreSQL server for tests and benchmarks: `initdb` in a temporary folder, started
with `pg_ctl` on a Unix socket in that folder (or a loopback port), removed on `stop`.

Found on PATH or in Debian's /usr/lib/postgresql/<version>/bin. `initdb` refuses to run as root:
as root, the server runs as the `postgres` user (Debian's package makes it) through `runuser`.
`unavailable()` says why none can be started here (a test skips with that reason).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: the server's tuning for tests: no fsync (a test's data need not survive a power cut), small
FAST = ("-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
COMMON = ("-c", "max_connections=300", "-c", "shared_buffers=64MB", "-c", "log_min_messages=warning")


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def _runas() -> list[str] | None:
    """The prefix that runs a command as a user initdb accepts (None: there is none)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return None
    runuser = shutil.which("runuser")
    return [runuser, "-u", "postgres", "--"] if runuser else None


def unavailable() -> str | None:
    """Why no PostgreSQL server can be started here; None when one can."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    if _bin_dir() is None:
        return (
            "PostgreSQL is not installed: no initdb on PATH or in /usr/lib/postgresql/*/bin "
            "(apt-get install postgresql)"
        )
    if _runas() is None:
        return "running as root without a 'postgres' user (and runuser) to run initdb as"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """`with PostgresServer() as pg: url = pg.create_database("t1")`. `tcp`: listen on 127.0.0.1
    (a benchmark's network path) instead of the folder's socket; `durable`: fsync as in production."""

    def __init__(self, *, tcp: bool = False, durable: bool = False) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.bin = _bin_dir()
        self.prefix = _runas() or []
        self.tcp = tcp
        self.durable = durable
        self.port = free_port()
        # short (a socket path is at most 107 bytes) and readable by the server's user
        self.root = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
        self.data = self.root / "data"
        self._databases = 0

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.bin is not None
        command = [*self.prefix, str(self.bin / args[0]), *args[1:]]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    def start(self) -> PostgresServer:
        if self.prefix:
            shutil.chown(self.root, user="postgres", group=None)
        made = self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                         "--locale=C", "--no-sync")  # fmt: skip
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stderr.strip()[-500:]}")
        listen = "127.0.0.1" if self.tcp else ""
        options = [
            "-k", str(self.root), "-p", str(self.port), "-c", f"listen_addresses={listen}",
            *COMMON, *(() if self.durable else FAST),
        ]  # fmt: skip
        started = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                            "-o", " ".join(f"'{o}'" if " " in o else o for o in options), "start")  # fmt: skip
        if started.returncode != 0:
            server_log = self.root / "server.log"
            log = server_log.read_text(errors="replace")[-1000:] if server_log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()[-500:]} {log}")
        return self

    def stop(self) -> None:
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url(self, dbname: str = "postgres") -> str:
        if self.tcp:
            return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"
        return f"postgresql://postgres@/{dbname}?host={self.root}&port={self.port}"

    def create_database(self, name: str | None = None) -> str:
        """A fresh database; its URL."""
        import psycopg

        self._databases += 1
        name = name or f"relay_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.url(name)

    def wait_ready(self, seconds: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + seconds
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
