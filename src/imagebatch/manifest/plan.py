"""Planning checked jobs into HTTP requests, each with its content-addressed idempotency key.

The key recipe is documented in the README ("Idempotency keys"); this module is its one implementation,
and `key_material` the one place its inputs are built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from imagebatch.gateway.constants import Route

from .fields import PARAMETER_DEFAULTS
from .models import FileRef, Job, Manifest

RECIPE_VERSION = "ib1"
"""Bump when the recipe changes: every key changes with it, so old output folders are not mistaken
for done work under a different recipe."""
KEY_PREFIX = f"{RECIPE_VERSION}-"
KEY_HEX_CHARS = 32
"""128 bits of the sha256: collisions are out of reach for any number of requests one user can send."""


def request_parameters(job: Job, route: Route | None = None) -> dict[str, Any]:
    """The job's request parameters for its wire route, with defaults filled in (as the key sees them)."""
    route = job.wire_route if route is None else route
    if route in (Route.NATIVE, Route.CHAT):
        return {"aspect_ratio": job.aspect_ratio, "image_size": job.image_size, "max_images": job.max_images}
    if route in (Route.IMAGES_GENERATIONS, Route.IMAGES_EDITS):
        return {"size": job.size}
    if route == Route.MESSAGES:
        return {"max_tokens": job.max_tokens}
    return {}


def key_material(job: Job, request_index: int, turn_index: int = 0, variant: int = 1) -> dict[str, Any]:
    """Everything the idempotency key of one request is a hash of (see the recipe). `variant` 1 (a
    request's first sample) adds nothing, so first samples keep the keys they had before variants
    existed; variant n >= 2 adds `"variant": n`."""
    if variant < 1:
        raise ValueError(f"variant {variant} out of range for job {job.id!r} (1 or more)")
    if not 0 <= request_index < job.count:
        raise ValueError(f"request_index {request_index} out of range for job {job.id!r} (count {job.count})")
    if not 0 <= turn_index <= len(job.turns):
        raise ValueError(f"turn_index {turn_index} out of range for job {job.id!r} ({len(job.turns)} turns)")
    route = job.wire_route
    material: dict[str, Any] = {
        "recipe": RECIPE_VERSION,
        "route": route.value,
        "model": job.model,
        "parameters": request_parameters(job, route),
        "prompt": job.prompt,
        "reference_sha256": list(job.reference_sha256),
        "mask_sha256": job.mask_sha256,
        "job_id": job.id,
    }
    _place(material, job, request_index, turn_index)
    if variant > 1:
        material["variant"] = variant
    return material


def _place(material: dict[str, Any], job: Job, request_index: int, turn_index: int) -> None:
    """Set the key's inputs that vary between one job's requests: its indices and the chain so far."""
    material["request_index"] = request_index
    material["turn_index"] = turn_index
    material["turns"] = [
        {"prompt": turn.prompt, "reference_sha256": list(turn.reference_sha256)}
        for turn in job.turns[:turn_index]
    ]


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only: one byte string per value on every machine."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def key_from_material(material: dict[str, Any]) -> str:
    return KEY_PREFIX + hashlib.sha256(canonical_json(material)).hexdigest()[:KEY_HEX_CHARS]


def key_digits(key: str) -> str:
    """The hex digits of an idempotency key, without its recipe prefix (file names, the shard split)."""
    return key.removeprefix(KEY_PREFIX)


def idempotency_key(job: Job, request_index: int = 0, turn_index: int = 0, variant: int = 1) -> str:
    """The idempotency key of request `request_index` (0..count-1), turn `turn_index` (0 = the prompt),
    sample `variant` (1 = the first)."""
    return key_from_material(key_material(job, request_index, turn_index, variant))


@dataclass(frozen=True, slots=True)
class EditOf:
    """How a variant is made when it is an edit: a follow-up turn on an earlier variant's answer (its
    whole conversation sent back, then `instruction`: the reviewer's note) instead of a new sample."""

    base: PlannedRequest
    """The variant whose answer is edited (the one the reviewer rejected)."""
    instruction: str


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One HTTP request to send: a copy (`request_index`) of a job, or one turn of a copy's edit chain."""

    job_id: str
    request_index: int
    """0..count-1."""
    turn_index: int
    """0 for the prompt; 1..T for the job's turns (each a separate, billed request)."""
    route: Route
    """The wire route: images jobs are `images_edits` with reference images, else `images_generations`."""
    model: str
    idempotency_key: str
    images_at_most: int
    """`max_images` on native and chat, 1 on the images routes, 0 on the text routes."""
    job: Job = field(repr=False, compare=False)
    variant: int = 1
    """1 for a request's first sample; 2, 3, ... for the samples `--redo rejected` adds (`variant_of`)."""
    edit_of: EditOf | None = field(default=None, repr=False, compare=False)
    """A variant made as an edit of an earlier variant's answer (`--redo rejected --edit`), else None."""

    @property
    def prompt(self) -> str:
        """What this request sends as its instruction: the prompt, the turn's prompt, or an edit's note."""
        if self.edit_of is not None:
            return self.edit_of.instruction
        return self.job.prompt if self.turn_index == 0 else self.job.turns[self.turn_index - 1].prompt

    @property
    def reference_images(self) -> list[FileRef]:
        """The images this request adds (a turn's own images for a turn; earlier ones are history; an
        edit adds none: the image it edits is in the history)."""
        if self.edit_of is not None:
            return []
        if self.turn_index == 0:
            return self.job.reference_images
        return self.job.turns[self.turn_index - 1].reference_images

    @property
    def reference_sha256(self) -> list[str]:
        if self.edit_of is not None:
            return []
        if self.turn_index == 0:
            return self.job.reference_sha256
        return self.job.turns[self.turn_index - 1].reference_sha256

    @property
    def mask(self) -> FileRef | None:
        return self.job.mask if self.turn_index == 0 and self.edit_of is None else None

    @property
    def mask_sha256(self) -> str | None:
        return self.job.mask_sha256 if self.turn_index == 0 and self.edit_of is None else None

    # Request parameters, as the job holds them (the checker filled in its route's defaults). A parameter
    # of another route is None in the job and reads here as the default it would have (a price lookup
    # asks any request its image size).
    @property
    def image_size(self) -> str:
        return self.job.image_size or PARAMETER_DEFAULTS["image_size"]

    @property
    def aspect_ratio(self) -> str:
        return self.job.aspect_ratio or PARAMETER_DEFAULTS["aspect_ratio"]

    @property
    def size(self) -> str:
        return self.job.size or PARAMETER_DEFAULTS["size"]

    @property
    def max_tokens(self) -> int:
        return self.job.max_tokens or PARAMETER_DEFAULTS["max_tokens"]

    @property
    def max_images(self) -> int | None:
        return self.job.max_images


def plan_job(job: Job) -> list[PlannedRequest]:
    """The requests of one job, in the order they must be sent (a chain's turns in order)."""
    route = job.wire_route
    images = job.images_per_request
    material = key_material(job, 0, 0)
    out: list[PlannedRequest] = []
    for request_index in range(job.count):
        for turn_index in range(len(job.turns) + 1):
            _place(material, job, request_index, turn_index)  # the rest of a job's key is the same
            key = key_from_material(material)
            out.append(PlannedRequest(job.id, request_index, turn_index, route, job.model, key, images, job))
    return out


def variant_of(req: PlannedRequest, variant: int, edit_of: EditOf | None = None) -> PlannedRequest:
    """Sample `variant` of the request `req` is a sample of (any variant of it): the same request, with a
    key of its own (`"variant": n` in its key material; variant 1 is the plan's own request)."""
    key = key_from_material(key_material(req.job, req.request_index, req.turn_index, variant))
    return PlannedRequest(
        req.job_id, req.request_index, req.turn_index, req.route, req.model, key, req.images_at_most,
        req.job, variant, edit_of,
    )  # fmt: skip


def plan(manifest: Manifest | Iterable[Job]) -> Iterator[PlannedRequest]:
    """Every request of the manifest, made as it is asked for (a job's requests consecutive): jobs in
    manifest order, then copies, then turns."""
    jobs = manifest.jobs if isinstance(manifest, Manifest) else manifest
    for job in jobs:
        yield from plan_job(job)


@dataclass(frozen=True, slots=True)
class PlanCounts:
    jobs: int = 0
    requests: int = 0
    """HTTP requests, each turn counted."""
    images_at_most: int = 0
    """The most images these requests can deliver (and be billed for)."""

    def __add__(self, other: PlanCounts) -> PlanCounts:
        return PlanCounts(
            self.jobs + other.jobs, self.requests + other.requests, self.images_at_most + other.images_at_most
        )


@dataclass(frozen=True)
class PlanSummary:
    """What a plan will send, in total and by (wire route, model)."""

    jobs: int
    requests: int
    images_at_most: int
    by_route_model: dict[tuple[Route, str], PlanCounts]

    @property
    def by_model(self) -> dict[str, PlanCounts]:
        out: dict[str, PlanCounts] = {}
        for (_, model), counts in self.by_route_model.items():
            out[model] = out.get(model, PlanCounts()) + counts
        return out

    def table(self) -> str:
        """A small fixed-width table: one row per route and model, then the total."""
        rows = [("route", "model", "jobs", "requests", "images at most")]
        for (route, model), c in self.by_route_model.items():
            rows.append((route.value, model, str(c.jobs), str(c.requests), str(c.images_at_most)))
        rows.append(("total", "", str(self.jobs), str(self.requests), str(self.images_at_most)))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = []
        for row in rows:
            left = [row[i].ljust(widths[i]) for i in range(2)]
            right = [row[i].rjust(widths[i]) for i in range(2, 5)]
            lines.append("  ".join(left + right).rstrip())
        return "\n".join(lines)


def summarise(requests: Iterable[PlannedRequest]) -> PlanSummary:
    """Count jobs, requests and images at most, in total and by wire route and model. `requests` come as
    `plan` makes them, a job's requests consecutive: a job is counted where its first request comes, and
    nothing is kept per job."""
    groups: dict[tuple[Route, str], list[int]] = {}
    jobs = 0
    last_job: str | None = None
    for request in requests:
        counts = groups.setdefault((request.route, request.model), [0, 0, 0])
        if request.job_id != last_job:
            last_job = request.job_id
            jobs += 1
            counts[0] += 1
        counts[1] += 1
        counts[2] += request.images_at_most
    return _summary(groups, jobs)


def summarise_jobs(jobs: Iterable[Job]) -> PlanSummary:
    """`summarise(plan(jobs))` counted from the jobs, without making their requests and keys: what
    `imagebatch validate` prints (a 100,000-job manifest's keys cost more than checking it)."""
    tally = JobTally()
    for job in jobs:
        tally.add(job)
    return tally.summary()


class JobTally:
    """`summarise_jobs` one job at a time, as the jobs are checked (`add`), so that a caller that only
    counts them (`load.summarise_manifest`) holds none; `summary` is what `summarise_jobs` returns."""

    def __init__(self) -> None:
        self._groups: dict[tuple[Route, str], list[int]] = {}
        # A catalog's jobs come in a few kinds (route, model, references or not, max_images): each kind's
        # wire route and images a request are worked out once.
        self._kinds: dict[tuple[str, str, bool, int | None], tuple[list[int], int]] = {}
        self.jobs = 0
        """The jobs counted so far."""

    def add(self, job: Job) -> None:
        """Count `job`: one job of its wire route and model, its requests and the most images they bring."""
        kind = (job.route, job.model, bool(job.reference_images), job.max_images)
        if (known := self._kinds.get(kind)) is None:
            counts = self._groups.setdefault((job.wire_route, job.model), [0, 0, 0])
            known = self._kinds[kind] = (counts, job.images_per_request)
        counts, images = known
        requests = job.count * (len(job.turns) + 1)
        counts[0] += 1
        counts[1] += requests
        counts[2] += requests * images
        self.jobs += 1

    def summary(self) -> PlanSummary:
        """The counts so far, in total and by wire route and model."""
        return _summary(self._groups, self.jobs)


def _summary(groups: dict[tuple[Route, str], list[int]], jobs: int) -> PlanSummary:
    order = list(Route)
    by = {
        group: PlanCounts(*groups[group]) for group in sorted(groups, key=lambda g: (order.index(g[0]), g[1]))
    }
    return PlanSummary(
        jobs=jobs,
        requests=sum(c.requests for c in by.values()),
        images_at_most=sum(c.images_at_most for c in by.values()),
        by_route_model=by,
    )
