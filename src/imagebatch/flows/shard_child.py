"""A shard that the sharded run's parent runs itself (`flows.shards`): `prefect flow-run execute RUN` in a
child process that gets the API key on its standard input, never in its environment.

A child started with the key in its environment would show it in `/proc/PID/environ` (and hand it on to
anything it starts). So the parent leaves `IMAGEBATCH_API_KEY` out of the child's environment and writes it
to the child's stdin; the child reads one line, keeps it in its own `os.environ` (where the flow's
`resolve_api_key` looks; Linux's `/proc/PID/environ` keeps showing the environment the process started
with), and runs Prefect's own command in this process.

    python -m imagebatch.flows.shard_child RUN_ID     (the key, if any, on stdin)
"""

from __future__ import annotations

import runpy
import sys

from imagebatch.gateway.constants import ENV_API_KEY


def main(argv: list[str]) -> None:
    import os

    key = sys.stdin.readline().strip()
    sys.stdin.close()
    if key:
        os.environ[ENV_API_KEY] = key
    sys.argv = ["prefect", "flow-run", "execute", *argv]
    runpy.run_module("prefect", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
