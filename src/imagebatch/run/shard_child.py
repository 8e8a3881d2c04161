"""A shard that the sharded run's parent runs itself (`run.shards`): Prefect's flow engine
(`python -m prefect.engine RUN`, what a worker's flow process runs) in a child process that gets the API
key and the object store's secrets on its standard input, never in its environment.

The engine runs in this very process (not under `prefect flow-run execute`, which starts it as a further
child in a process group of its own): the parent's one SIGTERM on a stop reaches the flow, which stops
gracefully (`run.graceful_stop`); a supervisor in between would die of it while its engine went on
sending.

A child started with the key in its environment would show it in `/proc/PID/environ` (and hand it on to
anything it starts). So the parent leaves `IMAGEBATCH_API_KEY` and the stores' secret variables
(`gateway.constants.STORE_SECRETS`, such as `AWS_SECRET_ACCESS_KEY`) out of the child's environment and writes
them to the child's stdin, as one JSON object on one line; the child keeps them in its own `os.environ`
(where the flow's `resolve_api_key` and the store's credential chain look; Linux's `/proc/PID/environ`
keeps showing the environment the process started with), and runs Prefect's flow engine in this process.

    python -m imagebatch.run.shard_child RUN_ID     ({"IMAGEBATCH_API_KEY": ..., ...} on stdin)
"""

from __future__ import annotations

import runpy
import sys

from imagebatch.gateway.constants import ENV_API_KEY, STORE_SECRETS


def main(argv: list[str]) -> None:
    import json
    import os

    line = sys.stdin.readline().strip()
    sys.stdin.close()
    secrets = json.loads(line) if line else {}
    for name in (ENV_API_KEY, *STORE_SECRETS):
        if isinstance(value := secrets.get(name), str) and value:
            os.environ[name] = value
    sys.argv = ["prefect.engine", *argv]
    runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
