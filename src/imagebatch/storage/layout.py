"""The names of what a run, a review and an export write (files, folders, objects, locks), in one place
for their writers (`work.store`, `work.decisions`, `delivery`), their readers (`report`, reruns) and the
messages that name them; and the advice about an `unknown` request, which a record's error, the report
and the end of a run give in the same words. Imports nothing of ours: every room may read it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

IMAGES_DIR = "images"
"""Every image and text output, under `<job>/`."""
CHAINS_DIR = "chains"
"""The edit history of each chain, after each turn (`<job>/<request>.json`); in an object store, also the
conversation behind each native answer (`conversation`)."""
THUMBS_DIR = "thumbs"
"""The report's thumbnails, one JPEG per image."""
JOURNAL = "journal"
"""The write-ahead journal, `journal.jsonl` (a shard's own: `journal.shard-I-of-N.jsonl`)."""
JOURNAL_SEGMENTS = f"{JOURNAL}/"
"""An object store's journal: the prefix of its segments (`storage.segments`)."""
CONVERSATIONS = "conversations"
"""A folder's conversations behind its native answers, one line each, `conversations.jsonl` (a shard's
own: `conversations.shard-I-of-N.jsonl`); an object store keeps one object each (`conversation`)."""
USAGE_LEDGER = "usage"
"""One line per HTTP attempt, `usage.jsonl` (a shard's own: `usage.shard-I-of-N.jsonl`)."""
RESULTS_CSV = "results.csv"
EXPORT_CSV = "export.csv"
"""What `imagebatch export` delivered (and what it could not), at the top of DEST."""
RESULTS_READ_COLUMNS = (
    "job_id",
    "request_index",
    "turn_index",
    "status",
    "route",
    "model",
    "idempotency_key",
)
"""The columns of results.csv the report and the review read by name (`store.RESULT_COLUMNS` holds every
one): present, empty if need be, in every row `csvcells.read_csv` gives them, whatever tool wrote the file."""
RUN_JSON = "run.json"
USAGE_SUMMARY_CSV = "usage-summary.csv"
REPORT_HTML = "report.html"
"""The report's first page; the others are `report-2.html`, ... (`report_page`)."""
REPORT_PAGES = "report-*.html"
"""The report's further pages, as a glob (a rebuild removes the ones it no longer makes)."""
REVIEW_FILE = "review.jsonl"
"""A local folder's review decisions, one line each (`work.decisions`)."""
REVIEW_PREFIX = "review/"
"""An object store's review decisions, one object each."""
LOCK = ".imagebatch.lock"
SETTLED = ".imagebatch-settled.json"
"""What a rerun that sent nothing settled on, for the next such rerun to trust while none of it changed
(`run.settled`)."""
STAMPED = (RESULTS_CSV, USAGE_SUMMARY_CSV)
"""The records besides the journal and the usage ledger a location's `records_stamp` covers: what a
rerun that sends nothing writes and, while they are unchanged, need not write again."""
"""The folder's lock: held alone by a run, shared by the shards of a sharded run."""
LEASE = ".imagebatch.lease"
"""An object store's lock, as a lease object (`storage.lease`): held by a run, or a sharded run's parent."""

UNKNOWN_HINT = (
    "check the service's usage history for this key, then rerun with --retry-unknown if it was not made"
)
"""What to do about a request whose outcome is `unknown` (sent, no usable answer: it may be billed)."""


def jsonl(kind: str, shard: str | None = None) -> str:
    """The file of `JOURNAL` or `USAGE_LEDGER`: the folder's own, or shard `I-of-N`'s."""
    return f"{kind}.shard-{shard}.jsonl" if shard else f"{kind}.jsonl"


def shard_jsonl(kind: str) -> str:
    """Every shard's file of `kind`, as a glob."""
    return jsonl(kind, "*")


def shard_lock(shard: str) -> str:
    """The lock a shard's process holds alone while it sends."""
    return f".imagebatch.shard-{shard}.lock"


def shard_lease(shard: str) -> str:
    """The lease shard `I-of-N` of a sharded run holds alone in an object store (the folder's shard lock)."""
    return f".imagebatch.shard-{shard}.lease"


def conversation(stem: str) -> str:
    """An object store's conversation kept for the answer whose files are `images/<stem>...`:
    `chains/<stem>.json`."""
    return f"{CHAINS_DIR}/{stem}.json"


def report_page(number: int) -> str:
    """The file of the report's page `number` (from 1)."""
    return REPORT_HTML if number == 1 else f"report-{number}.html"


def report_pages(names: Iterable[str]) -> list[str]:
    """The report's pages among `names` (a listing): `report.html`, `report-2.html`, ..."""
    return [n for n in names if n == REPORT_HTML or fnmatch.fnmatchcase(n, REPORT_PAGES)]
