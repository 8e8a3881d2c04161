"""Prefect workers' flow-run processes, measured (`bench_run_memory.py`'s shards mode).

`start_workers` starts `imagebatch worker` processes (each in its own session, its own PREFECT_HOME);
`Sampler` reads, every 0.2 s, the VmHWM and CPU of every process under them from /proc and names each by
the `PREFECT__FLOW_RUN_ID` in its environment (a flow run's process, or one it started); `stop_workers`
drains the workers and reaps them with `wait4`, whose rusage is the largest process each ever had under
it and the CPU of all it reaped (exact, where sampling misses a process's last 0.2 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.scale_harness import CLI, CLK_TCK, KEY, base_env


@dataclass
class Seen:
    """A flow-run process as last sampled: its peak RSS, CPU and flow run."""

    hwm_kib: int = 0
    cpu_s: float = 0.0
    flow_run: str | None = None


class Sampler(threading.Thread):
    """Every `every` s, the VmHWM and CPU of each flow-run process under `roots` (from /proc)."""

    def __init__(self, roots: Sequence[int], every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.roots, self.every = list(roots), every
        self.seen: dict[int, Seen] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def stop(self) -> dict[str, Seen]:
        """Stop sampling; each flow run's largest process and the CPU of its processes, by flow run id."""
        self.done.set()
        self.join()
        self.sample()
        runs: dict[str, Seen] = {}
        for seen in self.seen.values():
            if seen.flow_run:  # a flow run's process, or one it started (same environment)
                run = runs.setdefault(seen.flow_run, Seen(flow_run=seen.flow_run))
                run.hwm_kib, run.cpu_s = max(run.hwm_kib, seen.hwm_kib), run.cpu_s + seen.cpu_s
        return runs

    def descendants(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                parents.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
        found, todo = [], list(self.roots)
        while todo:
            kids = parents.get(todo.pop(), [])
            found += kids
            todo += kids
        return found

    def sample(self) -> None:
        for pid in self.descendants():
            seen = self.seen.setdefault(pid, Seen())
            try:
                # Read at every sample, the last one standing: between fork and exec a child shows its
                # parent's environment (a worker's, without the variable, or the parent flow run's id).
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                runs = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"PREFECT__FLOW_RUN_ID=")]
                seen.flow_run = runs[0].decode() if runs else ""
                status = Path(f"/proc/{pid}/status").read_text()
                hwm = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
            except (OSError, IndexError):
                continue  # gone between the listing and the read: its last sample stands
            seen.hwm_kib = max(seen.hwm_kib, int(hwm[0])) if hwm else seen.hwm_kib
            seen.cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass
class Worker:
    """An `imagebatch worker` process of the bench, reaped with `wait4` when stopped."""

    proc: subprocess.Popen[bytes]
    maxrss_mib: float = 0.0
    cpu_s: float = 0.0


def start_workers(count: int, pool: str, api: str, tmp: Path) -> list[Worker]:
    """`imagebatch worker --pool POOL` processes, each in its own session with its own PREFECT_HOME."""
    workers = []
    for i in range(count):
        env = base_env() | {
            "PREFECT_API_URL": api,
            "PREFECT_HOME": str(tmp / f"worker-home-{i}"),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            "IMAGEBATCH_API_KEY": KEY,
        }
        with (tmp / f"worker-{i}.log").open("ab") as log:
            cmd = [*CLI, "worker", "--pool", pool, "--grace", "20"]
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        workers.append(Worker(proc))
    return workers


def stop_workers(workers: Sequence[Worker], sampler: Sampler, marker: str, grace: float = 60.0) -> None:
    """SIGTERM each worker (it drains its flow runs), reap it with `wait4` (its largest descendant's RSS
    and the CPU of all it reaped); SIGKILL what is left after `grace` s (a process is ours if `marker`,
    the bench's folder, is in its environment)."""
    left = sampler.descendants()
    for w in workers:
        w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for w in workers:
        while True:
            pid, status, usage = os.wait4(w.proc.pid, os.WNOHANG)
            if pid or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not pid:
            os.killpg(w.proc.pid, signal.SIGKILL)
            _, status, usage = os.wait4(w.proc.pid, 0)
        w.proc.returncode = os.waitstatus_to_exitcode(status)
        w.maxrss_mib, w.cpu_s = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    for pid in left:  # a flow run the drain did not end: only if it is still ours (not a reused pid)
        try:
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass
