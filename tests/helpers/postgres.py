"""The machine's PostgreSQL for a Prefect server under test: the packaged cluster started if down, a role
with a password (TCP on 127.0.0.1 asks for one) and a fresh database, dropped afterwards.

    with postgres_database("imagebatch_test") as url:                  # None when PostgreSQL is absent
        with running_prefect_server(tmp / "pg", database_url=url) as server: ...
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PG_PASSWORD", "PG_ROLE", "postgres_database", "postgres_database_url"]

PG_ROLE = "imagebatch"
PG_PASSWORD = "imagebatch-local-test"  # loopback only, a throwaway cluster's test role
"""The password of the `imagebatch` role `postgres_database_url` creates (TCP on 127.0.0.1 asks for one)."""


def _cluster() -> tuple[str, str, int, str] | None:
    """(version, name, port, status) of the first cluster `pg_lsclusters` lists, or None."""
    if not (shutil.which("pg_lsclusters") and shutil.which("pg_ctlcluster")):
        return None
    out = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2].isdigit():
            return fields[0], fields[1], int(fields[2]), fields[3]
    return None


def _psql(sql: str, database: str = "postgres") -> None:
    """Run `sql` as the `postgres` superuser over the socket (PostgreSQL's tools refuse to run as root)."""
    cmd = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", database]
    if os.geteuid() == 0:
        cmd = ["su", "postgres", "-c", " ".join(cmd)]
    elif os.environ.get("USER") != "postgres":
        cmd = ["sudo", "-n", "-u", "postgres", *cmd]
    done = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"psql failed ({done.returncode}): {done.stderr.strip()}")


@contextmanager
def postgres_database(dbname: str) -> Iterator[str | None]:
    """`postgres_database_url(dbname)` for the block, the database dropped after it: a test run leaves no
    database behind (each run's names differ, so that two checkouts' runs at once never share one)."""
    url = postgres_database_url(dbname)
    try:
        yield url
    finally:
        if url is not None:
            with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                _psql(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE);")


def postgres_database_url(dbname: str) -> str | None:
    """A fresh, empty database `dbname` on the machine's PostgreSQL, for a Prefect server, as an asyncpg URL.

    Starts the packaged cluster when it is down (`pg_ctlcluster --skip-systemctl-redirect VERSION NAME
    start`), creates or updates the role `imagebatch` (password `PG_PASSWORD`), drops and recreates
    `dbname` owned by it. Returns None when PostgreSQL is not installed (callers skip, saying so); raises
    when it is installed but cannot be started or set up (a real failure, not a skip).
    """
    if not dbname.replace("_", "").isalnum():
        raise ValueError(f"database name must be letters, digits and _: {dbname!r}")
    with _postgres_setup_lock():
        return _set_up_database(dbname)


@contextmanager
def _postgres_setup_lock() -> Iterator[None]:
    """One test process at a time starts the cluster and creates the role (test runs may share a machine, and
    two `pg_ctlcluster start` or two `CREATE ROLE` at once make the second fail)."""
    with open(Path(tempfile.gettempdir()) / "imagebatch-tests-postgres.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _set_up_database(dbname: str) -> str | None:
    cluster = _cluster()
    if cluster is None:
        return None
    version, name, port, status = cluster
    if status != "online":
        done = subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0 and (_cluster() or ("", "", 0, ""))[3] != "online":
            raise RuntimeError(f"could not start PostgreSQL {version}/{name}: {done.stderr.strip()}")
    _psql(
        f"""
        DO $$ BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PG_ROLE}') THEN
            CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}';
          ELSE
            ALTER ROLE {PG_ROLE} LOGIN PASSWORD '{PG_PASSWORD}';
          END IF;
        END $$;
        DROP DATABASE IF EXISTS {dbname} WITH (FORCE);
        CREATE DATABASE {dbname} OWNER {PG_ROLE};
        """
    )
    return f"postgresql+asyncpg://{PG_ROLE}:{PG_PASSWORD}@127.0.0.1:{port}/{dbname}"
