"""The report in Prefect's UI: each run's own copy of the contact sheet, and a markdown artifact about it.

The UI cannot open a `file://` link (its browser is not on the machine that ran the flow), so for an
output folder the artifact (`imagebatch-report`) is markdown that the UI shows as it is: the run's counts,
its state, the first requests that fell short and why, and where the report is (host and absolute path).
Each run keeps its report as `report.<stamp>.html` (its further pages `report.<stamp>-2.html`, ...),
`<stamp>` being the UTC start time and the flow run's short id, so a run's artifact keeps naming that
run's report; `report.html` stays the newest run's. Not `report-<stamp>.html`: `report-N.html` are the
pages of `report.html`, which `build_report` replaces and prunes. The newest `KEEP` runs' copies are kept
(a nightly deployment would otherwise add one a night for ever).

A run into a bucket (`--out s3://...`): the artifact names the bucket's `report.html` by its URL (the
newest run's: no per-run copy is kept there, since `imagebatch report URL --to DIR` copies the newest
report with what its links name), gives that command to open it, and links the object in the cloud's
console where that is derivable (`console_url`: S3 on AWS and GCS; not a custom endpoint nor Azure, whose
portal URL needs the subscription and resource group).

The artifact also says how many of the run's images are unreviewed, approved and rejected (the decisions
in the output location, `work.decisions`). Reviewing is a person's step, in a browser: it is the
command `imagebatch review OUT`, not a flow; the artifact says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from imagebatch.gateway.constants import AWS_ENDPOINT_URL, AWS_REGIONS
from imagebatch.storage import layout
from imagebatch.storage.location import confined, write_atomic
from imagebatch.work.outcome import DONE, tally
from imagebatch.work.store import STATUSES, RequestRecord

KEEP = 30
"""How many runs' own reports an output folder keeps."""
SHOWN = 10
"""How many requests that fell short the artifact names."""


def run_stamp(info: dict[str, Any]) -> str:
    """`20250102T020000Z-1a2b3c4d`: sortable by time, unique per flow run."""
    started = datetime.fromisoformat(info.get("started_at") or datetime.now(UTC).isoformat())
    run_id = str((info.get("prefect") or {}).get("flow_run_id") or "local")
    return f"{started.astimezone(UTC):%Y%m%dT%H%M%SZ}-{run_id[:8]}"


def keep_run_report(first: Path, stamp: str, keep: int = KEEP) -> Path:
    """Copy `report.html` and its pages to this run's names (links between them rewritten); prune the
    copies of all but the newest `keep` runs. Returns the copy of the first page."""
    out = first.parent
    pages = [first, *sorted(out.glob(layout.REPORT_PAGES), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))]
    names = {p.name: f"report.{stamp}-{p.stem.removeprefix('report-')}.html" for p in pages[1:]}
    names[first.name] = f"report.{stamp}.html"
    for page in pages:
        text = page.read_text()
        for old, new in names.items():
            text = text.replace(f'href="{old}"', f'href="{new}"')
        write_atomic(confined(out, names[page.name]), text.encode())  # a full disk cut it mid-tag
    copy = re.compile(r"report\.(\d{8}T\d{6}Z-[^.-]+)(?:-\d+)?\.html$")
    stamps = sorted({m.group(1) for p in out.glob("report.*.html") if (m := copy.match(p.name))})
    for old in stamps[:-keep] if keep else []:
        for path in out.glob(f"report.{old}*.html"):
            path.unlink(missing_ok=True)
    return out / names[first.name]


def console_url(url: str) -> str | None:
    """The cloud console's page of the object `url` (`s3://bucket/key`, `gs://...`), or None where it
    cannot be derived: an S3-compatible endpoint (`AWS_ENDPOINT_URL`: MinIO, R2, a local server), Azure."""
    from urllib.parse import quote

    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme == "s3" and not os.environ.get(AWS_ENDPOINT_URL):
        region = next(filter(None, map(os.environ.get, AWS_REGIONS)), None)
        query = f"region={quote(region)}&" if region else ""
        return f"https://s3.console.aws.amazon.com/s3/object/{quote(bucket)}?{query}prefix={quote(key)}"
    if scheme == "gs":
        return f"https://console.cloud.google.com/storage/browser/_details/{quote(bucket)}/{quote(key)}"
    return None


def bucket_lines(report: str) -> list[str]:
    """Where a bucket's report is, and the one command that opens it."""
    prefix = report.rsplit("/", 1)[0]
    lines = [
        f"The contact sheet: `{report}` (the newest run's). To open it, copy it with its thumbnails and",
        f"images: `imagebatch report {prefix} --to DIR`, then open the page it prints.",
    ]
    if (console := console_url(report)) is not None:
        lines.append(f"In the console: {console}")
    return lines


def review_line(out: str, records: Iterable[RequestRecord]) -> str:
    """`**Review:** 12 open (10 unreviewed, 2 rejected) · 40 approved · 3 redone`: the decisions in force
    in the output location `out` on the images of `records`, by the report's rule (`report.setstate`: a
    rejected image a newer variant replaced is redone, no longer open)."""
    from imagebatch.report.setstate import review_line as states_line
    from imagebatch.report.setstate import review_states
    from imagebatch.storage.kinds import open_location
    from imagebatch.work.decisions import decided

    states = review_states(_ReviewableRows(records), decided(open_location(out)))
    return f"**Review:** {states_line(states)} (`imagebatch review {out}` opens them in a browser)."


class _ReviewableRows:
    """The rows of `records` with an image to judge, made anew on each walk (the records read back from
    the run's spool each time, never all held)."""

    def __init__(self, records: Iterable[RequestRecord]) -> None:
        self.records = records

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from imagebatch.report.html import reviewable

        return (row for row in (record.to_row() for record in self.records) if reviewable(row))


def report_markdown(
    info: dict[str, Any],
    where: str | None,
    short: list[RequestRecord],
    review: str | None = None,
    link: str | None = None,
) -> str:
    """The artifact: counts, stop reason, the review's counts, the first requests not done, and where
    the report is: `link`, where a person elsewhere opens it (`Backend.link`), else `where` on this
    machine."""
    counts = info["counts"]
    lines = [f"# imagebatch report: {Path(info['out']).name}", "", tally(counts), ""]
    if review:
        lines += [review, ""]
    if info.get("stopped"):
        lines += [f"**Stopped early:** {info['stopped']}", ""]
    lines += ["| status | requests |", "|-|-|"] + [f"| {s} | {counts.get(s, 0)} |" for s in STATUSES]
    if short:
        lines += ["", f"## Not done (the first {len(short)})", "", "| request | status | why |", "|-|-|-|"]
        lines += [f"| {r.job_id}#{r.request_index} | {r.status} | {_cell(r.error or '')} |" for r in short]
    lines += [""]
    if link:
        lines += bucket_lines(link)
    elif where:
        lines += [
            f"The contact sheet: `{where}` on `{socket.gethostname()}` (this run's; `report.html` beside",
            "it is the newest run's). Open it from that machine, or copy the output folder.",
        ]
    else:
        lines += ["No report.html was written (--no-report, or it failed): `imagebatch report OUT` makes it."]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:200]


def publish_report(
    info: dict[str, Any],
    records: Iterable[RequestRecord],
    call: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
) -> None:
    """Keep this run's report under its own name (`info["run_report"]`) and create the `imagebatch-report`
    markdown artifact through `call` (the run's `prefect_guard`: bounded, skipped once Prefect's server is
    lost). Never fails the run: the records are written already."""
    from prefect.artifacts import create_markdown_artifact

    from imagebatch.storage.kinds import open_location

    where = link = None
    if info.get("report"):
        # Where a person elsewhere opens it names the newest report; a folder keeps this run's own copy.
        link = open_location(str(info["out"])).link(layout.REPORT_HTML)
        with contextlib.suppress(OSError):
            info["run_report"] = link or str(keep_run_report(Path(info["report"]).resolve(), run_stamp(info)))
        where = info.get("run_report") or str(Path(info["report"]).resolve())
    short = []
    for record in records:
        if record.status not in DONE:
            short.append(record)
            if len(short) >= SHOWN:
                break
    review = None
    with contextlib.suppress(Exception):  # an unreadable review record costs the artifact its line only
        review = review_line(str(info["out"]), records)
    markdown = report_markdown(info, where, short, review, link)
    with contextlib.suppress(Exception):
        call(lambda: create_markdown_artifact(
            key="imagebatch-report", markdown=markdown,
            description="the run's contact sheet: where it is, and what it says",
        ))  # fmt: skip


__all__ = ["keep_run_report", "publish_report", "report_markdown", "review_line"]
