"""Manifests: read a batch description (CSV, JSON, JSON Lines, XLSX or Parquet), check every row against the
spec and the files it names before anything is sent, and plan it into requests with stable idempotency keys.

The user's manual is docs/manifests.md; each field's type, default and rules are written once, in
`reference.FIELDS` (rendered into docs/reference/manifest-fields.md). `load_manifest` checks everything
and raises `ManifestError` listing every problem (`summarise_manifest` checks it the same way and only
counts its plan, keeping no job); `plan` expands a manifest into `PlannedRequest`s (their
key recipe: docs/manifests.md, "Idempotency keys"); `validate` writes what `imagebatch validate` prints.
The work is done in `formats` (the table of formats: suffixes, readers, extras), `read` and `tables`
(formats to raw rows), `check` with `fields` and `inputs` (the checker), `template`, `files`, `models`,
`load`, `plan` and `validate`.

One CSV reader, the csv module, which also finds each record's physical line (pandas cannot report it and
costs 60 MB to import); openpyxl and pyarrow are imported only for an XLSX or Parquet file.
"""

from __future__ import annotations

from .fields import KNOWN_FIELDS
from .formats import FORMAT_NAMES, FORMATS, detect_format
from .load import ManifestSummary, load_manifest, summarise_manifest
from .models import (
    ID_PATTERN,
    MANIFEST_ROUTES,
    MAX_COUNT,
    MAX_NATIVE_IMAGE_BYTES,
    WINDOWS_RESERVED_NAMES,
    Job,
    Manifest,
    ManifestError,
    ManifestFormat,
    Problem,
    Turn,
    id_fault,
    is_safe_id,
)
from .plan import (
    RECIPE_VERSION,
    EditOf,
    PlanCounts,
    PlannedRequest,
    PlanSummary,
    canonical_json,
    idempotency_key,
    key_material,
    plan,
    plan_job,
    request_parameters,
    summarise,
    summarise_jobs,
    variant_of,
)
from .template import TemplateError, render_prompt

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "ID_PATTERN",
    "KNOWN_FIELDS",
    "MANIFEST_ROUTES",
    "MAX_COUNT",
    "MAX_NATIVE_IMAGE_BYTES",
    "RECIPE_VERSION",
    "WINDOWS_RESERVED_NAMES",
    "EditOf",
    "Job",
    "Manifest",
    "ManifestError",
    "ManifestFormat",
    "ManifestSummary",
    "PlanCounts",
    "PlanSummary",
    "PlannedRequest",
    "Problem",
    "TemplateError",
    "Turn",
    "canonical_json",
    "detect_format",
    "id_fault",
    "idempotency_key",
    "is_safe_id",
    "key_material",
    "load_manifest",
    "plan",
    "plan_job",
    "render_prompt",
    "request_parameters",
    "summarise",
    "summarise_jobs",
    "summarise_manifest",
    "variant_of",
]
