"""The run's plan: its units in order, with every variant of their requests, made again from the manifest's
jobs on each pass (`RunPlan`), so that no part of a run holds the whole plan: at about 1.3 KB a request,
a 500,000-request plan is most of a gigabyte.

A pass plans the jobs (`manifest.plan`), groups their requests into units as they come
(`work.context.group_units`), adds the variants the folder's state knows (`work.variants.Variants`) and,
for a shard, keeps its own units. Every pass yields the same units with the same indexes: the
dispatcher's pass sends them, the end's passes read their records back by index (`run.outputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from imagebatch.manifest import Job, plan
from imagebatch.work.context import Unit, group_units
from imagebatch.work.variants import Variants


class RunPlan:
    """The run's units, planned from `jobs` (iterated once per pass, never indexed) on each iteration.

    `count` makes the counting pass the run needs before it sends (run.json's `requests`, progress, the
    disk reserve, the budgets' shares, the size of the dispatcher's batches), with the variants from then
    on."""

    def __init__(self, jobs: Iterable[Job], keep: Callable[[Unit], bool] | None = None) -> None:
        self.jobs = jobs
        self.keep = keep
        """Which units are this run's (a shard's own), or None: every unit."""
        self.variants: Variants | None = None
        self.units = 0
        """The units of the last counting pass (`count`)."""
        self.requests = 0
        """Their requests, each turn counted."""
        self.to_send = 0
        """Of those units, the ones the run sends a request of (as `count`'s `sends` found them)."""

    def __iter__(self) -> Iterator[Unit]:
        units = group_units(plan(self.jobs))
        if self.variants is not None:
            units = self.variants.units(units)
        if self.keep is None:
            return units
        keep = self.keep
        return (unit for unit in units if keep(unit))

    def count(self, variants: Variants | None = None, sends: Callable[[Unit], bool] | None = None) -> None:
        """Plan once with `variants` (which leaves its `held` keys and redo summary) and count the units
        and requests, and with `sends` (whether the run sends a request of a unit) the units to send;
        every later pass yields those units."""
        self.variants = variants
        units = requests = to_send = 0
        for unit in self:
            units += 1
            requests += len(unit.requests)
            to_send += sends is not None and sends(unit)
        self.units, self.requests, self.to_send = units, requests, to_send
