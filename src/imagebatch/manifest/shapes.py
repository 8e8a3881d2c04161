"""A table's rows checked by their shape: the fields that repeat across a catalog's rows checked once.

A table's rows (CSV, XLSX, Parquet) differ mostly in their id, prompt values and metadata; their route,
model, parameters and files come in a handful of combinations (a row's *shape*). `ShapeChecker` checks
the first clean row of each shape by `JobChecker` in full and keeps what its Job took from the shape; a
later row of that shape is then checked only for what is its own (the id: safe and unique; the prompt:
filled in and not empty) and gets the same route, model, parameters and files. A row with anything
wrong, or whose shape has not yet given a clean row, is checked in full by `JobChecker`, so every
problem and its message are the ones a full check gives, and a clean row's Job is equal to the one a
full check makes (a test compares them on every row of mixed manifests).

A caller that only counts what the rows ask for (`load.summarise_manifest`: route, model, count, files,
parameters, all the shape's) checks them `counted`: a later row of a known shape is checked just as much,
but gives its shape's Job, the one made for the shape's first clean row, rather than a Job of its own made
only to be counted.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from .check import JobChecker
from .fields import KNOWN_FIELDS
from .models import SAFE_ID, Job, checked_job, location_text
from .read import RawManifest, RawRow
from .template import TemplateError, render_prompt


class ShapeChecker:
    """Checks a table's rows through `checker`, each shape's fields once (see the module's docstring)."""

    def __init__(self, checker: JobChecker, raw: RawManifest, *, counted: bool = False) -> None:
        self.checker = checker
        self._counted = counted
        columns = raw.columns or []
        shape = [c for c in columns if c in KNOWN_FIELDS and c not in ("id", "prompt", "turns")]
        self._shape_of: Callable[[dict[str, Any]], Any] = (
            operator.itemgetter(*shape) if shape else (lambda values: ())
        )
        metadata = set(checker.metadata_columns)
        self._metadata = [c for c in columns if c in metadata]
        self._shapes: dict[Any, Job] = {}
        """Each shape's first clean row's Job: the fields its later rows share."""
        self.rows = 0
        """The rows checked so far."""
        # Only a table with both columns, no defaults and no NUL byte in it takes the short path: anything
        # else is rare enough to be checked in full. (A NUL byte may be found as the file is read.)
        self._raw = raw
        self._fast = checker.tabular and "id" in columns and "prompt" in columns

    def check(self, row: RawRow) -> Job | None:
        """The row's Job when it is clean, else None with its problems added to the checker's."""
        self.rows += 1
        if not self._fast or self._raw.may_hold_nul:
            return self.checker.check(row)
        shape = self._shape_of(row.values)
        known = self._shapes.get(shape)
        if known is not None and (job := self._own(row, known)) is not None:
            return job
        job = self.checker.check(row)
        if job is not None and known is None:
            self._shapes[shape] = job
        return job

    def _own(self, row: RawRow, known: Job) -> Job | None:
        """The row's Job from its shape's fields and its own (or, `counted`, the shape's Job), or None when
        its own need a full check."""
        values = row.values
        job_id = values["id"].strip()
        if SAFE_ID.fullmatch(job_id) is None:  # nor a "\r": one the full check normalises, or reports
            return None
        template = values["prompt"]
        if "\r" in template:
            return None
        try:
            prompt = render_prompt(template.strip(), values)
        except TemplateError:
            return None
        if "\r" in prompt:
            return None
        prompt = prompt.strip()
        if not prompt or not self.checker.claim_id(job_id, row.line):
            return None
        if self._counted:
            return known
        fields = known.__dict__.copy()  # in Job's order of fields, which the replaced ones keep
        fields["id"] = job_id
        fields["line"] = row.line
        fields["location"] = location_text(row.unit, row.line)
        fields["prompt"] = prompt
        fields["metadata"] = {c: values[c] for c in self._metadata}
        return checked_job(fields)
