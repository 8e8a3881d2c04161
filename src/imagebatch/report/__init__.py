"""The report of an output location: its contact sheet (`report.html`), the review page a person approves
or rejects its images on, and what a set of runs amounts to.

The contact sheet of an output folder: `report.html` (and `report-2.html`, ... for large runs), one card
per request with its thumbnails, prompt, route, model, size, status and reason, built from the folder's
`results.csv` and `run.json` (and, for prompts and reference images, the manifest `run.json` names, when it
is unchanged). Self-contained: no network (a Content-Security-Policy forbids it), opens from the file
system. `imagebatch report OUT` rebuilds it; every run builds it at its end.
"""

from __future__ import annotations

from imagebatch.report.html import PAGE_SIZE, build_report

__all__ = ["PAGE_SIZE", "build_report"]
