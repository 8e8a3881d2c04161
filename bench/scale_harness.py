"""The harness of `bench_scale.py` (issue 9): what every subcommand measures with, not the subcommands.

Child processes and their CPU (`run_measured`, `tree_cpu`, `idle_rate`, `settle`), the emulator in its own
process (`Emulator`, `emulator`), a running Prefect server and its database (`Server`, `prefect_server`),
the manifest and the two runners (`write_manifest`, `run_peer`, `run_imagebatch`), and the helpers of the
tables and the JSON line (`machine`, `table`, `emit`, ...). How figures are taken: `bench_scale.py`'s
docstring. `bench_shards.py` and `bench_slots.py` use it too.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peer import DEFAULT_MODEL, request_body  # noqa: E402
from tests.helpers.postgres import postgres_database_url  # noqa: E402
from tests.helpers.prefect_server import PrefectServer, running_prefect_server  # noqa: E402

KEY = "bench-scale-key-0123456789abcdef"
CLI = [sys.executable, "-m", "imagebatch.cli.main"]
PEER = [sys.executable, str(ROOT / "bench" / "peer.py")]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROMPTS = 8  # distinct prompts cycled through the rows (the emulator's render cache holds 16)


# --- processes -------------------------------------------------------------------------------------------


def stop_group(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM the process group `proc` leads (it was started in its own session), SIGKILL after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group
    except ProcessLookupError:
        pass


def tree_cpu(pid: int) -> float:
    """CPU seconds (utime + stime, plus the reaped children's) of `pid` and every live descendant."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
        ppid = int(fields[1])
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        stats[int(entry)] = (ppid, ticks / CLK_TCK)
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if current in stats:
            total += stats[current][1]
        todo += [p for p, (ppid, _) in stats.items() if ppid == current]
    return total


def idle_rate(pid: int, seconds: float = 3.0) -> float:
    """CPU seconds per second that `pid`'s tree spends doing nothing for us (Prefect's loop services)."""
    c0, t0 = tree_cpu(pid), time.monotonic()
    time.sleep(seconds)
    return (tree_cpu(pid) - c0) / (time.monotonic() - t0)


def settle(pid: int, idle: float, quiet: float = 3.0, timeout: float = 300.0) -> float:
    """Wait until `pid`'s tree has used at most its idle rate (+3 %) for `quiet` s; return the wait."""
    t_start = last_busy = time.monotonic()
    before = tree_cpu(pid)
    while time.monotonic() - t_start < timeout:
        time.sleep(0.5)
        now = tree_cpu(pid)
        if now - before > (idle + 0.03) * 0.5:
            last_busy = time.monotonic()
        before = now
        if time.monotonic() - last_busy >= quiet:
            break
    return max(0.0, last_busy - t_start)


@dataclass
class Measured:
    """One child process, measured."""

    label: str
    code: int = -1
    wall_s: float = 0.0
    cpu_s: float = 0.0
    maxrss_mib: float = 0.0
    body_s: float | None = None
    ok: int = 0
    sent: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    server_cpu_s: float | None = None
    server_settle_s: float | None = None
    db_bytes: int | None = None
    emulator_cpu_s: float | None = None
    log_errors: int | None = None
    tail: str = ""


def run_measured(label: str, cmd: Sequence[str], env: dict[str, str], log: Path) -> Measured:
    """Run `cmd` in its own session, output to `log`; wall, CPU and peak RSS from `os.wait4`."""
    m = Measured(label)
    with log.open("wb") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            m.wall_s = time.perf_counter() - t0
            proc.returncode = m.code = os.waitstatus_to_exitcode(status)
        finally:
            if proc.returncode is None:
                stop_group(proc)
    m.cpu_s = usage.ru_utime + usage.ru_stime
    m.maxrss_mib = usage.ru_maxrss / 1024
    m.tail = log.read_text(errors="replace")[-2000:]
    return m


# --- the emulator --------------------------------------------------------------------------------------


class Emulator:
    """`imagebatch emulator` in its own process: its URL, admin calls and the CPU of its process."""

    def __init__(self, latency: float, jpeg_rate: float, thought_image_rate: float, log: Path) -> None:
        cmd = [
            *CLI,
            "emulator",
            "--port",
            "0",
            "--api-key",
            KEY,
            "--latency",
            str(latency),
            "--jpeg-rate",
            str(jpeg_rate),
            "--thought-image-rate",
            str(thought_image_rate),
        ]
        env = {k: v for k, v in os.environ.items() if k != "IMAGEBATCH_API_KEY"}
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            self.url = self._read_url(timeout=60)
        except BaseException:
            self.close()
            raise
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def _read_url(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline().decode() if ready else ""
        match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if not match:
            raise RuntimeError(f"emulator did not start: {line!r}")
        return match.group(1)

    def reset(self) -> None:
        self.http.post("/emulator/reset").raise_for_status()

    def warm(self, image_size: str = "1K", prompts: int = PROMPTS) -> None:
        """Render the cycled prompts once, so that neither runner pays the render cache's first misses."""
        headers = {"x-native-api-key": KEY}
        for n in range(prompts):
            row = {"prompt": f"Studio photo of product {n} on white", "image_size": image_size}
            body = request_body(row)
            path = f"/v1beta/models/{DEFAULT_MODEL}:generateContent"
            self.http.post(path, json=body, headers=headers).raise_for_status()
        self.reset()

    def requests_seen(self) -> int:
        return len(self.http.get("/emulator/requests").json())

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def close(self) -> None:
        if getattr(self, "http", None) is not None:
            self.http.close()
        stop_group(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


@contextmanager
def emulator(
    args: argparse.Namespace, latency: float, tmp: Path, sizes: Sequence[str] = ("1K",)
) -> Iterator[Emulator]:
    """The emulator for one benchmark, its render cache warmed for `sizes`; stopped on exit."""
    emu = Emulator(latency, args.jpeg_rate, args.thought_image_rate, tmp / "emulator.log")
    try:
        for size in sizes:
            emu.warm(size)
        yield emu
    finally:
        emu.close()


# --- Prefect's server and its database -------------------------------------------------------------------


@dataclass
class Server:
    info: PrefectServer
    database_url: str | None

    def db_bytes(self) -> int:
        if self.database_url is None:
            files = [*self.info.home.glob("*.db"), *self.info.home.glob("*.db-wal")]
            return sum(f.stat().st_size for f in files if f.exists())
        return asyncio.run(_pg_size(self.database_url))


async def _pg_size(url: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
    finally:
        await conn.close()


def _cluster_online() -> bool:
    out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False)
    return " online " in out.stdout


@contextmanager
def prefect_server(home: Path, database: str) -> Iterator[Server]:
    """A running Prefect server on SQLite (in `home`) or on the local PostgreSQL (a fresh database)."""
    if database == "sqlite":
        with running_prefect_server(home) as info:
            yield Server(info, None)
        return
    was_online = _cluster_online() if database == "postgres" else True
    dbname = "imagebatch_bench_scale"
    try:
        url = postgres_database_url(dbname)
        if url is None:
            raise SystemExit("PostgreSQL is not installed here (pg_lsclusters not found)")
        with running_prefect_server(home, database_url=url) as info:
            yield Server(info, url)
    finally:
        drop = ["su", "postgres", "-c", f"psql -X -q -c 'DROP DATABASE IF EXISTS {dbname} WITH (FORCE)'"]
        subprocess.run(drop, capture_output=True, check=False)
        if not was_online:  # we started the cluster: stop it again
            version, name = subprocess.run(
                ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False
            ).stdout.split()[:2]
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "stop"], check=False)


# --- the two runners ------------------------------------------------------------------------------------


def write_manifest(path: Path, rows: int, image_size: str = "1K", distinct: bool = False) -> None:
    """`rows` native text-to-image rows (one request each); prompts cycle through a few unless `distinct`."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "prompt", "image_size", "aspect_ratio", "sku"])
        for i in range(rows):
            n = i if distinct else i % PROMPTS
            writer.writerow(
                [f"item-{i:06d}", f"Studio photo of product {n} on white", image_size, "1:1", f"SKU-{i}"]
            )


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PREFECT_") and not k.startswith("IMAGEBATCH_")
    }
    return env | {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


PEER_CLIENTS = 1  # set from --peer-clients by `bench_scale.main` (read here, at each run)


def run_peer(label: str, manifest: Path, out: Path, emu: Emulator, concurrency: int) -> Measured:
    emu.reset()
    cmd = [*PEER, str(manifest), "--out", str(out), "--base-url", emu.url, "--api-key", KEY]
    cmd += ["--clients", str(PEER_CLIENTS)]
    e0 = emu.cpu()
    m = run_measured(label, [*cmd, "--concurrency", str(concurrency)], base_env(), out.with_suffix(".log"))
    m.emulator_cpu_s = emu.cpu() - e0
    lines = [line for line in m.tail.splitlines() if line.startswith("{")]
    if lines:
        summary = json.loads(lines[-1])
        m.body_s, m.ok, m.sent = summary["loop_s"], summary["ok"], summary["sent"]
        m.counts = summary["counts"] | ({"skipped": summary["skipped"]} if summary["skipped"] else {})
    return m


def run_imagebatch(
    label: str,
    manifest: Path,
    out: Path,
    emu: Emulator,
    concurrency: int,
    server: Server | None,
    client_home: Path,
    count_sent: bool = True,
    extra: Sequence[str] = (),
    launcher: Sequence[str] = CLI,
    env_extra: Mapping[str, str] | None = None,
    target: str | None = None,
) -> Measured:
    """`imagebatch run` as a whole process; with `server`, its CPU and database growth around the run.

    `extra`: more options of `imagebatch run` (`--no-report`, `--global-limit NAME`); `launcher`: the
    command that starts the CLI (default `python -m imagebatch.cli.main`; `start` also times `uv run
    imagebatch` and `.venv/bin/imagebatch`); `env_extra`: more of the run's environment (a store's
    endpoint and credentials); `target`: the run's `--out` when it is not the folder `out` (an
    `s3://` URL: `out` then only names the log, and run.json is the caller's to read)."""
    emu.reset()
    env = base_env() | {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(client_home), **(env_extra or {})}
    if server is not None:
        env["PREFECT_API_URL"] = server.info.api_url
        idle = idle_rate(server.info.pid)
        s0, db0 = tree_cpu(server.info.pid), server.db_bytes()
        log_offset = server.info.log_path.stat().st_size
        t0 = time.monotonic()
    cmd = [*launcher, "run", str(manifest), "--out", target or str(out), "--base-url", emu.url, *extra]
    e0 = emu.cpu()
    m = run_measured(label, [*cmd, "--concurrency", str(concurrency)], env, out.with_suffix(".log"))
    m.emulator_cpu_s = emu.cpu() - e0
    m.sent = emu.requests_seen() if count_sent else None
    if server is not None:
        m.server_settle_s = settle(server.info.pid, idle)
        elapsed = time.monotonic() - t0
        m.server_cpu_s = max(0.0, tree_cpu(server.info.pid) - s0 - idle * elapsed)
        m.db_bytes = server.db_bytes() - db0
        with server.info.log_path.open("rb") as fh:
            fh.seek(log_offset)
            new_log = fh.read().decode(errors="replace")
        m.log_errors = sum(bool(re.search(r"\bERROR\b|Traceback", line)) for line in new_log.splitlines())
    run_json = out / "run.json"
    if target is None and run_json.exists():
        take_run_json(m, json.loads(run_json.read_text()))
    return m


def take_run_json(m: Measured, info: dict[str, Any]) -> None:
    """The flow body's seconds and the counts of a run's run.json, into `m`."""
    if info.get("ended_at"):
        started = datetime.fromisoformat(info["started_at"])
        m.body_s = (datetime.fromisoformat(info["ended_at"]) - started).total_seconds()
    m.counts = {k: v for k, v in (info.get("counts") or {}).items() if v}
    m.ok = m.counts.get("succeeded", 0) + m.counts.get("skipped", 0)


# --- tables ---------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "" if value is None else format(value, spec)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "-|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def emit(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, default=str), flush=True)


def per_request_ms(seconds: float | None, requests: int) -> str:
    return "" if seconds is None or not requests else f"{1000 * seconds / requests:.2f}"


def figures_of(m: Measured) -> dict[str, Any]:
    d = asdict(m)
    d.pop("tail")
    return d


def fail_note(m: Measured) -> None:
    if m.code not in (0,):
        last = "\n".join(m.tail.strip().splitlines()[-6:])
        print(f"  note: {m.label} exited {m.code}; last lines:\n    " + last.replace("\n", "\n    "))
