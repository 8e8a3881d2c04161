"""The ids a manifest's rows have taken, in 8 to 16 bytes a row rather than the ~100 of a set of strings.

`JobChecker.claim_id` needs to know whether an id (in any case) is new. Holding every id seen costs about
100 bytes a row (500,000 rows: 50 MB, held by every shard of a sharded run). `IdHashes` holds each id's
64-bit hash (Python's own string hash) in one array instead, as an open-addressing set. Two ids with one
hash are a duplicate, or (for different ids, about once in 10^8 manifests of 500,000 rows) a collision:
either way the manifest is read once more (`load.load_manifest`), that time with the repeated hashes known
(`repeated`), and the ids that have them looked up exactly, so that every duplicate is named with its
first row exactly as a set of the ids would name it, and a collision costs only the second reading.
"""

from __future__ import annotations

from array import array

_START = 1 << 10
"""Slots at first; the set doubles when more than half are taken."""


class IdHashes:
    """A set of 64-bit hashes in one array of slots (0 marks a free one; a hash of 0 is stored as 1)."""

    def __init__(self) -> None:
        self._slots = array("q", bytes(8 * _START))
        self._mask = _START - 1
        self._count = 0
        self.repeated: set[int] = set()
        """The hashes `add` has seen more than once."""

    def add(self, value: int) -> bool:
        """Add the hash `value`; False (and `repeated` holds it) when it was there already."""
        value = value or 1
        slots, mask = self._slots, self._mask
        at = value & mask
        while taken := slots[at]:
            if taken == value:
                self.repeated.add(value)
                return False
            at = (at + 1) & mask
        slots[at] = value
        self._count += 1
        if self._count * 2 > mask:
            self._grow()
        return True

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        value = value or 1
        slots, mask = self._slots, self._mask
        at = value & mask
        while taken := slots[at]:
            if taken == value:
                return True
            at = (at + 1) & mask
        return False

    def __len__(self) -> int:
        return self._count

    def _grow(self) -> None:
        old = self._slots
        size = 2 * len(old)
        slots, mask = array("q", bytes(8 * size)), size - 1
        for value in old:
            if value:
                at = value & mask
                while slots[at]:
                    at = (at + 1) & mask
                slots[at] = value
        self._slots, self._mask = slots, mask
