"""`imagebatch.results(OUT)`: an output location's records as pandas DataFrames, for notebooks.

    import imagebatch

    r = imagebatch.results("out")  # or "s3://bucket/catalog"
    r.results.groupby("outcome").size()  # over every run: a complete folder is all succeeded
    r.results[r.results.outcome != "succeeded"]  # what is still to do
    r.usage.groupby("model")[["images", "total_tokens"]].sum()
    reviewed = r.results.merge(
        r.decisions, left_on=["idempotency_key", "variant"], right_on=["key", "variant"], how="left"
    )
    reviewed.groupby("decision").size()

- `results`: results.csv, one row per request (the last run's), its columns in order (`variant` added
  as 1, in its place, where a file written before variants has none; then the manifest's metadata
  columns); cells read back as written (`csvcells`); counts as nullable integers (`Int64`), everything
  else text, an empty cell missing (`<NA>`). Beside `status`, what the last run did with the request
  (`skipped`: done earlier, not sent again), `outcome` says where it stands over every run: `succeeded`
  for a request that succeeded in this run or an earlier one (results.csv's `succeeded` or `skipped`,
  as the journal's replay carries it), else the status itself. So after a rerun of a complete folder
  `status` is all `skipped` and `outcome` all `succeeded`. `outcome` is the row's own, one per image
  variant: a request redone (`--redo`) has a row per variant, each with its outcome. A manifest's own
  metadata column named `outcome` is kept, as `outcome_manifest`.
  A location whose run never ended has no results.csv: an empty table with results.csv's columns.
- `usage`: the usage ledger, one row per HTTP attempt of every run into the location (a folder's
  `usage.jsonl`; in an object store, the journal segments' usage lines), with the answer's token counts
  (`input_tokens`, `output_tokens`, `total_tokens`, by whichever names the route uses, as
  usage-summary.csv counts them), `started_at` as a UTC timestamp, and the raw `usage` object.
- `decisions`: the review decision in force for each image key (the last recorded, `cleared` included:
  reviewed, then undone), with `at` as a UTC timestamp. Joined to `results` on the key and the variant,
  `results.merge(decisions, left_on=["idempotency_key", "variant"], right_on=["key", "variant"],
  how="left")`, so the table has one `variant` column (joined on the key alone pandas would name the two
  `variant_x` and `variant_y`); an image without a decision has `decision` missing (`<NA>`). `stars`:
  its latest star rating (1 to 5, whoever gave it; `<NA>` unrated), which is not a decision: an image
  rated and not decided has a row with `decision` missing.
- `run`: run.json as its model (`work.runsummary.RunSummary`: `r.run.state`, `r.run.counts`), or None
  when there is none, or when its model refuses it (counted under `run.json` in `skipped`).
- `skipped`: how many bad lines were left out, by record (`results.csv`, `usage.jsonl`, `review.jsonl`;
  only those with any): a line that is not a JSON object, or is over `storage.bounded`'s bound, a count
  that is not an integer (`attempt: "three"`, `images: 1e30`), a results.csv row the CSV reader refuses
  (a cell over 128 KiB), a time that is not ISO 8601 (`"at":
  "yesterday"`). One bad line costs its own row, never the table; a `BadRecordsWarning` says so too.
  A record that is not a file (a FIFO, a device) is refused whole (`storage.bounded.RecordError`).

pandas is imported here only, and this module only when `imagebatch.results` is first used: `import
imagebatch` and every command stay free of it.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from imagebatch.extras import needs_extra
from imagebatch.storage import layout
from imagebatch.storage.bounded import BadLine
from imagebatch.work.decisions import RATED, Decision, iter_decisions
from imagebatch.work.outcome import DONE
from imagebatch.work.runsummary import RunSummary, RunSummaryError
from imagebatch.work.store import RESULT_COLUMNS, OutputStore
from imagebatch.work.usage import token_counts

with needs_extra("notebook", "imagebatch.results()"):  # pandas is the notebook extra (pyproject.toml)
    import pandas as pd

INTEGER_COLUMNS = ("request_index", "turn_index", "images", "width", "height", "attempts", "variant")
"""results.csv's counts, as nullable integers."""
VARIANT = "variant"
"""results.csv's variant number of an image: a missing column or cell is 1."""
OUTCOME = "outcome"
"""The column beside `status` saying where a request stands over every run (the module docstring)."""
OWN_OUTCOME = "outcome_manifest"
"""The name a manifest's own metadata column `outcome` takes in the table, so that neither hides the other."""
USAGE_COLUMNS = (
    "idempotency_key", "job_id", "request_index", "turn_index", "route", "model", "attempt", "started_at",
    "duration_s", "outcome", "http_status", "error_code", "request_id", "images", "retry_in",
    "input_tokens", "output_tokens", "total_tokens", "usage",
)  # fmt: skip
"""The usage table's columns, in order (a ledger line's other keys follow them)."""
USAGE_TYPES = {
    **dict.fromkeys(
        ("idempotency_key", "job_id", "route", "model", "outcome", "error_code", "request_id"), "string"
    ),
    **dict.fromkeys(("request_index", "turn_index", "attempt", "http_status", "images"), "Int64"),
    **dict.fromkeys(("input_tokens", "output_tokens", "total_tokens"), "Int64"),
    **dict.fromkeys(("duration_s", "retry_in"), "float64"),
}
"""The usage table's column types (`started_at` is a UTC timestamp, `usage` the raw object)."""
DECISION_COLUMNS = tuple(Decision.__dataclass_fields__)
USAGE_FILE = layout.jsonl(layout.USAGE_LEDGER)
T = TypeVar("T")


class BadRecordsWarning(UserWarning):
    """Some lines of a location's records were bad and left out of `results()`'s tables."""


@dataclass(frozen=True)
class Results:
    """An output location's records as DataFrames (see the module docstring)."""

    results: pd.DataFrame
    usage: pd.DataFrame
    decisions: pd.DataFrame
    skipped: Mapping[str, int] = field(default_factory=dict)
    """The bad lines left out, by record (`results.csv`, `usage.jsonl`, `review.jsonl`, `run.json`):
    those with any."""
    run: RunSummary | None = None
    """run.json (None without one, or when its model refuses it: counted in `skipped`)."""


def results(out: str | os.PathLike[str]) -> Results:
    """The records of the output location `out` (a folder, or `s3://bucket/prefix` and the like) as
    DataFrames; a bad line is left out and counted (`Results.skipped`, and a `BadRecordsWarning`).
    FileNotFoundError when it holds no run of imagebatch (no results.csv, run.json, nor usage ledger);
    `storage.bounded.RecordError` for a record that is not a file (a FIFO, a device)."""
    store = OutputStore(os.fspath(out))
    skipped: Counter[str] = Counter()
    rows = store.read_results(_counter(skipped, layout.RESULTS_CSV))
    usage = list(store.usage_lines(_counter(skipped, USAGE_FILE)))
    if rows is None and not usage and not store.backend.exists(layout.RUN_JSON):
        raise FileNotFoundError(f"{store.where} holds no run of imagebatch (no {layout.RESULTS_CSV})")
    decisions = list(iter_decisions(store.backend, _counter(skipped, layout.REVIEW_FILE)))
    try:
        run = store.read_run()
    except RunSummaryError:  # a record that is not a file is RecordError, and raised as the others
        run, skipped[layout.RUN_JSON] = None, 1
    good_rows = _keep(rows or [], _row_ok, skipped, layout.RESULTS_CSV)
    good_usage = _keep(usage, _usage_ok, skipped, USAGE_FILE)
    good_decisions = _keep(decisions, lambda d: _time_ok(d.at or None), skipped, layout.REVIEW_FILE)
    if skipped:
        said = ", ".join(f"{n:,} of {name}" for name, n in sorted(skipped.items()))
        warnings.warn(f"{store.where}: bad lines left out: {said}", BadRecordsWarning, stacklevel=2)
    return Results(
        results=results_frame(good_rows),
        usage=usage_frame(good_usage),
        decisions=decisions_frame(good_decisions),
        skipped=dict(skipped),
        run=run,
    )


def _counter(skipped: Counter[str], name: str) -> BadLine:
    def bad(_number: int) -> None:
        skipped[name] += 1

    return bad


def _keep(items: list[T], ok: Callable[[T], bool], skipped: Counter[str], name: str) -> list[T]:
    """The items `ok` accepts; the others counted in `skipped[name]`."""
    kept = [item for item in items if ok(item)]
    if len(kept) < len(items):
        skipped[name] += len(items) - len(kept)
    return kept


_INTEGER = re.compile(r"[+-]?\d+")
_INT64 = 1 << 63


def _integer_ok(value: object) -> bool:
    """Whether a ledger line's count becomes an `Int64` cell: missing, or a JSON number that is a whole
    one in its range (`1e30` is out of range, `"three"` no number)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value is None or (
        isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64
    )


def _cell_ok(cell: str | None) -> bool:
    """Whether a results.csv count's cell becomes an `Int64` cell: empty, or a whole number in range."""
    return not cell or (_INTEGER.fullmatch(cell) is not None and -_INT64 <= int(cell) < _INT64)


def _float_ok(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _time_ok(value: object) -> bool:
    """Whether a time's value becomes a UTC timestamp: missing, or an ISO 8601 text."""
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    try:
        pd.to_datetime(value, utc=True, format="ISO8601")
    except (ValueError, OverflowError):
        return False
    return True


def _row_ok(row: Mapping[str, str]) -> bool:
    return all(_cell_ok(row.get(name)) for name in INTEGER_COLUMNS)


def _usage_ok(line: Mapping[str, Any]) -> bool:
    usage = line.get("usage")
    tokens = token_counts(usage) if isinstance(usage, dict) else ()
    return (
        all(_integer_ok(line.get(n)) for n, kind in USAGE_TYPES.items() if kind == "Int64")
        and all(_float_ok(line.get(n)) for n, kind in USAGE_TYPES.items() if kind == "float64")
        and all(_integer_ok(n) for n in tokens)
        and _time_ok(line.get("started_at"))
    )


def results_frame(rows: list[dict[str, str]]) -> pd.DataFrame:
    """results.csv's rows (as `OutputStore.read_results` reads them) as a DataFrame."""
    frame = pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(RESULT_COLUMNS))
    if VARIANT not in frame.columns:
        frame.insert(min(RESULT_COLUMNS.index(VARIANT), len(frame.columns)), VARIANT, "")
    frame[VARIANT] = frame[VARIANT].replace("", "1")
    for name in frame.columns:
        column = frame[name].replace("", None)
        if name in INTEGER_COLUMNS:
            frame[name] = pd.to_numeric(column).astype("Int64")
        else:
            frame[name] = column.astype("string")
    frame = frame.rename(columns={OUTCOME: OWN_OUTCOME})  # a manifest's column of that name: kept apart
    done = frame["status"].isin(DONE)
    outcome = frame["status"].where(~done, "succeeded").astype("string")
    frame.insert(frame.columns.get_loc("status") + 1, OUTCOME, outcome)
    return frame


def usage_frame(lines: list[dict[str, Any]]) -> pd.DataFrame:
    """Usage ledger lines as a DataFrame, with their token counts."""
    records = []
    for line in lines:
        usage = line.get("usage")
        inp, out, total = token_counts(usage) if isinstance(usage, dict) else (None, None, None)
        records.append({**line, "input_tokens": inp, "output_tokens": out, "total_tokens": total})
    extra = sorted({k for r in records for k in r} - set(USAGE_COLUMNS))
    frame = pd.DataFrame.from_records(records, columns=[*USAGE_COLUMNS, *extra])
    frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, format="ISO8601")
    for name, kind in USAGE_TYPES.items():
        frame[name] = frame[name].astype(kind)
    return frame


def decisions_frame(decisions: list[Decision]) -> pd.DataFrame:
    """The record's lines as a DataFrame: one row per image, its last decision and its last rating's
    stars (`work.decisions.RATED`)."""
    last = {d.key: asdict(d) for d in decisions if d.decision != RATED}
    for rating in decisions:
        if rating.decision == RATED:
            row = last.setdefault(rating.key, asdict(rating) | {"decision": None, "reviewer": None})
            row["stars"] = rating.stars
    rows = [row | {"stars": row["stars"] or None} for row in last.values()]
    frame = pd.DataFrame.from_records(rows, columns=list(DECISION_COLUMNS))
    frame["variant"] = frame["variant"].astype("Int64")
    frame["stars"] = frame["stars"].astype("Int64")
    frame["at"] = pd.to_datetime(frame["at"], utc=True, format="ISO8601")
    for name in ("key", "decision", "note", "reviewer"):
        frame[name] = frame[name].astype("string")
    return frame
