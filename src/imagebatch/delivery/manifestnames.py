"""`imagebatch validate MANIFEST --name TEMPLATE [--slug]`: export's naming rules applied to every row of
a manifest before anything is sent (and paid for), each problem naming the manifest's own row (the
spreadsheet's sheet and row for a workbook) rather than a results.csv row that does not exist yet.

The names are those a first export would make (variant 1 of each request, each of its images): the same
values (`exportplan.name_values`) through the same checks (`naming.name_for`, and `naming.clashes`' rule
found on disk by `nameclashes.NameClashes`, so that a manifest of any size is checked in bounded memory).
Two things a run alone knows are assumed: `{ext}` is `png` (the service's usual format; every name gets the
same one, so collisions are found all the same), and results.csv's columns that a run fills in
(`status`, `width`, ...) cannot be named.
"""

from __future__ import annotations

from imagebatch.delivery.exportplan import name_values
from imagebatch.delivery.nameclashes import NameClashes
from imagebatch.delivery.naming import NameTemplate, TemplateError, name_for
from imagebatch.manifest import Manifest, PlannedRequest, plan
from imagebatch.manifest.models import location_text
from imagebatch.work.store import RESULT_COLUMNS

ASSUMED_EXT = "png"
KNOWN_BEFORE_A_RUN = ("job_id", "request_index", "turn_index", "variant", "model", "route", "idempotency_key")
"""results.csv's columns a manifest's plan already knows."""


def _label(manifest: Manifest, req: PlannedRequest, n: int) -> str:
    """The manifest's row (a workbook's with its sheet, as its problems say it), and the request, turn
    and image when its job has several."""
    job = req.job
    row = job.location if manifest.sheet is None else location_text("row", job.line, manifest.sheet)
    where = f"{row} (id={job.id})"
    if job.count > 1:
        where += f" request {req.request_index}"
    if job.turns:
        where += f" turn {req.turn_index}"
    if job.images_per_request > 1:
        where += f" image {n}"
    return where


def name_problems(manifest: Manifest, text: str, *, slugged: bool = False) -> tuple[int, list[str]]:
    """How many names a first export of the manifest would make with the template `text`, and every
    problem with them, one line each naming the row. Raises TemplateError for a template that cannot
    be parsed."""
    template = NameTemplate.parse(text)
    columns = [*KNOWN_BEFORE_A_RUN, *manifest.metadata_columns]
    if unknown := template.unknown(columns):
        later = [f for f in unknown if f in RESULT_COLUMNS]
        why = "known only after a run" if later == unknown else "not a column of the manifest"
        shown = ", ".join(f"{{{f}}}" for f in unknown)
        return 0, [f"--name {text!r} names {shown}: {why} (it has {', '.join(columns)})"]
    problems = []
    checked = 0
    with NameClashes() as names:
        for req in plan(manifest):
            job = req.job
            row = {
                "job_id": req.job_id,
                "request_index": req.request_index,
                "turn_index": req.turn_index,
                "model": req.model,
                "route": req.route.value,
                "idempotency_key": req.idempotency_key,
                **job.metadata,
            }
            for n in range(1, job.images_per_request + 1):
                label = _label(manifest, req, n)
                checked += 1
                try:
                    names.add(label, name_for(template, name_values(row, 1, n, ASSUMED_EXT), slugged=slugged))
                except TemplateError as exc:
                    problems.append(f"{label}: {exc}")
        for first, second, name in names.found():
            problems.append(
                f"{first} and {second}: both would be named {name!r} (or one is a folder of the other)"
            )
    return checked, problems
