"""The ready-made database of Prefect's temporary server (issue 23): what Prefect itself builds, copied once
into an empty home only, and served by a real temporary server."""

from __future__ import annotations

import contextlib
import gzip
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from imagebatch.platform.prefect_server import TemporaryServer
from imagebatch.platform.prefect_template import default_database, seed_database, template_path


def _facts(database: Path) -> dict[str, object]:
    """What must match between two databases built by Prefect: the schema, Alembic's revision, the block
    types registered, and an empty `configuration` (no encryption key made by anyone). A table's clauses are
    compared in any order: Alembic's batch migrations on SQLite write a rebuilt table's foreign keys in an
    order that differs from one build to the next."""
    with contextlib.closing(sqlite3.connect(database)) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        schema = sorted(
            (kind, name, sorted(line.strip(" ,") for line in (sql or "").split("\n")))
            for kind, name, sql in rows
        )
        return {
            "schema": schema,
            "revision": conn.execute("SELECT version_num FROM alembic_version").fetchall(),
            "block_types": sorted(r[0] for r in conn.execute("SELECT slug FROM block_type")),
            "configuration": conn.execute("SELECT * FROM configuration").fetchall(),
        }


def _unpack(template: Path, dest: Path) -> Path:
    dest.write_bytes(gzip.decompress(template.read_bytes()))
    return dest


@pytest.mark.slow  # a Prefect server of its own
def test_the_shipped_template_is_what_this_prefect_builds(tmp_path: Path) -> None:
    """Fails after a Prefect upgrade until the template is made again (`python -m
    imagebatch.platform.prefect_template`), and if the shipped file differs from Prefect's own build."""
    shipped = template_path()
    assert shipped.is_file(), (
        "no template for the installed Prefect: run python -m imagebatch.platform.prefect_template"
    )
    fresh = tmp_path / "fresh.db.gz"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    subprocess.run(
        [sys.executable, "-m", "imagebatch.platform.prefect_template", str(fresh)],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    ours, prefects = _facts(_unpack(shipped, tmp_path / "a.db")), _facts(_unpack(fresh, tmp_path / "b.db"))
    assert ours == prefects
    assert ours["revision"] and len(ours["block_types"]) > 10 and ours["configuration"] == []


def test_an_empty_home_is_seeded_and_a_used_one_left_alone(tmp_path: Path) -> None:
    env = {"PREFECT_HOME": str(tmp_path / "home")}
    database = seed_database(env)
    assert database == tmp_path / "home" / "prefect.db"
    with contextlib.closing(sqlite3.connect(database)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    database.write_bytes(b"the user's own database")
    assert seed_database(env) is None
    assert database.read_bytes() == b"the user's own database"
    other = {"PREFECT_HOME": str(tmp_path / "other")}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "prefect.db-wal").write_bytes(b"")  # a database in the middle of something
    assert seed_database(other) is None and not (tmp_path / "other" / "prefect.db").exists()
    assert not [p for p in (tmp_path / "home").iterdir() if p.name.startswith(".prefect-template")]


@pytest.mark.parametrize(
    "where",
    [
        "PREFECT_SERVER_DATABASE_CONNECTION_URL",
        "PREFECT_API_DATABASE_CONNECTION_URL",
        "profile",
        "prefect.toml",
    ],
)
def test_a_configured_database_is_never_seeded(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"PREFECT_HOME": str(home)}
    url = "postgresql+asyncpg://prefect@127.0.0.1/prefect"
    if where == "profile":
        (home / "profiles.toml").write_text(
            f'active = "x"\n[profiles.x]\nPREFECT_SERVER_DATABASE_CONNECTION_URL = "{url}"\n'
        )
    elif where == "prefect.toml":
        (tmp_path / "prefect.toml").write_text(f'[server.database]\nconnection_url = "{url}"\n')
    else:
        env[where] = url
    monkeypatch.chdir(tmp_path)
    assert default_database(env) is None
    assert seed_database(env) is None and not (home / "prefect.db").exists()


def test_runs_starting_at_once_copy_it_once(tmp_path: Path) -> None:
    env = {"PREFECT_HOME": str(tmp_path / "home")}
    start = threading.Barrier(8)
    made: list[Path | None] = []

    def seed() -> None:
        start.wait(timeout=60)
        made.append(seed_database(env))

    threads = [threading.Thread(target=seed) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [m for m in made if m is not None] == [tmp_path / "home" / "prefect.db"]
    assert len(made) == 8
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["prefect.db"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TemporaryServer]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    server = TemporaryServer(env).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow  # a Prefect server of its own
def test_the_temporary_server_runs_on_the_template(server: TemporaryServer, tmp_path: Path) -> None:
    """An empty home is seeded before the server starts, and the server keeps its records in that file."""
    database = tmp_path / "home" / "prefect.db"
    assert database.is_file()  # seeded by start(), before the server process could make its own
    api = server.wait_ready(timeout=120)
    with httpx.Client(base_url=api, timeout=30) as client:
        made = client.post("/flows/", json={"name": "seeded-home-check"})
        assert made.status_code in (200, 201), made.text
        assert client.get(f"/flows/{made.json()['id']}").json()["name"] == "seeded-home-check"
        assert client.post("/block_types/filter", json={}).json()  # the block types are there
    server.stop()
    with contextlib.closing(sqlite3.connect(database)) as conn:
        assert conn.execute("SELECT name FROM flow WHERE name = 'seeded-home-check'").fetchall()
