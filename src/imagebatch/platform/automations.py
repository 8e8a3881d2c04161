"""The automations `imagebatch deploy` keeps on the Prefect server: dead runs marked Crashed (a run whose
heartbeat stopped, a run claimed but never started), and a deployment's failure notifications.

Each is created once and updated only when what is wanted differs from what the server holds (`ensure`):
updating an automation restarts its proactive trigger's window, so a deploy that rewrote it unchanged would
leave a run killed less than a window before it Running for ever (with its deployment's only slot held),
and a team that deploys every few minutes would never have a dead run crashed.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from imagebatch.errors import UsageError
from imagebatch.gateway.constants import ENV_HEARTBEAT_WINDOW as ENV_WINDOW
from imagebatch.run.constants import FINAL_STATE_NAMES, NEVER_STARTED

TAG = "imagebatch"
"""Every deployment's tag, which its runs carry: the dead-run automations watch the runs with it."""
HEARTBEAT_SECONDS = 30
"""How often a deployment's run tells the server it is alive (Prefect's `PREFECT_FLOWS_HEARTBEAT_FREQUENCY`,
30 s at least; Prefect's own default is 180 s)."""
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS)}
WINDOW_SECONDS = 90.0
"""A run with no heartbeat for this long is marked Crashed (three heartbeats missed; Prefect's guide's)."""
AUTOMATION_NAME = "imagebatch: crash runs whose heartbeat stopped"
PENDING_NAME = "imagebatch: crash runs claimed but never started"
"""A run a worker (or a sharded run's parent) claimed sends no heartbeat until it starts: one whose
claimer died stays Pending, which no heartbeat watch sees (such as a dead parent's claimed shard)."""


def heartbeat_window() -> float:
    """The automation's window: `IMAGEBATCH_HEARTBEAT_WINDOW` seconds, else 90; more than a heartbeat's
    period plus its way to the server (a shorter one would crash live runs)."""
    raw = os.environ.get(ENV_WINDOW)
    try:
        window = float(raw) if raw else WINDOW_SECONDS
    except ValueError:
        raise UsageError(f"{ENV_WINDOW}={raw!r} is not a number of seconds") from None
    if window < HEARTBEAT_SECONDS + 10:
        raise UsageError(f"{ENV_WINDOW} must be at least {HEARTBEAT_SECONDS + 10} s, not {window:g}")
    return window


def _crash_when_silent(name: str, after: str, expect: set[str], window: float, why: str) -> Any:
    """An automation on the runs tagged `TAG`: after the event `after` of a run, expect one of `expect`
    (or a final state) within `window` seconds, else mark that run Crashed with `why`.

    Scoped by tag so that other flows on the server, with Prefect's default 180 s heartbeat, are left
    alone. Crashed releases the deployment's concurrency slot, so the next scheduled run runs."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    trigger = EventTrigger(
        match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        match_related=ResourceSpecification(
            {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"}
        ),
        after={after},
        expect=expect | {f"prefect.flow-run.{s}" for s in FINAL_STATE_NAMES},
        for_each={"prefect.resource.id"},
        posture=Posture.Proactive,
        threshold=1,
        within=timedelta(seconds=window),
    )
    crash = ChangeFlowRunState(
        name="Crashed",
        state=StateType.CRASHED,
        force=False,  # a run that has ended meanwhile stays as it ended
        message=why,
    )
    return AutomationCore(
        name=name,
        description=f"Made by imagebatch deploy: marks Crashed a run tagged {TAG!r} when {why}.",
        trigger=trigger,
        actions=[crash],
    )


def heartbeat_automation(window: float) -> Any:
    """Prefect's documented zombie-run automation ("detect zombie flows"): after a run's heartbeat (every
    `HEARTBEAT_SECONDS`), expect another heartbeat or a final state within `window`, else Crashed."""
    why = f"no heartbeat for {window:g} s: its process is gone (a machine, a worker or the run died)"
    beat = "prefect.flow-run.heartbeat"
    return _crash_when_silent(AUTOMATION_NAME, beat, {beat}, window, why)


def pending_automation(window: float = NEVER_STARTED) -> Any:
    """A run claimed (Pending) and not Running `window` seconds later: its claimer died before it started
    (the sharded parent's own timeout for its shards, `run.constants.NEVER_STARTED`, kept by the server)."""
    why = f"claimed but not started {window:g} s later: whoever claimed it (a worker, a sharded parent) died"
    expect = {"prefect.flow-run.Running", "prefect.flow-run.Scheduled"}
    return _crash_when_silent(PENDING_NAME, "prefect.flow-run.Pending", expect, window, why)


def dead_run_automations(window: float) -> list[Any]:
    """The automations every imagebatch deployment relies on to free its slot from a dead run."""
    return [heartbeat_automation(window), pending_automation()]


def comparable(automation: Any) -> dict[str, Any]:
    """What an automation does, as the server stores it: its fields without the ids the server assigns,
    each list of names in order. The trigger's `after`, `expect` and `for_each` are sets, dumped in their
    iteration order, which depends on the order they were filled in and on the process's string hashing:
    the same automation read back from the server could dump differently from the one built here, and an
    update would restart its window for nothing (seen in one of seven runs of the suite)."""
    from prefect.events.schemas.automations import AutomationCore

    dumped = AutomationCore.model_validate(automation.model_dump()).model_dump(mode="json")
    return dict(_without_ids(dumped))


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        items = [_without_ids(v) for v in value]
        return sorted(items) if all(isinstance(v, str) for v in items) else items
    return value


def ensure(wanted: Any) -> tuple[str, str]:
    """Create the automation named `wanted.name`, or update the one of that name only when it differs
    (an update restarts a proactive trigger's window); returns its id and what was done ("created",
    "updated" or "unchanged")."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(wanted.name)
        if not existing:
            return str(client.create_automation(wanted)), "created"
        first, *duplicates = existing
        for extra in duplicates:  # two deploys at once can both create it
            client.delete_automation(extra.id)
        if comparable(first) == comparable(wanted):
            return str(first.id), "unchanged"
        client.update_automation(first.id, wanted)
        return str(first.id), "updated"
