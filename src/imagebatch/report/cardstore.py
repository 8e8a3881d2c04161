"""The review's cards on disk: one row per card in a private SQLite file (`sqlite3.connect("")`: made in
the temporary directory, removed when the store is closed or collected), in the order the page shows
them, each with its key, variant, images, reference images and the page's data as JSON.

The server looks a card up by key (a decision, an image, a reference) and streams the page's card data
from the store a batch at a time (`json_chunks`, `json_length` bytes in all), so that it holds one batch
of cards, not the run's: 200,000 cards are a file of a few tens of MB, not some GB of objects.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from imagebatch.report.review_page import inline_json

BATCH = 1_000
"""Cards written per statement, and read per query."""


@dataclass(frozen=True, slots=True)
class ReviewCard:
    """One image request to review: its key and variant, its images, and what the page shows of it."""

    key: str
    variant: int
    images: tuple[str, ...]
    """Its images' names in the output location (`images/<job>/<file>`), each checked by `safe_name`."""
    shown: dict[str, Any]
    """The page's data: `k` key, `v` variant, `nv` variants of its request, `t` title (`card_title`),
    `p` prompt, `f` facts, `n` images, `m` the shown columns' values; where there are any, `r` reference
    images, `s` a status other than made (`MADE`), `pk` the keys of the older variants it replaces (oldest
    first), `x` 1 if a newer variant replaced it, `j` its job's id if the job has several requests; `g`
    its group's value (when grouped)."""
    references: tuple[str, ...] = ()
    """Its request's reference images and mask, as the plan names them (a path, or an object's URL)."""


_COLUMNS = "key, variant, images, refs, shown"


def _card(found: tuple[str, int, str, str, str]) -> ReviewCard:
    key, variant, images, refs, shown = found
    return ReviewCard(key, variant, tuple(json.loads(images)), json.loads(shown), tuple(json.loads(refs)))


class CardStore(Mapping[str, ReviewCard]):
    """The cards by key, iterated in the page's order. Filled by `add` then `done`; read from any
    thread (one statement at a time)."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("", check_same_thread=False)
        self._db.execute(
            "CREATE TABLE cards (ord INTEGER PRIMARY KEY, key TEXT, variant INTEGER, images TEXT, refs TEXT, "
            "shown TEXT)"
        )
        self._lock = threading.Lock()
        self._batch: list[tuple[Any, ...]] = []
        self._count = 0
        self.json_length = 2
        """The bytes of the cards' data as the page inlines it (`json_chunks`): `[`, `]` and the commas."""

    def add(self, card: ReviewCard) -> None:
        shown = inline_json(card.shown)
        self.json_length += len(shown.encode()) + (1 if self._count else 0)
        images, refs = json.dumps(card.images), json.dumps(card.references)
        self._batch.append((self._count, card.key, card.variant, images, refs, shown))
        self._count += 1
        if len(self._batch) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT INTO cards VALUES (?, ?, ?, ?, ?, ?)", self._batch)
        self._batch = []

    def done(self) -> CardStore:
        """Every card added: index them by key."""
        self._flush()
        with self._lock, self._db:
            self._db.execute("CREATE INDEX card_keys ON cards (key, ord)")
        return self

    def __getitem__(self, key: str) -> ReviewCard:
        query = f"SELECT {_COLUMNS} FROM cards WHERE key = ? ORDER BY ord LIMIT 1"
        with self._lock:
            found = self._db.execute(query, (key,)).fetchone()
        if found is None:
            raise KeyError(key)
        return _card(found)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return (
                self._db.execute("SELECT 1 FROM cards WHERE key = ? LIMIT 1", (key,)).fetchone() is not None
            )

    def __len__(self) -> int:
        return self._count

    def having(self, keys: Iterable[str]) -> set[str]:
        """Those of `keys` that are cards' (a few hundred looked up per query)."""
        found: set[str] = set()
        wanted = iter(keys)
        while batch := list(itertools.islice(wanted, 500)):
            marks = ",".join("?" * len(batch))
            with self._lock:
                found.update(
                    k for (k,) in self._db.execute(f"SELECT key FROM cards WHERE key IN ({marks})", batch)
                )
        return found

    def _pages(self, columns: str) -> Iterator[list[tuple[Any, ...]]]:
        """The cards' `columns` a batch at a time, in order (each batch its own query: the store may be
        read by other threads between two)."""
        after = -1
        while True:
            with self._lock:
                found = self._db.execute(
                    f"SELECT ord, {columns} FROM cards WHERE ord > ? ORDER BY ord LIMIT ?", (after, BATCH)
                ).fetchall()
            if found:
                yield [row[1:] for row in found]
                after = found[-1][0]
            if len(found) < BATCH:
                return

    def __iter__(self) -> Iterator[str]:
        for page in self._pages("key"):
            yield from (key for (key,) in page)

    def ordered(self) -> Iterator[ReviewCard]:
        """The cards in the page's order."""
        for page in self._pages(_COLUMNS):
            yield from (_card(found) for found in page)

    def json_chunks(self) -> Iterator[bytes]:
        """The cards' data as the page inlines it (`review_page.inline_json` of the list), a batch at a
        time: `json_length` bytes in all."""
        yield b"["
        first = True
        for page in self._pages("shown"):
            text = ",".join(shown for (shown,) in page)
            yield (text if first else "," + text).encode()
            first = False
        yield b"]"
