"""Manifests: read a batch description (CSV, JSON, JSON Lines, XLSX or Parquet), check it against the
spec and the files on disk before anything is sent, and plan it into requests with stable idempotency keys.

Formats
    CSV (UTF-8, a byte-order mark is fine; header row; every cell read as text, an empty cell is absent),
    JSON (a list of jobs, or ``{"defaults": {...}, "jobs": [...]}``) and JSON Lines (one job per line).
    CSV headers and JSON keys are the same field names. Problems name CSV rows by their physical line (the
    header is line 1), JSON Lines rows by line, and JSON jobs by their index in ``jobs`` (``job #0``).
    An XLSX sheet (``file.xlsx#Sheet``, else the first visible one) or a Parquet file is a table read as a
    CSV is (every cell as the text a person sees: `tables`); its rows are named ``sheet 'S' row 7`` (the
    spreadsheet's numbering) or ``row 7`` (a Parquet record, from 1).

Fields
    ``id`` (required, unique, ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``; ids equal but for case are refused,
    as their files would collide on case-insensitive file systems; outputs go to ``images/<id>/``, so ids
    Windows cannot use as a file or folder name are refused too: the device names ``CON``, ``PRN``,
    ``AUX``, ``NUL``, ``COM1``-``COM9`` and ``LPT1``-``LPT9`` in any case and with or without an extension
    (``nul.txt``), and ids ending in ``.``, which Windows drops, so ``abc.`` would share ``abc``'s
    folder), ``prompt`` (required; may hold
    ``{column}`` placeholders naming other columns of its row, ``{{``/``}}`` for literal braces),
    ``model``, ``route`` (``native``, ``chat``, ``images``, ``messages``, ``responses``), ``aspect_ratio``,
    ``image_size`` (native, chat), ``size`` (images), ``reference_images`` (native, images; paths relative
    to the manifest's folder, ``;``-separated in CSV, a list in JSON), ``mask`` (images), ``count``
    (separate requests wanted, 1 to 100: `MAX_COUNT`, a guard against typos, not a service rule),
    ``max_images`` (native, chat; 1 to 4), ``max_tokens`` (messages), ``turns`` (JSON only, native only:
    follow-up edit instructions, each a string or ``{"prompt": ..., "reference_images": [...]}``; each
    turn is checked on its own, so one malformed turn does not hide the problems of the others, which
    are named ``turns[2]``, ``turns[0].reference_images`` and so on). Every
    other column is metadata: kept as text and carried into the results. A column that is a near miss of
    a field name (``Aspect Ratio``, ``imageSize``) is reported rather than silently kept as metadata, and
    one named like a column results.csv has of its own (``status``, ``paths``, ``error``: the list is
    `fields.RESULTS_ONLY_COLUMNS`) is refused, as its values would be lost there. No field, value or name
    may hold a NUL character. JSON nests at most `read.MAX_DEPTH` (32) levels, counted over the whole
    document (a JSON Lines line on its own).

    Files root: every reference image and mask must resolve (after ``~``, ``..`` and symlinks) inside the
    manifest's folder or a folder the operator allows (``--files-root``, `load_manifest`'s `files_root`);
    a JSON manifest's ``defaults.files_root`` can only narrow that, never widen it, so a manifest written
    by someone else cannot pull in files from elsewhere (`files.declared_roots`).

    Reference images and masks must be regular files (never a FIFO or a device: `files.read_regular`),
    PNG or JPEG by their bytes and under 50,000,000 bytes, by the bytes actually read. On the
    images route that is the service's limit (the spec's "each under 50 MB", stated for the edits route).
    The spec shows no maximum for inline images on the native route: there the same figure is
    imagebatch's own guard (`MAX_NATIVE_IMAGE_BYTES`), since such a file would travel base64-encoded in
    the request body, and the problem message says which of the two refused the file.

    Without a route, a native model means ``native`` and ``compat-image-2`` means ``images``; any other
    model needs a route. Without a model, ``images`` means ``compat-image-2``, ``native``/``chat`` (or no
    route) mean ``native-image-2.1``, and the text routes require one. JSON ``defaults`` fill in what a
    job leaves out, but a route-specific default (say ``image_size``) only reaches jobs whose route takes
    it, so one defaults object can serve a mixed manifest.

Idempotency keys (recipe ``ib1``)
    The key of one request is ``ib1-`` followed by the first 32 hex digits of the sha256 of the canonical
    JSON (keys sorted, no whitespace, ASCII with ``\\u`` escapes) of::

        {"recipe": "ib1",
         "route": wire route: native | chat | images_generations | images_edits | messages | responses,
         "model": model id,
         "parameters": the route's parameters, defaults filled in:
             native, chat: {"aspect_ratio", "image_size", "max_images"}; images: {"size"};
             messages: {"max_tokens"}; responses: {},
         "prompt": the rendered prompt (placeholders filled, line endings "\\n", outer whitespace stripped),
         "reference_sha256": [sha256 of each reference image's bytes, in order],
         "mask_sha256": sha256 of the mask's bytes, or null,
         "job_id": id, "request_index": 0..count-1, "turn_index": 0 (the prompt) or 1..T (a turn),
         "turns": [{"prompt", "reference_sha256"} of turns 1..turn_index],
         "variant": n, only for variant n >= 2 (absent for a request's first sample)}

    So the key depends on what is sent, never on where: file paths, the manifest's folder, row order,
    line numbers, file times and metadata columns do not enter it (metadata reaches a key only through a
    prompt placeholder, i.e. through the prompt). An empty ``aspect_ratio`` and an explicit ``1:1`` give
    the same key. Changing a row changes only that row's keys; changing an image's bytes changes the keys
    of the jobs using it; raising ``count`` adds keys without changing the existing ones; appending a turn
    to a chain adds a key without changing the keys of the earlier turns (a chain's turn 0 has the key
    the same job would have without turns). A turn's key covers what the manifest asks for, not the
    service's earlier replies: those are history that a run keeps in its output folder.

    Variants: ``imagebatch run --redo rejected`` makes a new sample (variant 2, 3, ...) of a request
    whose newest image a reviewer rejected. Variant 1 is the request itself, its key unchanged (output
    folders made before variants existed keep theirs); variant n >= 2 adds ``"variant": n`` to the
    material, so it is a request of its own, never confused with the one it redoes, and a rerun does not
    send it again. How a variant is made (a new sample, or an edit turn with the reviewer's note under
    ``--edit``) is not in its key: variant n of a request is made once, whichever way the run that
    sends it chose.

`load_manifest` checks everything and raises `ManifestError` listing every problem; `plan` expands a
manifest into `PlannedRequest` objects; `summarise` counts them; `validate_main` is the `imagebatch
validate` command (its options are in `imagebatch.cli.main`). This module is the public face; the work
is done in `read` (CSV, JSON, JSON Lines to raw rows), `tables` (XLSX, Parquet), `check` (the checker, in
steps) with `fields` (the field table), `template` (prompts), `inputs` (the row model and its errors) and
`files` (reference images and masks), `models` (Job, Manifest, Problem), `load`, `plan` (requests and
keys), `validate`.

One CSV reader: the csv module, which also finds each record's physical line (pandas cannot report it).
A second parser would earn nothing; pandas' import alone costs start-up time and 60 MB. XLSX and Parquet
go through openpyxl and pyarrow (pandas' own engines), imported only for such a file.
"""

from __future__ import annotations

from .fields import KNOWN_FIELDS
from .load import load_manifest
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
    variant_of,
)
from .read import detect_format
from .template import TemplateError, render_prompt
from .validate import validate_main

__all__ = [
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
    "validate_main",
    "variant_of",
]
