"""Catalog scale (issue 9, item 5): `imagebatch run` side by side with the plain asyncio + httpx peer.

Not a test. Every subcommand starts the emulator in its own process (`imagebatch emulator --port 0`), runs
the peer (`bench/peer.py`) and `imagebatch run` as child processes against it, prints a markdown table
and then one JSON line of the figures (`{"bench": ..., ...}`).

    uv run python bench/bench_scale.py throughput --requests 640 --latency 1 --concurrency 32
    uv run python bench/bench_scale.py throughput --requests 10000 --latency 0.2 --concurrency 64 256
    uv run python bench/bench_scale.py throughput --report both          # with and without --no-report
    uv run python bench/bench_scale.py throughput --requests 640 --latency 0.2 --report off --global-limit 32
    uv run python bench/bench_scale.py start                 # a rerun that sends nothing
    uv run python bench/bench_scale.py memory                # 200 x 4K at 16; RSS at 1,000 vs 10,000
    uv run python bench/bench_scale.py big                   # 100,000 requests, Prefect on PostgreSQL

How figures are taken (bench/README.md, "Scale (issue 9)"):
- wall: the whole child process, from spawn to `os.wait4`; CPU and peak RSS from `wait4`'s rusage
  (`ru_utime + ru_stime`, `ru_maxrss`) of that child alone;
- flow body: `run.json`'s `started_at` -> `ended_at`; the peer's loop: its own first send -> last answer;
- Prefect's server is a running `prefect server start` (tests/helpers/prefect_server.py), given to the run
  as `PREFECT_API_URL`; its CPU is utime + stime summed over its process tree from /proc, read before the
  run and again once the server has gone quiet after it (it drains its event backlog after the run exits),
  minus its idle rate measured before the run; its database growth is the SQLite files in its
  PREFECT_HOME (`*.db`, `*.db-wal`) or `pg_database_size` on PostgreSQL.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peer import DEFAULT_MODEL, request_body  # noqa: E402
from tests.helpers.prefect_server import (  # noqa: E402
    PrefectServer,
    postgres_database_url,
    running_prefect_server,
)

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


PEER_CLIENTS = 1  # set from --peer-clients


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
) -> Measured:
    """`imagebatch run` as a whole process; with `server`, its CPU and database growth around the run.

    `extra`: more options of `imagebatch run` (`--no-report`, `--global-limit NAME`); `launcher`: the
    command that starts the CLI (default `python -m imagebatch.cli.main`; `start` also times `uv run
    imagebatch` and `.venv/bin/imagebatch`)."""
    emu.reset()
    env = base_env() | {"IMAGEBATCH_API_KEY": KEY, "PREFECT_HOME": str(client_home)}
    if server is not None:
        env["PREFECT_API_URL"] = server.info.api_url
        idle = idle_rate(server.info.pid)
        s0, db0 = tree_cpu(server.info.pid), server.db_bytes()
        log_offset = server.info.log_path.stat().st_size
        t0 = time.monotonic()
    cmd = [*launcher, "run", str(manifest), "--out", str(out), "--base-url", emu.url, *extra]
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
    if run_json.exists():
        info = json.loads(run_json.read_text())
        if info.get("ended_at"):
            started = datetime.fromisoformat(info["started_at"])
            m.body_s = (datetime.fromisoformat(info["ended_at"]) - started).total_seconds()
        m.counts = {k: v for k, v in (info.get("counts") or {}).items() if v}
        m.ok = m.counts.get("succeeded", 0) + m.counts.get("skipped", 0)
    return m


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


# --- subcommands ----------------------------------------------------------------------------------------


LIMIT_NAME = "bench-requests"


def create_global_limit(server: Server, concurrency: int, home: Path) -> None:
    """`imagebatch limits --name bench-requests --concurrency N` on the bench's running Prefect server."""
    env = base_env() | {"PREFECT_API_URL": server.info.api_url, "PREFECT_HOME": str(home)}
    cmd = [*CLI, "limits", "--name", LIMIT_NAME, "--concurrency", str(concurrency)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"imagebatch limits failed ({done.returncode}): {done.stdout}{done.stderr}")


def variants(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """The `imagebatch run` settings to measure beside one peer run: (label, extra options)."""
    reports: dict[str, list[tuple[str, list[str]]]] = {
        "on": [("", [])],
        "off": [(" --no-report", ["--no-report"])],
    }
    reports["both"] = reports["on"] + reports["off"]
    out = []
    for suffix, extra in reports[args.report]:
        if args.run_arg:
            suffix, extra = f"{suffix} {' '.join(args.run_arg)}", [*extra, *args.run_arg]
        out.append((f"imagebatch{suffix}", extra))
        if args.global_limit:
            limited = [*extra, "--global-limit", LIMIT_NAME]
            out.append((f"imagebatch{suffix} --global-limit ({args.global_limit})", limited))
    return out


def cmd_throughput(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp_name:
        tmp = Path(tmp_name)
        manifest = tmp / "manifest.csv"
        write_manifest(manifest, args.requests, distinct=args.distinct_prompts)
        server_cm = nullcontext() if args.skip_imagebatch else prefect_server(tmp / "prefect", args.database)
        with emulator(args, args.latency, tmp) as emu, server_cm as server:
            if args.global_limit and server is not None:
                create_global_limit(server, args.global_limit, tmp / "client")
            for concurrency in args.concurrency:
                throughput_one(args, tmp, manifest, emu, server, concurrency)


def throughput_one(
    args: argparse.Namespace,
    tmp: Path,
    manifest: Path,
    emu: Emulator,
    server: Server | None,
    concurrency: int,
) -> None:
    n = args.requests
    ideal = n * args.latency / concurrency
    tag = f"c{concurrency}"
    peer = None if args.skip_peer else run_peer("peer", manifest, tmp / f"peer-{tag}", emu, concurrency)
    runs: list[Measured] = []
    if not args.skip_imagebatch:
        for i, (label, extra) in enumerate(variants(args)):
            runs.append(
                run_imagebatch(
                    label,
                    manifest,
                    tmp / f"ib-{tag}-{i}",
                    emu,
                    concurrency,
                    server,
                    tmp / "client",
                    extra=extra,
                )
            )
    peer_loop = peer.body_s if peer else None
    rows = []

    def row(label: str, m: Measured, seconds: float | None, server_side: bool) -> list[str]:
        rate = n / seconds if seconds else None
        vs_peer = peer_loop / seconds if peer_loop and seconds else None
        return [
            label,
            fmt(seconds),
            fmt(rate),
            fmt(ideal / seconds if seconds else None, ".2f"),
            fmt(vs_peer, ".2f"),
            per_request_ms(m.cpu_s, n) if server_side else "",
            per_request_ms(m.server_cpu_s, n) if server_side else "",
            fmt(m.db_bytes / n if m.db_bytes is not None and server_side else None, ".0f"),
            fmt(m.maxrss_mib, ".0f") if server_side else "",
            f"{m.ok}/{n}, exit {m.code}" if server_side else "",
        ]

    if peer:
        name = "peer (asyncio + httpx)" + (f", {PEER_CLIENTS} clients" if PEER_CLIENTS > 1 else "")
        rows.append(row(f"{name}, whole process", peer, peer.wall_s, True))
        rows.append(row("peer, loop", peer, peer.body_s, False))
    for ib in runs:
        rows.append(row(f"{ib.label}, whole process", ib, ib.wall_s, True))
        rows.append(row(f"{ib.label}, flow body", ib, ib.body_s, False))
    print(
        f"\nthroughput: {n} requests, latency {args.latency} s, concurrency {concurrency}, "
        f"ideal {ideal:.1f} s; Prefect server on {args.database}; load average at the end "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    header = [
        "runner",
        "wall s",
        "requests/s",
        "of ideal",
        "x peer",
        "CPU ms/req",
        "server CPU ms/req",
        "DB bytes/req",
        "peak RSS MiB",
        "ok",
    ]
    print(table(header, rows))
    for m in (peer, *runs):
        if m is not None:
            emu_ms = per_request_ms(m.emulator_cpu_s, n)
            settled = (
                f", server settled {m.server_settle_s:.1f} s after" if m.server_settle_s is not None else ""
            )
            print(f"  {m.label}: emulator CPU {emu_ms} ms/req{settled}")
            fail_note(m)
    emit(
        {
            "bench": "throughput",
            "requests": n,
            "latency": args.latency,
            "concurrency": concurrency,
            "database": args.database,
            "ideal_s": ideal,
            "peer_clients": PEER_CLIENTS,
            "global_limit": args.global_limit,
            "machine": machine(),
            "peer": figures_of(peer) if peer else None,
            "imagebatch": [figures_of(m) for m in runs],
        }
    )


def cmd_start(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp_name:
        tmp = Path(tmp_name)
        manifest = Path(args.manifest).resolve() if args.manifest else tmp / "manifest.csv"
        if not args.manifest:
            write_manifest(manifest, args.requests)
        results: dict[str, dict[str, Any]] = {}
        with emulator(args, args.latency, tmp) as emu:
            if not args.skip_peer and not args.manifest:
                results["peer"] = reruns(
                    args, lambda i: run_peer(f"peer-{i}", manifest, tmp / "peer", emu, 16), emu
                )
            home = tmp / "client-temporary"

            def temporary(i: int) -> Measured:
                return run_imagebatch(f"temporary-{i}", manifest, tmp / "ib-temporary", emu, 16, None, home)

            results["imagebatch, temporary server"] = reruns(args, temporary, emu)

            def fresh_home(i: int) -> Measured:  # a new machine: no Prefect home, the folder already done
                fresh = tmp / f"client-fresh-{i}"
                return run_imagebatch(f"fresh-{i}", manifest, tmp / "ib-temporary", emu, 16, None, fresh)

            results["imagebatch, temporary server, a fresh Prefect home each run"] = reruns(
                args, fresh_home, emu
            )
            with prefect_server(tmp / "prefect", args.database) as server:

                def running(i: int) -> Measured:
                    return run_imagebatch(
                        f"running-{i}", manifest, tmp / "ib-running", emu, 16, server, tmp / "c"
                    )

                results[f"imagebatch, running server ({args.database})"] = reruns(args, running, emu)
                for name, launcher in launchers(args):

                    def running_via(i: int, launcher: Sequence[str] = launcher) -> Measured:
                        return run_imagebatch(
                            f"running-{i}",
                            manifest,
                            tmp / "ib-running",
                            emu,
                            16,
                            server,
                            tmp / "c",
                            launcher=launcher,
                        )

                    results[f"{name}, running server ({args.database})"] = reruns(args, running_via, emu)
            for name, launcher in launchers(args):

                def temporary_via(i: int, launcher: Sequence[str] = launcher) -> Measured:
                    return run_imagebatch(
                        f"temporary-{i}",
                        manifest,
                        tmp / "ib-temporary",
                        emu,
                        16,
                        None,
                        home,
                        launcher=launcher,
                    )

                results[f"{name}, temporary server"] = reruns(args, temporary_via, emu)
        rows = []
        for label, r in results.items():
            target = {"peer": ""}.get(label, "6 s" if "temporary" in label else "3 s")
            rerun_s = ", ".join(f"{w:.1f}" for w in r["rerun_wall_s"])
            rows.append(
                [
                    label,
                    fmt(r["first_wall_s"]),
                    rerun_s,
                    fmt(r["median_rerun_s"]),
                    target,
                    r["sent"],
                    ", ".join(map(str, r["first_codes"])) + " / " + ", ".join(map(str, r["rerun_codes"])),
                ]
            )
        print(
            f"\nstart: a rerun that sends nothing ({args.requests if not args.manifest else args.manifest} "
            f"requests done by the first run), {args.repeat} reruns each; load average at the end "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(
            table(
                [
                    "runner",
                    "first run s",
                    "reruns s",
                    "median rerun s",
                    "target",
                    "sent on reruns",
                    "exit codes (first / reruns)",
                ],
                rows,
            )
        )
        emit({"bench": "start", "requests": args.requests, "machine": machine(), "results": results})


def launchers(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """With --launchers, the rerun is also timed as a user starts it: `uv run imagebatch` (which, with
    `compile-bytecode = true`, compiles the environment's bytecode again on every call: uv issue 12202)
    and the environment's own script `.venv/bin/imagebatch`."""
    if not args.launchers:
        return []
    return [
        ("uv run imagebatch", ["uv", "run", "--project", str(ROOT), "imagebatch"]),
        (".venv/bin/imagebatch", [str(ROOT / ".venv" / "bin" / "imagebatch")]),
    ]


def reruns(args: argparse.Namespace, run: Any, emu: Emulator) -> dict[str, Any]:
    first: Measured = run(0)
    fail_note(first)
    walls, sent, figures = [], 0, [figures_of(first)]
    codes, rerun_codes = [first.code], []
    tries = 1
    while codes[-1] != 0 and tries < 3:  # a rerun must find everything done: finish the first run
        again: Measured = run(tries)
        fail_note(again)
        codes.append(again.code)
        figures.append(figures_of(again))
        tries += 1
        if again.code == 0:
            break
    for i in range(tries, tries + args.repeat):
        m: Measured = run(i)
        walls.append(m.wall_s)
        sent += m.sent or 0
        rerun_codes.append(m.code)
        figures.append(figures_of(m))
        fail_note(m)
    return {
        "first_wall_s": first.wall_s,
        "rerun_wall_s": walls,
        "median_rerun_s": statistics.median(walls),
        "sent": sent,
        "first_codes": codes,
        "rerun_codes": rerun_codes,
        "runs": figures,
    }


def cmd_memory(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name:
        tmp = Path(tmp_name)
        figures: dict[str, Any] = {"bench": "memory", "machine": machine()}
        with (
            emulator(args, args.latency, tmp, sizes=(args.image_size, "1K")) as emu,
            prefect_server(tmp / "prefect", args.database) as server,
        ):
            big = tmp / "big.csv"
            write_manifest(big, args.big_requests, image_size=args.image_size)
            extra = ["--no-report"] if args.no_report else []
            rows = []
            pairs = []
            for label, runner in (("peer", run_peer), ("imagebatch run", None)):
                if runner is run_peer and args.skip_peer:
                    continue
                m = (
                    run_peer(label, big, tmp / "peer-big", emu, args.concurrency)
                    if runner is run_peer
                    else run_imagebatch(
                        label, big, tmp / "ib-big", emu, args.concurrency, server, tmp / "c", extra=extra
                    )
                )
                fail_note(m)
                rows.append(
                    [
                        label,
                        f"{args.big_requests} x {args.image_size} at {args.concurrency}",
                        fmt(m.maxrss_mib, ".0f"),
                        fmt(m.wall_s),
                        f"{m.ok}/{args.big_requests}, exit {m.code}",
                    ]
                )
                figures[f"{label} {args.image_size}"] = figures_of(m)
            for n in args.counts:
                manifest = tmp / f"m{n}.csv"
                write_manifest(manifest, n)
                for label in ("peer", "imagebatch run"):
                    if label == "peer" and args.skip_peer:
                        continue
                    if label == "peer":
                        m = run_peer(label, manifest, tmp / f"peer-{n}", emu, args.scale_concurrency)
                    else:
                        out = tmp / f"ib-{n}"
                        m = run_imagebatch(
                            label, manifest, out, emu, args.scale_concurrency, server, tmp / "c", extra=extra
                        )
                    fail_note(m)
                    pairs.append((label, n, m.maxrss_mib))
                    rows.append(
                        [
                            label,
                            f"{n} x 1K at {args.scale_concurrency}",
                            fmt(m.maxrss_mib, ".0f"),
                            fmt(m.wall_s),
                            f"{m.ok}/{n}, exit {m.code}",
                        ]
                    )
                    figures[f"{label} {n}"] = figures_of(m)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"\nmemory: peak RSS of the runner's process (wait4), latency {args.latency} s"
            f"{', imagebatch --no-report' if args.no_report else ''}; load {load}"
        )
        print(table(["runner", "requests", "peak RSS MiB", "wall s", "ok"], rows))
        lo, hi = min(args.counts, default=0), max(args.counts, default=0)
        for label in ("peer", "imagebatch run"):
            rss = {n: r for lab, n, r in pairs if lab == label}
            if lo in rss and hi in rss and lo != hi:
                ratio = rss[hi] / rss[lo]
                figures[f"{label} ratio {hi}/{lo}"] = ratio
                print(f"  {label}: RSS({hi}) / RSS({lo}) = {ratio:.2f} (target <= 1.2 for imagebatch)")
        emit(figures)


def cmd_big(args: argparse.Namespace) -> None:
    n = args.requests
    with tempfile.TemporaryDirectory(prefix="bench-big-") as tmp_name:
        tmp = Path(tmp_name)
        manifest = tmp / "manifest.csv"
        write_manifest(manifest, n)
        with (
            emulator(args, args.latency, tmp) as emu,
            prefect_server(tmp / "prefect", args.database) as server,
        ):
            ib = run_imagebatch(
                "imagebatch",
                manifest,
                tmp / "ib",
                emu,
                args.concurrency,
                server,
                tmp / "c",
                count_sent=False,
                extra=["--no-report"] if args.no_report else [],
            )
            peer = None if args.skip_peer else run_peer("peer", manifest, tmp / "peer", emu, args.concurrency)
            log_lines = server.info.log().splitlines()
        rows = []
        for m in (peer, ib):
            if m is None:
                continue
            fail_note(m)
            rows.append(
                [
                    m.label,
                    f"{m.ok}/{n}",
                    m.code,
                    fmt(m.wall_s),
                    fmt(m.body_s),
                    fmt(n / m.wall_s),
                    fmt(m.maxrss_mib, ".0f"),
                    per_request_ms(m.cpu_s, n),
                    per_request_ms(m.server_cpu_s, n),
                    fmt(m.db_bytes / n if m.db_bytes is not None else None, ".0f"),
                    "" if m.log_errors is None else m.log_errors,
                ]
            )
        print(
            f"\nbig: {n} requests, latency {args.latency} s, concurrency {args.concurrency}, "
            f"Prefect server on {args.database}{', --no-report' if args.no_report else ''}; load average at "
            f"the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(
            table(
                [
                    "runner",
                    "ok",
                    "exit",
                    "wall s",
                    "body s",
                    "requests/s",
                    "peak RSS MiB",
                    "CPU ms/req",
                    "server CPU ms/req",
                    "DB bytes/req",
                    "server log ERROR/Traceback lines",
                ],
                rows,
            )
        )
        errors = [line for line in log_lines if re.search(r"\bERROR\b|Traceback", line)]
        for line in errors[:5]:
            print("  server log: " + line[:200])
        emit(
            {
                "bench": "big",
                "requests": n,
                "latency": args.latency,
                "concurrency": args.concurrency,
                "database": args.database,
                "machine": machine(),
                "imagebatch": figures_of(ib),
                "peer": figures_of(peer) if peer else None,
                "server_log_errors": len(errors),
            }
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, latency: float, database: str = "sqlite") -> None:
        p.add_argument("--latency", type=float, default=latency, help="emulator seconds per generation")
        p.add_argument(
            "--database",
            choices=["sqlite", "postgres"],
            default=database,
            help="the running Prefect server's database",
        )
        p.add_argument("--jpeg-rate", type=float, default=0.0, help="emulator's JPEG share (default 0)")
        p.add_argument("--thought-image-rate", type=float, default=0.0, help="emulator's draft images")
        p.add_argument("--skip-peer", action="store_true")
        p.add_argument(
            "--peer-clients", type=int, default=1, help="spread the peer over K AsyncClients (default 1)"
        )

    p = sub.add_parser("throughput", help="wall, requests/s, CPU and DB growth per request")
    common(p, 1.0)
    p.add_argument("--requests", type=int, default=640)
    p.add_argument("--concurrency", type=int, nargs="+", default=[32])
    p.add_argument(
        "--distinct-prompts",
        action="store_true",
        help="a prompt per row (the emulator renders every image; default: 8 prompts cycled)",
    )
    p.add_argument("--skip-imagebatch", action="store_true")
    p.add_argument(
        "--report",
        choices=["on", "off", "both"],
        default="on",
        help="imagebatch with report thumbnails (on, its default), with --no-report (off: like the peer, "
        "which writes no report), or one run of each beside the same peer run (both)",
    )
    p.add_argument(
        "--run-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="one more option for every `imagebatch run` (repeatable), e.g. --run-arg=--no-adaptive",
    )
    p.add_argument(
        "--global-limit",
        type=int,
        metavar="N",
        help=f"also run imagebatch with --global-limit {LIMIT_NAME}, a limit of N created on the bench's "
        "Prefect server, after the same run without it (what a slot costs per request)",
    )
    p.set_defaults(func=cmd_throughput)

    p = sub.add_parser("start", help="a rerun that sends nothing: temporary and running server")
    common(p, 0.05)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="reruns timed per setting")
    p.add_argument("--manifest", help="rerun this manifest instead (e.g. manifests/examples/catalog.csv)")
    p.add_argument(
        "--launchers",
        action="store_true",
        help="also time the reruns started by `uv run imagebatch` and by `.venv/bin/imagebatch`",
    )
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("memory", help="peak RSS: 4K images; 1,000 vs 10,000 requests")
    common(p, 0.05)
    p.add_argument("--big-requests", type=int, default=200)
    p.add_argument("--image-size", default="4K")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--counts", type=int, nargs="*", default=[1000, 10000], help="none: the 4K run only")
    p.add_argument("--no-report", action="store_true", help="imagebatch run --no-report (as the peer)")
    p.add_argument("--scale-concurrency", type=int, default=32)
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("big", help="100,000 requests against a running Prefect server on PostgreSQL")
    common(p, 0.05, database="postgres")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--no-report", action="store_true", help="imagebatch run --no-report (as the peer)")
    p.set_defaults(func=cmd_big)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    global PEER_CLIENTS
    args = build_parser().parse_args(argv)
    PEER_CLIENTS = args.peer_clients
    args.func(args)


if __name__ == "__main__":
    main()
