"""`imagebatch.results(OUT)`: an output location's records as pandas DataFrames, for notebooks.

    import imagebatch

    r = imagebatch.results("out")  # or "s3://bucket/catalog"
    r.results[r.results.status == "succeeded"]
    r.usage.groupby("model")[["images", "total_tokens"]].sum()
    r.results.merge(r.decisions, left_on="idempotency_key", right_on="key", how="left")

- `results`: results.csv, one row per request (the last run's), its columns in order (`variant` added
  as 1, in its place, where a file written before variants has none; then the manifest's metadata
  columns); cells read back as written (`csvcells`); counts as nullable integers (`Int64`), everything
  else text, an empty cell missing (`<NA>`).
  A location whose run never ended has no results.csv: an empty table with results.csv's columns.
- `usage`: the usage ledger, one row per HTTP attempt of every run into the location (a folder's
  `usage.jsonl`; in an object store, the journal segments' usage lines), with the answer's token counts
  (`input_tokens`, `output_tokens`, `total_tokens`, by whichever names the route uses, as
  usage-summary.csv counts them), `started_at` as a UTC timestamp, and the raw `usage` object.
- `decisions`: the review decision in force for each image key (the last recorded, `cleared` included:
  reviewed, then undone), with `at` as a UTC timestamp.

pandas is imported here only, and this module only when `imagebatch.results` is first used: `import
imagebatch` and every command stay free of it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from imagebatch.extras import needs_extra
from imagebatch.storage import layout
from imagebatch.work.decisions import Decision, read_decisions
from imagebatch.work.store import RESULT_COLUMNS, OutputStore
from imagebatch.work.usage import token_counts

with needs_extra("notebook", "imagebatch.results()"):  # pandas is the notebook extra (pyproject.toml)
    import pandas as pd

INTEGER_COLUMNS = ("request_index", "turn_index", "images", "width", "height", "attempts", "variant")
"""results.csv's counts, as nullable integers."""
VARIANT = "variant"
"""results.csv's variant number of an image (issue 24): a missing column or cell is 1."""
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


@dataclass(frozen=True)
class Results:
    """An output location's records as DataFrames (see the module docstring)."""

    results: pd.DataFrame
    usage: pd.DataFrame
    decisions: pd.DataFrame


def results(out: str | os.PathLike[str]) -> Results:
    """The records of the output location `out` (a folder, or `s3://bucket/prefix` and the like) as
    DataFrames. FileNotFoundError when it holds no run of imagebatch (no results.csv, run.json, nor
    usage ledger)."""
    store = OutputStore(os.fspath(out))
    rows = store.read_results()
    usage = list(store.usage_lines())
    if rows is None and not usage and not store.location.exists(layout.RUN_JSON):
        raise FileNotFoundError(f"{store.where} holds no run of imagebatch (no {layout.RESULTS_CSV})")
    return Results(
        results=results_frame(rows or []),
        usage=usage_frame(usage),
        decisions=decisions_frame(list(read_decisions(store.location).values())),
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
    """Review decisions as a DataFrame."""
    frame = pd.DataFrame.from_records([asdict(d) for d in decisions], columns=list(DECISION_COLUMNS))
    frame["variant"] = frame["variant"].astype("Int64")
    frame["at"] = pd.to_datetime(frame["at"], utc=True, format="ISO8601")
    for name in ("key", "decision", "note", "reviewer"):
        frame[name] = frame[name].astype("string")
    return frame
