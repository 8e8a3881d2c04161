"""A shard that the sharded run's parent runs itself (`run.shard_runs`): Prefect's flow engine
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

import contextlib
import json
import runpy
import subprocess
import sys
from typing import Any

from imagebatch.gateway.constants import ENV_API_KEY, STORE_SECRETS


def start(run_id: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The parent's side: this module for the flow run `run_id` in a child process, in `env` (as a process
    worker gives a run's: `run.shard_runs._environment`) less the API key and the stores' secrets, which go
    to the child's stdin."""
    env = dict(env)
    secrets = {name: env.pop(name) for name in (ENV_API_KEY, *STORE_SECRETS) if name in env}
    command = [sys.executable, "-m", "imagebatch.run.shard_child", str(run_id)]
    # A session of its own: a signal to the parent's process group (a worker's, a cancellation's) stops
    # the parent, which stops this child with one signal of its own (`shard_runs._signal_ours`), never two.
    child = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, start_new_session=True)
    assert child.stdin is not None
    with contextlib.suppress(BrokenPipeError), child.stdin:  # a child that died at once is reaped as such
        child.stdin.write(json.dumps(secrets).encode() + b"\n")
    return child


def main(argv: list[str]) -> None:
    """The child's side: the secrets from stdin into this process's environment, then Prefect's engine."""
    import os

    line = sys.stdin.readline().strip()
    sys.stdin.close()
    secrets = json.loads(line) if line else {}
    for name in (ENV_API_KEY, *STORE_SECRETS):
        if isinstance(value := secrets.get(name), str) and value:
            os.environ[name] = value
    sys.argv = ["prefect.engine", *argv]
    try:
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        _exit_now_if_lost(exc.code if isinstance(exc.code, int) else int(exc.code is not None), exc.code)
        raise
    _exit_now_if_lost(0)


def _exit_now_if_lost(code: int, said: object = None) -> None:
    """The run has ended and written its records; if Prefect's server was lost meanwhile, exit now rather
    than after Prefect's exit handlers have tried every event they hold against it (minutes: the parent
    waits for this process's exit to know the shard has ended; `run.api_guard.lost_in_this_process`)."""
    import os

    from imagebatch.run.api_guard import lost_in_this_process

    if lost_in_this_process():
        if isinstance(said, str):  # what `sys.exit(message)` would have printed
            print(said, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
