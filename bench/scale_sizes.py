"""The size subcommands of `bench_scale.py` (issue 9): `memory` (peak RSS: a run of large images, then
the same small run at growing request counts) and `big` (100,000 requests against a running Prefect
server on PostgreSQL). Their options are in `bench_scale.py`'s parser; what they measure with is in
`scale_harness.py`.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from bench.scale_harness import (
    Emulator,
    Measured,
    Server,
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

# --- memory ---------------------------------------------------------------------------------------------


def cmd_memory(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp_name:
        tmp = Path(tmp_name)
        figures: dict[str, Any] = {"bench": "memory", "machine": machine()}
        with (
            emulator(args, args.latency, tmp, sizes=(args.image_size, "1K")) as emu,
            prefect_server(tmp / "prefect", args.database) as server,
        ):
            rows, pairs = memory_runs(args, tmp, emu, server, figures)
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


def memory_runs(
    args: argparse.Namespace, tmp: Path, emu: Emulator, server: Server, figures: dict[str, Any]
) -> tuple[list[list[str]], list[tuple[str, int, float]]]:
    """--big-requests x --image-size, then each of --counts x 1K, by the peer and by imagebatch; their
    figures into `figures`. Returns the table's rows and (runner, requests, peak RSS MiB) of the counts."""
    runners = [label for label in ("peer", "imagebatch run") if not (label == "peer" and args.skip_peer)]
    rows, pairs = [], []
    big = tmp / "big.csv"
    write_manifest(big, args.big_requests, image_size=args.image_size)
    for label in runners:
        m = memory_run(args, label, big, tmp, "big", args.concurrency, emu, server)
        rows.append(memory_row(label, m, args.big_requests, args.image_size, args.concurrency))
        figures[f"{label} {args.image_size}"] = figures_of(m)
    for n in args.counts:
        manifest = tmp / f"m{n}.csv"
        write_manifest(manifest, n)
        for label in runners:
            m = memory_run(args, label, manifest, tmp, str(n), args.scale_concurrency, emu, server)
            pairs.append((label, n, m.maxrss_mib))
            rows.append(memory_row(label, m, n, "1K", args.scale_concurrency))
            figures[f"{label} {n}"] = figures_of(m)
    return rows, pairs


def memory_run(
    args: argparse.Namespace,
    label: str,
    manifest: Path,
    tmp: Path,
    tag: str,
    concurrency: int,
    emu: Emulator,
    server: Server,
) -> Measured:
    """The peer (into `peer-TAG`) or `imagebatch run` (into `ib-TAG`, --no-report as asked) on `manifest`."""
    if label == "peer":
        m = run_peer(label, manifest, tmp / f"peer-{tag}", emu, concurrency)
    else:
        extra = ["--no-report"] if args.no_report else []
        out = tmp / f"ib-{tag}"
        m = run_imagebatch(label, manifest, out, emu, concurrency, server, tmp / "c", extra=extra)
    fail_note(m)
    return m


def memory_row(label: str, m: Measured, requests: int, size: str, concurrency: int) -> list[str]:
    return [
        label,
        f"{requests} x {size} at {concurrency}",
        fmt(m.maxrss_mib, ".0f"),
        fmt(m.wall_s),
        f"{m.ok}/{requests}, exit {m.code}",
    ]


# --- big ------------------------------------------------------------------------------------------------


BIG_HEADER = [
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
]


def cmd_big(args: argparse.Namespace) -> None:
    n = args.requests
    with tempfile.TemporaryDirectory(prefix="bench-big-") as tmp_name:
        ib, peer, log_lines = big_runs(args, Path(tmp_name))
        rows = []
        for m in (peer, ib):
            if m is None:
                continue
            fail_note(m)
            rows.append(big_row(m, n))
        print(
            f"\nbig: {n} requests, latency {args.latency} s, concurrency {args.concurrency}, "
            f"Prefect server on {args.database}{', --no-report' if args.no_report else ''}; load average at "
            f"the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        print(table(BIG_HEADER, rows))
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


def big_runs(args: argparse.Namespace, tmp: Path) -> tuple[Measured, Measured | None, list[str]]:
    """`imagebatch run` (sent requests not counted), then the peer, on --requests rows; and the lines of
    the Prefect server's log, read before the server stops."""
    manifest = tmp / "manifest.csv"
    write_manifest(manifest, args.requests)
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
    return ib, peer, log_lines


def big_row(m: Measured, n: int) -> list[Any]:
    return [
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
