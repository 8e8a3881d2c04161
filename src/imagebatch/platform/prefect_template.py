"""A ready-made database for Prefect's temporary server, so a first run does not wait for one to be built.

A Prefect home without a database makes the temporary server run every one of Prefect's migrations and
register its block types before it answers: 4-5 s of a first run (bench/README.md, "First run"), paid on
every new machine, container and CI job. imagebatch ships that database, made by Prefect's own code
(`create_db`, then the block registration its server runs at start) for the installed Prefect version,
gzipped (15 KB), and copies it into an empty Prefect home before the server starts. The server then finds
its schema at Alembic's head and registers its block types again (upserts, as on any start whose memo does
not match), so it is the same server with the same records; only the wait is gone.

It is used only when it is certainly what Prefect would have made: the default SQLite database
(`PREFECT_HOME/prefect.db`; no database URL in the environment, the active profile or the working folder's
Prefect files), no file of that database yet, and a template made by the installed Prefect version.
Otherwise nothing is copied and Prefect builds its database as usual. Two runs starting at once copy it
once (the file appears by `link`, whole or not at all). The template holds no secret: Prefect's
`configuration` table (where the server keeps the key it encrypts blocks with) is empty in it, and stays
so until a server of the user's makes its own key (a test checks).

After upgrading Prefect: `python -m imagebatch.platform.prefect_template` writes the new version's template
(and a test fails until it exists).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.metadata
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

TEMPLATES = Path(__file__).with_name("prefect_db")
"""Where the templates live: `prefect-<version>.db.gz`, one per Prefect version."""

_DATABASE_SETTINGS = ("DATABASE", "database")
"""A Prefect setting naming a database (`PREFECT_SERVER_DATABASE_*`, `[server.database]` ...)."""


def template_path(version: str | None = None) -> Path:
    """The template for Prefect `version` (default: the installed one); it may not exist."""
    version = version or importlib.metadata.version("prefect")
    return TEMPLATES / f"prefect-{version}.db.gz"


def default_database(environ: Mapping[str, str], cwd: Path | None = None) -> Path | None:
    """The SQLite file Prefect's server will use, or None if its database may be configured elsewhere.

    Read without importing Prefect: any `PREFECT_*DATABASE*` variable, or a mention of a database in the
    profiles file or in the working folder's `prefect.toml`, `.env` or `pyproject.toml`, means "not the
    default" (then the template is not used; Prefect builds what it was told to)."""
    if any(k.startswith("PREFECT_") and "DATABASE" in k for k in environ):
        return None
    home = Path(environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    profiles = Path(environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    cwd = Path.cwd() if cwd is None else cwd
    for path in (profiles, cwd / "prefect.toml", cwd / ".env", cwd / "pyproject.toml"):
        with contextlib.suppress(OSError):
            if any(word in path.read_text(errors="replace") for word in _DATABASE_SETTINGS):
                return None
    return home / "prefect.db"


def seed_database(environ: Mapping[str, str] | None = None, template: Path | None = None) -> Path | None:
    """Copy the template into an empty Prefect home; return the database's path if this call made it.

    Never raises: a home that cannot be written, or anything unexpected, leaves Prefect to build its
    database as it would have (the template only saves time)."""
    environ = os.environ if environ is None else environ
    try:
        database = default_database(environ)
        if database is None:
            return None
        if any(Path(f"{database}{suffix}").exists() for suffix in ("", "-wal", "-shm", "-journal")):
            return None
        template = template or template_path()  # asks the installed version: only for an empty home
        if not template.is_file():
            return None
        database.parent.mkdir(parents=True, exist_ok=True)
        return database if _copy_once(template, database) else None
    except Exception:  # the template is an optimisation: never a reason for a run to fail
        return None


def _copy_once(template: Path, database: Path) -> bool:
    """Unpack `template` next to `database`, then link it into place: whole, and only if still absent."""
    fd, tmp = tempfile.mkstemp(prefix=".prefect-template-", dir=database.parent)
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(template, "rb") as src:
            shutil.copyfileobj(src, out)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, database)  # fails if another run put its copy there first
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def build_template(out: Path | None = None) -> Path:
    """Make the template for the installed Prefect version with Prefect's own code (in a fresh database
    of a throwaway home): its migrations, then its block registration. Imports Prefect's server."""
    out = out or template_path()
    with tempfile.TemporaryDirectory() as home:
        database = Path(home) / "prefect.db"
        os.environ["PREFECT_HOME"] = home
        os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{database}"
        _create(database)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(database, "rb") as src, gzip.GzipFile(out, "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    return out


def _create(database: Path) -> None:
    import asyncio
    import sqlite3

    from prefect.server.database import provide_database_interface
    from prefect.server.models.block_registration import run_block_auto_registration

    async def create() -> None:
        db = provide_database_interface()
        await db.create_db()
        async with await db.session() as session:
            await run_block_auto_registration(session=session)
            await session.commit()
        await (await db.engine()).dispose()

    asyncio.run(create())
    with contextlib.closing(sqlite3.connect(database)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")


if __name__ == "__main__":
    print(build_template(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
