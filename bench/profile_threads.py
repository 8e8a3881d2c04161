"""Run a module with cProfile in every thread, for `bench_run_memory.py`'s `IMAGEBATCH_BENCH_PROFILE`.

    python bench/profile_threads.py DIR -m imagebatch.cli.main run M --out OUT ...

`cProfile` alone sees only the main thread, where a run mostly waits; its requests, dispatch and record
work are in threads. Here every thread started after the start gets a profiler of its own (installed by
`threading.setprofile` at the thread's first call), and at exit each thread's statistics are written to
DIR/<pid>-<n>-<thread name>.pstats. A thread's profiler is read at exit while the thread may still run
(a daemon thread): its figures are as complete as it got.

    python bench/profile_threads.py --summary DIR [N]     # every file added up: the top N by own time
"""

from __future__ import annotations

import atexit
import cProfile
import os
import pstats
import runpy
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

PROFILES: list[tuple[str, cProfile.Profile]] = []


def _start(_frame: FrameType, _event: str, _arg: Any) -> None:
    """The first profile event of a new thread: give it a profiler of its own (which replaces this hook)."""
    profile = cProfile.Profile()
    PROFILES.append((threading.current_thread().name, profile))
    profile.enable()


def _dump(folder: Path) -> None:
    for n, (name, profile) in enumerate(PROFILES):
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40]
        profile.dump_stats(folder / f"{os.getpid()}-{n:03d}-{safe}.pstats")


def summary(folder: Path, top: int) -> None:
    """The files of `folder` added up: the top functions by their own time, then by cumulative time."""
    files = sorted(str(f) for f in folder.glob("*.pstats"))
    stats = pstats.Stats(*files).strip_dirs()
    stats.files = []  # not a line per thread's file in the listing
    print(f"{len(files)} threads' profiles in {folder}")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--summary":
        summary(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 30)
        return
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: profile_threads.py DIR -m MODULE [ARGS...]")
    folder, module = Path(sys.argv[1]), sys.argv[3]
    folder.mkdir(parents=True, exist_ok=True)
    sys.argv = [module, *sys.argv[4:]]
    atexit.register(_dump, folder)
    threading.setprofile(_start)
    _start(sys._getframe(), "call", None)  # the main thread
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
