"""What a slot of a Prefect global concurrency limit costs, taken three ways (bench/README.md, "Global
concurrency limit"). Not a test.

    uv run python bench/bench_slots.py                       # SQLite; --database postgres, --slots, --threads

Against a running `prefect server start` with a limit of 64 (never binding), `--slots` slots are taken and
given back, by one thread and then by `--threads` threads:
- `prefect concurrency()`: Prefect's `concurrency(name, lease_duration=300, strict=True)` per slot (what
  `--global-limit` did before `run.limits.SlotBroker`);
- `lease per slot`: one `increment-with-lease` and one `decrement-with-lease` per slot on one shared client
  (the floor for asking the server each time);
- `SlotBroker`: imagebatch's broker, which passes a slot from one holder to the next waiting one.
Printed: slots a second, the bench process's CPU and Prefect's server CPU (its process tree, /proc) a slot.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale_harness import prefect_server, tree_cpu

LIMIT = "bench-slots"


def measure(name: str, take: Callable[[], Any], slots: int, threads: int, server_pid: int) -> None:
    cpu0, server0, wall0 = time.process_time(), tree_cpu(server_pid), time.perf_counter()

    def one(_: int) -> None:
        with take():
            pass

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(slots)))
    wall = time.perf_counter() - wall0
    cpu = (time.process_time() - cpu0) / slots * 1000
    server = (tree_cpu(server_pid) - server0) / slots * 1000
    print(
        f"| {name} | {threads} | {slots / wall:.1f} | {cpu:.2f} | {server:.2f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--slots", type=int, default=200)
    parser.add_argument("--threads", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, prefect_server(Path(tmp) / "prefect", args.database) as server:
        os.environ["PREFECT_API_URL"] = server.info.api_url
        from prefect.client.orchestration import get_client
        from prefect.concurrency.sync import concurrency

        from imagebatch.platform.limits import set_limits
        from imagebatch.run.limits import SlotBroker

        set_limits(LIMIT, 64, None)
        with ExitStack() as stack:
            client = stack.enter_context(get_client(sync_client=True))
            broker = stack.enter_context(SlotBroker(LIMIT))

            class LeasePerSlot:
                def __enter__(self) -> None:
                    answer = client.increment_concurrency_slots_with_lease(
                        names=[LIMIT], slots=1, mode="concurrency", lease_duration=300
                    )
                    self.lease = answer.json()["lease_id"]

                def __exit__(self, *exc: object) -> None:
                    client.release_concurrency_slots_with_lease(self.lease)

            ways: list[tuple[str, Callable[[], Any]]] = [
                ("prefect concurrency()", lambda: concurrency(LIMIT, lease_duration=300, strict=True)),
                ("lease per slot", LeasePerSlot),
                ("SlotBroker", broker),
            ]
            print(f"{args.slots} slots, limit 64, Prefect server on {args.database}\n")
            print("| way | threads | slots/s | bench CPU ms/slot | server CPU ms/slot |")
            print("|-|-|-|-|-|")
            for name, take in ways:
                for threads in (1, args.threads):
                    measure(name, take, args.slots, threads, server.info.pid)
        print(f"\nSlotBroker: {broker.granted} slots from the server, {broker.passed_on} passed on")


if __name__ == "__main__":
    main()
