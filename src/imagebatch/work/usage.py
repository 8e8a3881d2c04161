"""The usage summary of an output folder: by route and model, what was asked of the service and what it
delivered, from the usage ledger (`usage.jsonl`, one line per HTTP attempt, every run into the folder)
and the run's records (for requests whose billing is in doubt).

Written to `usage-summary.csv` at the end of every run and printed below the status table. Token counts
are the service's own, summed where its usage object has them under any of the names the routes use
(native `usageMetadata`, chat, images, messages, responses); a route that reports none shows blanks.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from imagebatch.storage.csvcells import write_csv
from imagebatch.work.request_record import RequestRecord
from imagebatch.work.stateindex import StateFile

INPUT_TOKENS = ("promptTokenCount", "prompt_tokens", "input_tokens")
OUTPUT_TOKENS = ("candidatesTokenCount", "completion_tokens", "output_tokens")
TOTAL_TOKENS = ("totalTokenCount", "total_tokens")
DURATION_VALUES = 20_000
"""The distinct durations counted per (route, model) before they are rounded coarser: 0.1 ms steps up
to 2 s, 1 ms steps up to 20 s."""
COLUMNS = (
    "route", "model", "requests", "attempts", "images", "unknown",
    "input_tokens", "output_tokens", "total_tokens", "latency_p50_s", "latency_p95_s",
)  # fmt: skip


class DistinctKeys:
    """How many distinct keys were added, in bounded memory: a 64-bit digest of each (`key_digest`) in a
    set until `BUFFER` of them, then in a nameless SQLite file in the machine's temporary folder
    (`work.stateindex.StateFile`), so that the ledger of a folder of any size is counted in the same memory
    (a set of a million digests is about 60 MB)."""

    BUFFER = 50_000

    def __init__(self) -> None:
        self._recent: set[int] = set()
        self._file: StateFile[bytes] | None = None

    def add(self, key: object) -> None:
        self._recent.add(key_digest(key))
        if len(self._recent) >= self.BUFFER:
            self._spill()

    def _spill(self) -> None:
        if self._file is None:
            self._file = StateFile(None, bytes, bytes)
        self._file.put((str(digest), b"") for digest in self._recent)
        self._recent = set()

    def __len__(self) -> int:
        if self._file is None:
            return len(self._recent)
        self._spill()
        return self._file.count()


@dataclass
class UsageRow:
    """One (route, model) of the summary."""

    route: str
    model: str
    requests: int = 0
    """Distinct idempotency keys sent."""
    attempts: int = 0
    """HTTP attempts (each retry counts)."""
    images: int = 0
    """Images delivered in successful answers."""
    unknown: int = 0
    """Requests whose outcome, and so whose billing, is in doubt."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    _keys: DistinctKeys = field(default_factory=lambda: DistinctKeys(), repr=False)
    """The distinct keys seen: the one state that grows with the ledger, bounded in memory."""
    _durations: Counter[float] = field(default_factory=Counter, repr=False)
    """How many attempts took each duration (`add_duration`): bounded by `DURATION_VALUES`."""

    def add_duration(self, seconds: float) -> None:
        """Count one attempt's duration. Durations are journaled to 0.1 ms, so their distinct values are
        few next to the attempts; past `DURATION_VALUES` of them every one is rounded to one decimal less
        (the percentiles then to that precision), which bounds the state whatever the ledger's size."""
        self._durations[round(seconds, self._decimals)] += 1
        while len(self._durations) > DURATION_VALUES:
            self._decimals -= 1
            coarser: Counter[float] = Counter()
            for value, count in self._durations.items():
                coarser[round(value, self._decimals)] += count
            self._durations = coarser

    _decimals: int = field(default=4, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


def _first(usage: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def token_counts(usage: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(input, output, total) tokens of one answer's usage object, by whichever names its route uses;
    the total is input + output when the route gives none."""
    inp, out, total = _first(usage, INPUT_TOKENS), _first(usage, OUTPUT_TOKENS), _first(usage, TOTAL_TOKENS)
    if total is None and inp is not None and out is not None:
        total = inp + out
    return inp, out, total


def _add(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value


def percentile(values: Iterable[float] | Counter[float], q: float) -> float | None:
    """The `q` quantile (0..1) by the nearest-rank method, of values or of a count of each value; None
    for no values."""
    counts = values if isinstance(values, Counter) else Counter(values)
    total = counts.total()
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return value
    return None  # not reached: the ranks end at the total


def key_digest(key: object) -> int:
    """A key as 64 bits (BLAKE2b): a set of these counts distinct keys in half the memory of the keys'
    text, and two of a million keys share one with odds of about 3 in 100 million."""
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "big")


def summarise_usage(
    ledger: Iterable[dict[str, Any]], records: Iterable[RequestRecord] = ()
) -> list[UsageRow]:
    """The summary by (route, model), sorted; `records` gives the `unknown` counts of the run."""
    rows: dict[tuple[str, str], UsageRow] = {}

    def row(route: str, model: str) -> UsageRow:
        return rows.setdefault((route, model), UsageRow(route, model))

    for line in ledger:
        route, model = str(line.get("route")), str(line.get("model"))
        r = row(route, model)
        r.attempts += 1
        r._keys.add(line.get("idempotency_key"))
        if isinstance(line.get("duration_s"), int | float):
            r.add_duration(float(line["duration_s"]))
        if line.get("outcome") == "ok":
            r.images += int(line.get("images") or 0)
        usage = line.get("usage")
        if isinstance(usage, dict):
            inp, out, total = token_counts(usage)
            r.input_tokens = _add(r.input_tokens, inp)
            r.output_tokens = _add(r.output_tokens, out)
            r.total_tokens = _add(r.total_tokens, total)
    for record in records:
        if record.status == "unknown":
            row(record.route, record.model).unknown += 1
    for r in rows.values():
        r.requests = len(r._keys)
        r.latency_p50_s = percentile(r._durations, 0.5)
        r.latency_p95_s = percentile(r._durations, 0.95)
    return [rows[k] for k in sorted(rows)]


def usage_csv(rows: list[UsageRow]) -> bytes:
    """usage-summary.csv's bytes."""
    buf = io.StringIO()
    write_csv(buf, COLUMNS, (r.to_dict() for r in rows))
    return buf.getvalue().encode()
