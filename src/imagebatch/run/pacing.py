"""`--rpm N`: request starts spaced 60 / N seconds apart across every thread of a run."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class Pacer:
    """Spaces request starts `interval` seconds apart across every thread of a run (`--rpm N`: 60 / N)."""

    def __init__(
        self,
        interval: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._sleep = sleep
        self._clock = clock
        self._next = -math.inf
        self._lock = threading.Lock()

    def wait(self) -> float:
        """Wait for this start's slot; return the wait."""
        with self._lock:
            now = self._clock()
            slot = max(now, self._next)
            self._next = slot + self.interval
        wait = slot - now
        if wait > 0:
            self._sleep(wait)
        return wait
