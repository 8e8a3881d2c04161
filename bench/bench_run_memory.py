"""Issue 36: a whole run's peak RSS at 50,000, 200,000 and 500,000 requests, per process.

Not a test. Writes an N-request CSV manifest (`scale_harness.write_manifest`: native text-to-image rows,
8 prompts cycled, so the emulator's render cache serves every answer), starts `imagebatch emulator` in
its own process (`--latency`, 0.01 s by default) and a running `prefect server start` (SQLite, its own
PREFECT_HOME), and for each N and each mode:

- `local`: `imagebatch run M --out DIR` as one child process; its peak RSS, CPU and wall from `os.wait4`
  (with a running server the run starts no child process, so `wait4` is that process alone);
- `s3`: the same into `s3://BUCKET/run-N` on `moto_server` (its own process on 127.0.0.1, started
  afresh for each run, every object spilled to an unlinked temporary file so that a run of 500,000
  images fits: `bench_store.start_moto(spill=True)`), the
  credentials and endpoint in the run's environment;
- `shards`: `imagebatch deploy M --shards K` (10 by default) on a process pool, `--workers` processes of
  `imagebatch worker` polling it, one run of the deployment triggered through the API and followed to its
  end: the parent and its K shard runs are processes the workers start. Each flow-run process is found by
  the `PREFECT__FLOW_RUN_ID` in its environment and its VmHWM and CPU are read from /proc every 0.2 s
  (`Sampler`; what a process adds in its last 0.2 s is missed), and each worker's `wait4` gives the
  largest process it ever had under it (exact, the worker and the runs together).

    uv run python bench/bench_run_memory.py --requests 50000 200000 500000 --modes local s3 shards
    uv run python bench/bench_run_memory.py --requests 500 2000                 # a quick check
    uv run python bench/bench_run_memory.py --src /tmp/runrss-before --requests 50000

`--src CHECKOUT` runs another checkout's code: CHECKOUT/src goes first on PYTHONPATH of every child (the
emulator, the runs, deploy, the workers and so their flow runs), with this checkout's interpreter and
dependencies (the printed `imagebatch` path says which code ran). `--report/--no-report` is passed to
every run (default: neither, the run's own default). `IMAGEBATCH_BENCH_PROFILE=DIR` runs `local` and `s3`
under `bench/profile_threads.py` (cProfile in every thread), one `.pstats` file per thread into DIR.
Prints a markdown table (mode, N, process, peak RSS, wall, CPU, requests ok) and a JSON line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_shards import _api, create_process_pool, wait_for_end  # noqa: E402
from bench_store import BUCKET, SECRET, s3_client, start_moto  # noqa: E402

from bench.scale_harness import (  # noqa: E402
    CLI,
    Emulator,
    Measured,
    Server,
    base_env,
    emit,
    emulator,
    fail_note,
    fmt,
    machine,
    per_request_ms,
    prefect_server,
    run_imagebatch,
    table,
    take_run_json,
    write_manifest,
)
from bench.worker_rss import Sampler, Seen, Worker, start_workers, stop_workers  # noqa: E402

FLOW = "generate_from_manifest"
POOL = "bench-run-memory"
PROFILE_ENV = "IMAGEBATCH_BENCH_PROFILE"
MOTO_KIB_PER_REQUEST = 80  # a 1K PNG from the emulator (62 KiB), its thumbnail (10 KiB), the record
HEADER = ["mode", "requests", "process", "peak RSS MiB", "wall s", "CPU s", "CPU ms/req", "ok", "exit"]


@dataclass
class Figure:
    """One process's figures in one run (a whole run, or a sharded run's parent or shard)."""

    mode: str
    requests: int
    process: str
    peak_rss_mib: float
    wall_s: float | None
    cpu_s: float | None
    ok: int | None
    exit: str
    emulator_cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    whole_run: bool = True  # its CPU is spent on all N requests (not one shard's share): ms/req shown

    def row(self) -> list[str]:
        ok = "" if self.ok is None else f"{self.ok}/{self.requests}"
        cpu_ms = per_request_ms(self.cpu_s, self.requests) if self.whole_run else ""
        return [
            self.mode,
            f"{self.requests:,}",
            self.process,
            fmt(self.peak_rss_mib, ".0f"),
            fmt(self.wall_s),
            fmt(self.cpu_s),
            cpu_ms,
            ok,
            self.exit,
        ]


# --- the code under test --------------------------------------------------------------------------------


def use_source(src: str | None) -> str:
    """Put `src`/src first on every child's PYTHONPATH; return where a child imports imagebatch from."""
    if src:
        tree = Path(src).resolve() / "src"
        if not (tree / "imagebatch").is_dir():  # else the installed code would run instead, silently
            raise SystemExit(f"{tree} holds no imagebatch package")
        os.environ["PYTHONPATH"] = str(tree)
    probe = [sys.executable, "-c", "import imagebatch; print(imagebatch.__file__)"]
    return subprocess.run(probe, env=base_env(), capture_output=True, text=True, check=True).stdout.strip()


def launcher() -> list[str]:
    """The command that starts the CLI: under the per-thread profiler when PROFILE_ENV names a folder."""
    folder = os.environ.get(PROFILE_ENV)
    if not folder:
        return CLI
    return [sys.executable, str(ROOT / "bench" / "profile_threads.py"), folder, "-m", "imagebatch.cli.main"]


def report_option(args: argparse.Namespace) -> list[str]:
    """`--report`, `--no-report` or nothing (the run's default), for every run and the deployment."""
    return [] if args.report is None else ["--report" if args.report else "--no-report"]


# --- one process: local and s3 --------------------------------------------------------------------------


def figure_of(mode: str, n: int, process: str, m: Measured) -> Figure:
    return Figure(mode, n, process, m.maxrss_mib, m.wall_s, m.cpu_s, m.ok, str(m.code), m.emulator_cpu_s)


def one_run(
    args: argparse.Namespace, mode: str, n: int, manifest: Path, ctx: Context, **more: Any
) -> Measured:
    """`imagebatch run` of `manifest` as one child process (into `mode-N` unless `more` names a target)."""
    out = ctx.tmp / f"{mode}-{n}"
    return run_imagebatch(
        mode,
        manifest,
        out,
        ctx.emu,
        args.concurrency,
        ctx.server,
        ctx.tmp / "client",
        count_sent=False,
        extra=report_option(args),
        launcher=launcher(),
        **more,
    )


def run_local(args: argparse.Namespace, n: int, manifest: Path, tmp: Path, ctx: Context) -> list[Figure]:
    m = one_run(args, "local", n, manifest, ctx)
    fail_note(m)
    return [figure_of("local", n, "run", m)]


def free_disk_mib() -> float:
    """Free space where moto's temporary files go, MiB."""
    return shutil.disk_usage(tempfile.gettempdir()).free / 2**20


def run_s3(args: argparse.Namespace, n: int, manifest: Path, tmp: Path, ctx: Context) -> list[Figure]:
    need = n * MOTO_KIB_PER_REQUEST / 1024
    if need > 0.8 * free_disk_mib():  # moto spills every object to a temporary file
        print(f"  note: s3 {n:,} skipped: moto would write about {need / 1024:.0f} GiB of objects to disk")
        return [Figure("s3", n, "run", 0.0, None, None, None, f"skipped: moto needs ~{need / 1024:.0f} GiB")]
    moto, url = start_moto(tmp / f"moto-{n}.log", spill=True)
    try:
        store = {**SECRET, "AWS_ENDPOINT_URL": url, "AWS_ALLOW_HTTP": "true"}
        prefix = f"run-{n}"
        m = one_run(args, "s3", n, manifest, ctx, env_extra=store, target=f"s3://{BUCKET}/{prefix}")
        try:
            body = s3_client(url).get_object(Bucket=BUCKET, Key=f"{prefix}/run.json")["Body"].read()
            take_run_json(m, json.loads(body))
        except Exception as exc:
            print(f"  note: no run.json in the bucket: {exc}")
    finally:
        moto.terminate()
        moto.wait()
    fail_note(m)
    return [figure_of("s3", n, "run", m)]


# --- a sharded run on Prefect workers -------------------------------------------------------------------


def deploy_sharded(args: argparse.Namespace, manifest: Path, out: Path, name: str, ctx: Context) -> str:
    """`imagebatch deploy ... --shards K`; the deployment's id."""
    api = ctx.server.info.api_url
    cmd = [
        *CLI, "deploy", str(manifest), "--out", str(out), "--name", name, "--work-pool", POOL,
        "--base-url", ctx.emu.url, "--shards", str(args.shards), "--shard-start-timeout", "900",
        "--concurrency", str(args.concurrency), *report_option(args),
    ]  # fmt: skip
    env = base_env() | {"PREFECT_API_URL": api, "PREFECT_HOME": str(ctx.tmp / "client")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"imagebatch deploy failed ({done.returncode}): {done.stdout}{done.stderr}")
    return str(_api(api, "GET", f"/deployments/name/{FLOW}/{name}")["id"])


def run_shards(args: argparse.Namespace, n: int, manifest: Path, tmp: Path, ctx: Context) -> list[Figure]:
    api = ctx.server.info.api_url
    out = tmp / f"shards-{n}"
    deployment = deploy_sharded(args, manifest, out, f"bench-{n}", ctx)
    workers = start_workers(args.workers, POOL, api, tmp)
    sampler = Sampler([w.proc.pid for w in workers])
    sampler.start()
    ctx.emu.reset()
    e0 = ctx.emu.cpu()
    try:
        t0 = time.monotonic()
        parent = _api(api, "POST", f"/deployments/{deployment}/create_flow_run", {})["id"]
        state = wait_for_end(api, parent, poll=1.0, timeout=args.timeout)
        wall = time.monotonic() - t0
    finally:
        stop_workers(workers, sampler, str(tmp))
        runs = sampler.stop()
    emu_cpu = ctx.emu.cpu() - e0
    raw = {pid: asdict(seen) for pid, seen in runs.items()}
    reaped = [(w.proc.returncode, w.maxrss_mib, w.cpu_s) for w in workers]
    emit({"bench": "run_memory_shards_raw", "requests": n, "parent": parent, "runs": raw, "workers": reaped})
    ok = None
    if (out / "run.json").exists():
        m = Measured("shards")
        take_run_json(m, json.loads((out / "run.json").read_text()))
        ok = m.ok
    return shard_figures(n, parent, state["state_type"], wall, ok, emu_cpu, runs, workers)


def shard_figures(
    n: int,
    parent: str,
    state: str,
    wall: float,
    ok: int | None,
    emu_cpu: float,
    runs: dict[str, Seen],
    workers: Sequence[Worker],
) -> list[Figure]:
    """The parent's row, the largest shard's, every shard's (range), and the workers' wait4 cross-check."""
    mib = 1 / 1024
    parents = [s for s in runs.values() if s.flow_run == parent]
    shards = sorted((s for s in runs.values() if s.flow_run != parent), key=lambda s: s.hwm_kib)
    figures = []
    if parents:
        p = parents[0]
        figures.append(Figure("shards", n, "parent", p.hwm_kib * mib, wall, p.cpu_s, ok, state, emu_cpu))
    if shards:
        top, low = shards[-1], shards[0]
        every = {"shards": len(shards), "rss_mib": [round(s.hwm_kib * mib) for s in shards]}
        largest = Figure("shards", n, "largest shard", top.hwm_kib * mib, None, top.cpu_s, None, "")
        largest.extra, largest.whole_run = every, False
        figures.append(largest)
        cpu = sum(s.cpu_s for s in shards)
        label = f"{len(shards)} shards: the smallest's RSS / CPU of all"
        figures.append(Figure("shards", n, label, low.hwm_kib * mib, None, cpu, None, ""))
    cpu = sum(w.cpu_s for w in workers)
    codes = ",".join(str(w.proc.returncode) for w in workers)
    label = f"{len(workers)} workers: largest process under one (wait4) / CPU of all"
    top_rss = max(w.maxrss_mib for w in workers)
    figures.append(Figure("shards", n, label, top_rss, None, cpu, None, codes))
    return figures


# --- the benchmark --------------------------------------------------------------------------------------


@dataclass
class Context:
    """What every run of the benchmark shares: its folder, the emulator and the Prefect server."""

    tmp: Path
    emu: Emulator
    server: Server


MODES = {"local": run_local, "s3": run_s3, "shards": run_shards}


@contextmanager
def started(args: argparse.Namespace, tmp: Path) -> Iterator[Context]:
    """The emulator (render cache warmed) and a running Prefect server (`--database`), with the process
    pool."""
    with emulator(args, args.latency, tmp) as emu, prefect_server(tmp / "prefect", args.database) as server:
        if "shards" in args.modes:
            create_process_pool(server.info.api_url, POOL)
        yield Context(tmp, emu, server)


def measure(args: argparse.Namespace, code: str) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="bench-run-memory-", dir=args.tmp) as name:
        tmp = Path(name)
        with started(args, tmp) as ctx:
            for n in args.requests:
                manifest = tmp / f"m{n}.csv"
                write_manifest(manifest, n)
                for mode in args.modes:
                    got = MODES[mode](args, n, manifest, tmp, ctx)
                    for f in got:
                        f.extra |= {"load_average": [round(x, 2) for x in os.getloadavg()]}
                        emit({"bench": "run_memory", "code": code, **asdict(f)})
                    figures += got
                    shutil.rmtree(tmp / f"{mode}-{n}", ignore_errors=True)  # 64 KiB a request and more
                manifest.unlink()
    return figures


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[50_000, 200_000, 500_000])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--src", help="another checkout whose src/ runs (the code before a change)")
    report = "pass --report or --no-report to every run (default: neither, the run's default)"
    parser.add_argument("--report", action=argparse.BooleanOptionalAction, default=None, help=report)
    parser.add_argument("--latency", type=float, default=0.01, help="emulator seconds per generation")
    parser.add_argument("--concurrency", type=int, default=64, help="of each run, or each shard")
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="`imagebatch worker` processes (shards)")
    parser.add_argument("--timeout", type=float, default=6 * 3600, help="seconds a sharded run may take")
    parser.add_argument("--tmp", help="where the bench's folder goes (default: the system's temp)")
    database = "the Prefect server's database: a sharded run of 50,000+ can wedge SQLite (docs: PostgreSQL)"
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite", help=database)
    parser.set_defaults(jpeg_rate=0.0, thought_image_rate=0.0)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    code = use_source(args.src)
    print(f"code: {code}; {machine()}", flush=True)
    figures = measure(args, code)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    report = "default" if args.report is None else args.report
    print(
        f"\nrun memory: latency {args.latency} s, concurrency {args.concurrency}, report {report}; "
        f"code {code}; load average {load}"
    )
    print(table(HEADER, [f.row() for f in figures]))
    for f in figures:
        if f.emulator_cpu_s is not None:
            emulator_ms = per_request_ms(f.emulator_cpu_s, f.requests)
            print(f"  {f.mode} {f.requests:,}: emulator CPU {emulator_ms} ms/req")


if __name__ == "__main__":
    main()
