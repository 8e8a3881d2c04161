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
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import scale_harness  # noqa: E402
from bench.scale_harness import (  # noqa: E402
    CLI,
    Emulator,
    Measured,
    Server,
    base_env,
    emit,
    emulator,
    fail_note,
    figures_of,
    fmt,
    machine,
    per_request_ms,
    prefect_server,
    run_imagebatch,
    run_peer,
    table,
    write_manifest,
)
from bench.scale_sizes import cmd_big, cmd_memory  # noqa: E402

# --- throughput -----------------------------------------------------------------------------------------


LIMIT_NAME = "bench-requests"
THROUGHPUT_HEADER = [
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
    """One concurrency: the peer, then every imagebatch variant; the table, its notes and the JSON line."""
    n = args.requests
    ideal = n * args.latency / concurrency
    peer, runs = throughput_runs(args, tmp, manifest, emu, server, concurrency)
    rows = throughput_rows(n, ideal, peer, runs)
    print(
        f"\nthroughput: {n} requests, latency {args.latency} s, concurrency {concurrency}, "
        f"ideal {ideal:.1f} s; Prefect server on {args.database}; load average at the end "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(table(THROUGHPUT_HEADER, rows))
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
            "peer_clients": scale_harness.PEER_CLIENTS,
            "global_limit": args.global_limit,
            "machine": machine(),
            "peer": figures_of(peer) if peer else None,
            "imagebatch": [figures_of(m) for m in runs],
        }
    )


def throughput_runs(
    args: argparse.Namespace,
    tmp: Path,
    manifest: Path,
    emu: Emulator,
    server: Server | None,
    concurrency: int,
) -> tuple[Measured | None, list[Measured]]:
    """The peer (unless --skip-peer), then `imagebatch run` once per variant (unless --skip-imagebatch)."""
    tag = f"c{concurrency}"
    peer = None if args.skip_peer else run_peer("peer", manifest, tmp / f"peer-{tag}", emu, concurrency)
    runs: list[Measured] = []
    if not args.skip_imagebatch:
        for i, (label, extra) in enumerate(variants(args)):
            out = tmp / f"ib-{tag}-{i}"
            runs.append(
                run_imagebatch(label, manifest, out, emu, concurrency, server, tmp / "client", extra=extra)
            )
    return peer, runs


def throughput_rows(n: int, ideal: float, peer: Measured | None, runs: list[Measured]) -> list[list[str]]:
    """Two rows a runner: its whole process, then its own loop (the peer's) or its flow body (imagebatch)."""
    peer_loop = peer.body_s if peer else None

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

    rows = []
    if peer:
        clients = scale_harness.PEER_CLIENTS
        name = "peer (asyncio + httpx)" + (f", {clients} clients" if clients > 1 else "")
        rows.append(row(f"{name}, whole process", peer, peer.wall_s, True))
        rows.append(row("peer, loop", peer, peer.body_s, False))
    for ib in runs:
        rows.append(row(f"{ib.label}, whole process", ib, ib.wall_s, True))
        rows.append(row(f"{ib.label}, flow body", ib, ib.body_s, False))
    return rows


# --- start ----------------------------------------------------------------------------------------------


START_HEADER = [
    "runner",
    "first run s",
    "reruns s",
    "median rerun s",
    "target",
    "sent on reruns",
    "exit codes (first / reruns)",
]


def cmd_start(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp_name:
        tmp = Path(tmp_name)
        manifest = Path(args.manifest).resolve() if args.manifest else tmp / "manifest.csv"
        if not args.manifest:
            write_manifest(manifest, args.requests)
        with emulator(args, args.latency, tmp) as emu:
            results = start_results(args, tmp, manifest, emu)
        rows = []
        for label, r in results.items():
            target = {"peer": ""}.get(label, "6 s" if "temporary" in label else "3 s")
            rerun_s = ", ".join(f"{w:.1f}" for w in r["rerun_wall_s"])
            codes = ", ".join(map(str, r["first_codes"])) + " / " + ", ".join(map(str, r["rerun_codes"]))
            rows.append(
                [label, fmt(r["first_wall_s"]), rerun_s, fmt(r["median_rerun_s"]), target, r["sent"], codes]
            )
        print(
            f"\nstart: a rerun that sends nothing ({args.requests if not args.manifest else args.manifest} "
            f"requests done by the first run), {args.repeat} reruns each; load average at the end "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(table(START_HEADER, rows))
        emit({"bench": "start", "requests": args.requests, "machine": machine(), "results": results})


def start_results(
    args: argparse.Namespace, tmp: Path, manifest: Path, emu: Emulator
) -> dict[str, dict[str, Any]]:
    """Each setting's first run and its reruns, in the table's order: the peer, imagebatch on a temporary
    server (the same Prefect home, then a fresh one each run), on a running server, then the launchers."""
    results: dict[str, dict[str, Any]] = {}
    if not args.skip_peer and not args.manifest:
        results["peer"] = reruns(args, lambda i: run_peer(f"peer-{i}", manifest, tmp / "peer", emu, 16), emu)
    home = tmp / "client-temporary"
    temporary = imagebatch_rerun("temporary", manifest, tmp / "ib-temporary", emu, None, home)
    results["imagebatch, temporary server"] = reruns(args, temporary, emu)

    def fresh_home(i: int) -> Measured:  # a new machine: no Prefect home, the folder already done
        fresh = tmp / f"client-fresh-{i}"
        return run_imagebatch(f"fresh-{i}", manifest, tmp / "ib-temporary", emu, 16, None, fresh)

    results["imagebatch, temporary server, a fresh Prefect home each run"] = reruns(args, fresh_home, emu)
    with prefect_server(tmp / "prefect", args.database) as server:
        for name, launcher in [("imagebatch", CLI), *launchers(args)]:
            running = imagebatch_rerun(
                "running", manifest, tmp / "ib-running", emu, server, tmp / "c", launcher
            )
            results[f"{name}, running server ({args.database})"] = reruns(args, running, emu)
    for name, launcher in launchers(args):
        temporary = imagebatch_rerun("temporary", manifest, tmp / "ib-temporary", emu, None, home, launcher)
        results[f"{name}, temporary server"] = reruns(args, temporary, emu)
    return results


def imagebatch_rerun(
    label: str,
    manifest: Path,
    out: Path,
    emu: Emulator,
    server: Server | None,
    home: Path,
    launcher: Sequence[str] = CLI,
) -> Callable[[int], Measured]:
    """One `start` setting, given a run's number i: `imagebatch run` at concurrency 16, labelled `LABEL-i`."""

    def run(i: int) -> Measured:
        return run_imagebatch(f"{label}-{i}", manifest, out, emu, 16, server, home, launcher=launcher)

    return run


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


def reruns(args: argparse.Namespace, run: Callable[[int], Measured], emu: Emulator) -> dict[str, Any]:
    """One setting of `start`: its first run (again, up to 3 tries, until one exits 0), then --repeat
    reruns, which find everything done; their walls, the requests they sent and their exit codes."""
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


# --- the command line -----------------------------------------------------------------------------------


def common_options(p: argparse.ArgumentParser, latency: float, database: str = "sqlite") -> None:
    """The options every subcommand takes: the emulator's, the Prefect server's database, the peer's."""
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


def add_throughput(sub: Any) -> None:
    p = sub.add_parser("throughput", help="wall, requests/s, CPU and DB growth per request")
    common_options(p, 1.0)
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


def add_start(sub: Any) -> None:
    p = sub.add_parser("start", help="a rerun that sends nothing: temporary and running server")
    common_options(p, 0.05)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="reruns timed per setting")
    p.add_argument("--manifest", help="rerun this manifest instead (e.g. manifests/examples/catalog.csv)")
    p.add_argument(
        "--launchers",
        action="store_true",
        help="also time the reruns started by `uv run imagebatch` and by `.venv/bin/imagebatch`",
    )
    p.set_defaults(func=cmd_start)


def add_memory(sub: Any) -> None:
    p = sub.add_parser("memory", help="peak RSS: 4K images; 1,000 vs 10,000 requests")
    common_options(p, 0.05)
    p.add_argument("--big-requests", type=int, default=200)
    p.add_argument("--image-size", default="4K")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--counts", type=int, nargs="*", default=[1000, 10000], help="none: the 4K run only")
    p.add_argument("--no-report", action="store_true", help="imagebatch run --no-report (as the peer)")
    p.add_argument("--scale-concurrency", type=int, default=32)
    p.set_defaults(func=cmd_memory)


def add_big(sub: Any) -> None:
    p = sub.add_parser("big", help="100,000 requests against a running Prefect server on PostgreSQL")
    common_options(p, 0.05, database="postgres")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--no-report", action="store_true", help="imagebatch run --no-report (as the peer)")
    p.set_defaults(func=cmd_big)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_throughput, add_start, add_memory, add_big):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    scale_harness.PEER_CLIENTS = args.peer_clients
    args.func(args)


if __name__ == "__main__":
    main()
