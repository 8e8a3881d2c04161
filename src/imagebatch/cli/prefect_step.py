"""`prefect deploy`'s build step in the repository's prefect.yaml: `imagebatch deploy ARGS --check` run in
the `prefect deploy` process itself (a Python step, `imagebatch.cli.prefect_step.check`).

Why not `run_shell_script`: a refusal there (no service address, a missing pool) is a failed step, which
Prefect's CLI prints between two tracebacks around the command's one line. Here a refusal ends `prefect
deploy` with that one line and the command's exit code (a `SystemExit`, which Prefect lets through), and
nothing is deployed.
"""

from __future__ import annotations

import shlex

from imagebatch.run.exit_codes import EXIT_OK


def check(args: str) -> dict[str, str]:
    """Run `imagebatch deploy ARGS --check`; leave with its exit code unless it passed."""
    from imagebatch.cli.main import main

    code = main(["deploy", *shlex.split(args), "--check"])
    if code != EXIT_OK:
        raise SystemExit(code)
    return {}
