"""Export's reads and writes in parallel, in order and bounded: fetching a bucket's sources, hashing
DEST's files, uploading (`io_map`), and the converters' window (`windowed`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

IO_THREADS = 16
"""Reads and writes at once: fetching a bucket's sources, hashing DEST's files, uploading."""

T = TypeVar("T")
R = TypeVar("R")


def windowed(executor: Executor, fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[R]:
    """`fn` over `items` on `executor`, results in order, at most `window` submitted and not yet taken
    (`Executor.map` submits everything at once: 10,000 images' bytes in memory)."""
    pending: deque[Any] = deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def io_map(fn: Callable[[T], R], items: list[T], threads: int = IO_THREADS) -> Iterator[R]:
    """`fn` over `items` on `threads` I/O threads, in order (file and object-store reads, hashing)."""
    with ThreadPoolExecutor(
        max(1, min(threads, len(items))), thread_name_prefix="imagebatch-export-io"
    ) as ex:
        yield from windowed(ex, fn, items, 2 * threads)
