"""A changed row's history on the review page: the image approved for a row before its prompt changed.

A row's request is its job id, request index and turn (`setstate.request_of`); its idempotency key is
made from its prompt too, so a row whose prompt changed is planned as a new request with a new key, and
results.csv then names only the new one. The image approved for the old key is still in OUT
(`images/<job>/<request>-<old key>.<ext>`: imagebatch never deletes an image it wrote), and the journal
names the old key's request and files (its `outcome` line). The page shows that image beside the new
request's cards, "approved before, for the earlier prompt", so that a reviewer judges the new image
against what was accepted.

The journal is read only when an approved key is not one of results.csv's (as `export --approved-only`
reads it to find a changed row: `delivery.exportplan.changed_since_approval`).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from imagebatch.storage.location import Location
from imagebatch.work.decisions import Decision
from imagebatch.work.store import OutputStore

Request = tuple[str, str, str]
"""(job id, request index, turn index), as results.csv's cells spell them (`setstate.request_of`)."""


@dataclass(frozen=True, slots=True)
class Earlier:
    """The image approved for a request before its prompt changed."""

    key: str
    """The earlier request's idempotency key (the one its decision names)."""
    images: tuple[str, ...]
    """Its images' names in OUT (`images/<job>/<file>`), each one the review may serve."""
    decision: Decision
    """The approval in force on it."""

    def shown(self) -> list[object]:
        """As a card's data holds it (`h`): the key, how many images, who approved it."""
        return [self.key, len(self.images), self.decision.reviewer]


def earlier_approved(
    location: Location,
    current: Container[str],
    approved: Mapping[str, Decision],
    servable: Callable[[str], bool],
) -> dict[Request, Earlier]:
    """For each request whose earlier key (one results.csv no longer names: not in `current`) is
    approved, that approved image; the latest approval where several earlier keys were. `servable`
    says which image names may be served (`review_data.safe_name`); a key with none is left out."""
    gone = {key: d for key, d in approved.items() if d.decision == "approved" and key not in current}
    if not gone:
        return {}
    states = OutputStore(location.url).load_state()
    found: dict[Request, Earlier] = {}
    for key, decision in gone.items():
        state = states.get(key)
        outcome = state.outcome if state is not None else None
        if outcome is None or outcome.status not in ("succeeded", "skipped"):
            continue
        images = tuple(rel for rel in outcome.paths if servable(rel))
        if not images:
            continue
        request = (outcome.job_id, str(outcome.request_index), str(outcome.turn_index))
        if request not in found or found[request].decision.at < decision.at:
            found[request] = Earlier(key, images, decision)
    return found
