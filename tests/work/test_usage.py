"""The usage summary: by route and model, from the ledger's attempts and the run's records."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers.memory import traced_peak

from imagebatch.storage import layout
from imagebatch.storage.csvcells import read_csv
from imagebatch.work.store import OutputStore, RequestRecord
from imagebatch.work.usage import DURATION_VALUES, DistinctKeys, percentile, summarise_usage, usage_csv


def attempt(key: str, route: str, model: str, outcome: str, **extra: Any) -> dict[str, Any]:
    return {"idempotency_key": key, "route": route, "model": model, "outcome": outcome, **extra}


LEDGER = [
    attempt("a", "native", "native-image-2", "ok", images=2, duration_s=1.0,
            usage={"promptTokenCount": 10, "candidatesTokenCount": 2240, "totalTokenCount": 2260}),
    attempt("b", "native", "native-image-2", "error", images=0, duration_s=0.2, usage=None),
    attempt("c", "images_generations", "compat-image-2", "error", duration_s=0.1),
    attempt("c", "images_generations", "compat-image-2", "ok", images=1, duration_s=3.0,
            usage={"input_tokens": 5, "output_tokens": 1056}),
    attempt("d", "messages", "claude-compat-small", "ok", duration_s=0.5,
            usage={"input_tokens": 3, "output_tokens": 7}),
]  # fmt: skip


def record(key: str, route: str, model: str, status: str) -> RequestRecord:
    return RequestRecord(
        job_id=key, request_index=0, turn_index=0, status=status, model=model, route=route,  # type: ignore[arg-type]
        idempotency_key=key,
    )  # fmt: skip


def test_the_summary_counts_requests_attempts_images_tokens_and_doubt() -> None:
    rows = summarise_usage(LEDGER, [record("b", "native", "native-image-2", "unknown")])
    by = {(r.route, r.model): r.to_dict() for r in rows}
    assert [route for route, _ in by] == ["images_generations", "messages", "native"]
    native = by[("native", "native-image-2")]
    assert (native["requests"], native["attempts"], native["images"], native["unknown"]) == (2, 2, 2, 1)
    assert (native["input_tokens"], native["output_tokens"], native["total_tokens"]) == (10, 2240, 2260)
    images = by[("images_generations", "compat-image-2")]
    assert (images["requests"], images["attempts"], images["images"], images["total_tokens"]) == (
        1,
        2,
        1,
        1061,
    )
    assert (images["latency_p50_s"], images["latency_p95_s"]) == (0.1, 3.0)
    assert by[("messages", "claude-compat-small")]["images"] == 0


def write_usage_summary(out: Path) -> Path:
    """usage-summary.csv written as a run's end writes it (`run.outputs`): from the store's usage ledger."""
    store = OutputStore(out)
    store.backend.put(layout.USAGE_SUMMARY_CSV, usage_csv(summarise_usage(store.usage_lines())))
    return out / layout.USAGE_SUMMARY_CSV


def test_percentiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile([], 0.5)) == (50.0, 95.0, None)


def test_the_csv_round_trips(tmp_path: Path) -> None:
    (tmp_path / "usage.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LEDGER))
    path = write_usage_summary(tmp_path)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["route"] for r in rows] == ["images_generations", "messages", "native"]
    assert rows[2]["unknown"] == "0" and rows[1]["latency_p95_s"] == "0.5"


def test_a_model_named_like_a_formula_is_neutralised_and_read_back(tmp_path: Path) -> None:
    """Issue 21 #5: a text route's model name comes from the manifest, and usage-summary.csv is opened in
    spreadsheets."""
    model = "=cmd|' /C calc'!A0"
    ledger = [attempt("a", "messages", model, "ok", duration_s=0.5), attempt("b", "@route", "-m", "ok")]
    (tmp_path / "usage.jsonl").write_text("".join(json.dumps(line) + "\n" for line in ledger))
    path = write_usage_summary(tmp_path)
    with path.open(newline="") as fh:
        raw = list(csv.DictReader(fh))
    assert [(r["route"], r["model"]) for r in raw] == [("'@route", "'-m"), ("messages", "'" + model)]
    assert [(r["route"], r["model"]) for r in read_csv(path)] == [("@route", "-m"), ("messages", model)]


def test_durations_are_counted_by_value_and_coarsened_past_the_bound_with_the_same_percentiles() -> None:
    """The state per (route, model) is bounded: a count per distinct duration (journaled to 0.1 ms), and
    past `DURATION_VALUES` of them each rounded to one decimal less."""
    durations = [round(0.0001 * i, 4) for i in range(1, DURATION_VALUES * 3)]  # 0.1 ms steps, all distinct
    ledger = [attempt(f"k{i}", "native", "m", "ok", duration_s=d) for i, d in enumerate(durations)]
    [row] = summarise_usage(ledger)
    assert len(row._durations) <= DURATION_VALUES and row._durations.total() == len(durations)
    exact_p50, exact_p95 = percentile(durations, 0.5), percentile(durations, 0.95)
    assert row.latency_p50_s is not None and row.latency_p95_s is not None and exact_p50 and exact_p95
    assert abs(row.latency_p50_s - exact_p50) <= 0.0005 and abs(row.latency_p95_s - exact_p95) <= 0.0005
    assert row.requests == len(durations)  # every key distinct, counted by its digest


def test_few_distinct_durations_keep_exact_percentiles_and_repeated_keys_count_once() -> None:
    ledger = [attempt(f"k{i % 50}", "native", "m", "ok", duration_s=(i % 7) * 0.25) for i in range(1000)]
    [row] = summarise_usage(ledger)
    durations = [(i % 7) * 0.25 for i in range(1000)]
    assert (row.latency_p50_s, row.latency_p95_s) == (percentile(durations, 0.5), percentile(durations, 0.95))
    assert (row.requests, row.attempts) == (50, 1000)


def test_distinct_keys_past_the_buffer_are_counted_once_whichever_side_of_a_spill_they_came(
    monkeypatch: Any,
) -> None:
    """Keys repeated across the set's spills into the SQLite file, and within each, count once."""
    monkeypatch.setattr(DistinctKeys, "BUFFER", 7)
    keys = DistinctKeys()
    for i in range(100):
        keys.add(f"k{i % 31}")  # 31 distinct keys over 14 spills, each key added 3 or 4 times
    assert len(keys) == 31
    keys.add("k0")
    keys.add("new")
    assert len(keys) == 32  # counted again after a count: the set spilled, the file kept
    ledger = [attempt(f"k{i % 40}", "native", "m", "ok") for i in range(120)]
    ledger += [attempt(f"k{i}", "images_generations", "c", "ok") for i in range(9)]
    rows = {row.route: row for row in summarise_usage(ledger)}
    assert (rows["native"].requests, rows["native"].attempts) == (40, 120)
    assert (rows["images_generations"].requests, rows["images_generations"].attempts) == (9, 9)
    assert "_keys" not in rows["native"].to_dict()


def test_the_summary_of_a_large_ledger_holds_a_bounded_part_of_its_keys_in_memory(monkeypatch: Any) -> None:
    """60,000 distinct keys, 12 buffers' worth: their digests in one set would hold about 4 MB; past the
    buffer they go to disk, so what Python holds at any time stays near one buffer's worth."""
    monkeypatch.setattr(DistinctKeys, "BUFFER", 5_000)
    n = 60_000

    def ledger() -> Iterator[dict[str, str]]:
        return ({"idempotency_key": f"ib1-{i:032x}", "route": "native", "model": "m"} for i in range(n))

    rows, peak = traced_peak(lambda: summarise_usage(ledger()), 2 * 2**20)
    [row] = rows
    assert row.requests == n
    assert peak < 2 * 2**20, f"peak {peak / 2**20:.1f} MiB"
