"""Orchestration only: the Prefect flow and the `imagebatch` command."""

import os

# Prefect's telemetry is off unless the user turns it on (set the variables to true / 0). Two reasons:
# the ephemeral server's telemetry heartbeat writes to its SQLite database while the server is starting
# and loses the race for the lock ("database is locked" tracebacks on the user's terminal), and the
# client-side telemetry prints a notice over our progress bar and reports to a host these machines
# cannot reach. These must be set before Prefect reads its settings, hence here.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
