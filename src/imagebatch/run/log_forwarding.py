"""Our loggers' records (the client's retry waits, the run's own lines) sent to Prefect's run log too, while
a flow runs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def forward_logs_to_prefect(*names: str) -> Iterator[None]:
    """Send the records of the loggers `names` to Prefect's run log too, as Prefect's own
    `PREFECT_LOGGING_EXTRA_LOGGERS` does, so that it works however the flow is started; only while the
    block runs (outside a flow run Prefect's API handler has nowhere to send them)."""
    handlers = logging.getLogger("prefect.extra").handlers
    added: list[tuple[logging.Logger, logging.Handler]] = []
    for name in names:
        target = logging.getLogger(name)
        added += [(target, h) for h in handlers if h not in target.handlers]
    for target, handler in added:
        target.addHandler(handler)
    try:
        yield
    finally:
        for target, handler in added:
            target.removeHandler(handler)
