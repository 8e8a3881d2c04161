"""report.html kept true while a review runs: the file a colleague opens never says "open" for an image
decided a minute ago.

`ReportKeeper` looks at the review record every `interval` seconds (from a thread of its own) and, when
the decisions in force changed since the report was last built (this server's, or another server's on
the same location), rebuilds it with what `imagebatch report` runs. A burst of decisions is one rebuild:
the first decision of a quiet spell is in the report within `interval` seconds (default 15), however
many follow it. A rebuild that fails (a full disk, a bucket that refuses) is said once on stderr and
tried again at the next change; the review goes on.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

REPORT_INTERVAL = 15.0
"""Seconds between two looks at the record (so the report is at most this late)."""


class ReportKeeper:
    """Calls `rebuild` when `version()` (the decisions' version, `DecisionCache.version` after a
    `refresh`) moved since the last call, checking every `interval` seconds until `stop`."""

    def __init__(
        self, rebuild: Callable[[], object], version: Callable[[], int], interval: float = REPORT_INTERVAL
    ) -> None:
        self.rebuild, self.version, self.interval = rebuild, version, interval
        self.built = 0
        """The version the report shows. 0 (no decision read) at start: where the record already holds
        decisions, the report is built again at the first look, as it may predate some of them."""
        self.rebuilds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    def start(self) -> ReportKeeper:
        self._thread = threading.Thread(target=self._loop, name="imagebatch-review-report", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop looking; the decisions made since the last rebuild are built into the report first."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def check(self) -> bool:
        """Rebuild the report if the decisions changed since it was built; True if it was."""
        now = self.version()
        if now == self.built:
            return False
        try:
            self.rebuild()
        except Exception as exc:  # the review must outlive a report it cannot write
            if not self._failed:
                print(f"imagebatch review: report.html not rebuilt: {exc}", file=sys.stderr, flush=True)
            self._failed = True
            return False
        self._failed = False
        self.built = now
        self.rebuilds += 1
        return True
