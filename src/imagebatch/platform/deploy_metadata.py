"""The knobs a platform team sets on a deployment beside its run's options: tags, a description, a
version, the work queue, job variables, a schedule created paused, and who is told when a run fails.

    imagebatch deploy ... [--tag T]... [--description TEXT] [--version V] [--paused]
                          [--work-queue Q] [--job-variable KEY=VALUE]... [--notify BLOCK]...

`cli.deploy` puts them on `deploy`'s (and `serve`'s) parser and reads them into a `DeploymentMetadata`,
which checks them (bad input: one line naming the option, exit 2), `apply` sets them on the deployment
before it is applied,
and `notify` keeps one automation per deployment that sends each BLOCK (a Prefect notification block:
Slack, email, a webhook) the run's name, state, counts and reason when a run fails or crashes.

A job variable never carries a secret: one whose `env` names the API key or an object store's secret is
refused, as they would be stored in Prefect's database (the key stays in the worker's environment).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from imagebatch.errors import UsageError
from imagebatch.gateway.constants import ENV_API_KEY, STORE_SECRETS
from imagebatch.platform.automations import HEARTBEAT_ENV, TAG, ensure

NOTIFY_BODY = (
    "Flow run {{ flow_run.name }} of {{ deployment.name }} ended {{ flow_run.state.name }}: "
    "{{ flow_run.state.message }}"
)
"""What a notification says: the run's name, its state, and its state's message (the counts, and the
stop's reason first when it stopped: `run.final_state`)."""


@dataclass(frozen=True)
class DeploymentMetadata:
    """What the metadata options asked for, checked when made: `UsageError` naming the option otherwise
    (`job_variables` values already read from their JSON)."""

    tags: tuple[str, ...] = ()
    description: str | None = None
    version: str | None = None
    work_queue: str | None = None
    job_variables: dict[str, Any] = field(default_factory=dict)
    paused: bool = False
    notify: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        env = self.job_variables.get("env", {})
        if not isinstance(env, dict):
            raise UsageError('--job-variable env=...: give a JSON object, e.g. env={"TZ": "UTC"}')
        if secret := sorted({ENV_API_KEY, *STORE_SECRETS} & set(env)):
            raise UsageError(
                f"--job-variable env: {secret[0]} would be stored in Prefect's database; "
                "keep it in the worker's environment"
            )
        for name in self.notify:
            if name.count("/") != 1 or not all(name.split("/")):
                raise UsageError(
                    f"--notify {name!r}: name a notification block TYPE/NAME, e.g. slack-webhook/ops"
                )


def apply(deployment: Any, metadata: DeploymentMetadata) -> Any:
    """Set `metadata` on a `RunnerDeployment` (before `apply()`); `TAG` and the heartbeat's `env` stay."""
    deployment.tags = [TAG, *metadata.tags]
    deployment.description = metadata.description
    deployment.version = metadata.version
    deployment.paused = metadata.paused
    if deployment.work_pool_name:
        deployment.work_queue_name = metadata.work_queue
        variables = dict(metadata.job_variables)
        env = {**variables.pop("env", {}), **HEARTBEAT_ENV}  # the heartbeat the dead-run watch relies on
        deployment.job_variables = {**deployment.job_variables, **variables, "env": env}
    return deployment


def notification(deployment_id: str, full_name: str, block_id: str, block: str) -> Any:
    """The automation that sends `block` a deployment's runs that end Failed or Crashed."""
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    trigger = EventTrigger(
        match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        match_related=ResourceSpecification(
            {
                "prefect.resource.role": "deployment",
                "prefect.resource.id": f"prefect.deployment.{deployment_id}",
            }
        ),
        expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
        posture=Posture.Reactive,
        threshold=1,
    )
    send = SendNotification(
        block_document_id=UUID(block_id),
        subject=f"imagebatch: a run of {full_name} ended {{{{ flow_run.state.name }}}}",
        body=NOTIFY_BODY,
    )
    return AutomationCore(
        name=f"imagebatch: notify {block} when a run of {full_name} fails",
        description=f"Made by imagebatch deploy --notify {block}.",
        trigger=trigger,
        actions=[send],
    )


def block_ids(blocks: tuple[str, ...]) -> dict[str, str]:
    """The id of each notification block named TYPE/NAME (checked before anything is deployed);
    UsageError naming a block the server does not have."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    ids = {}
    with get_client(sync_client=True) as client:
        for block in blocks:
            kind, name = block.split("/")
            try:
                ids[block] = str(client.read_block_document_by_name(name, kind).id)
            except ObjectNotFound:
                raise UsageError(
                    f"--notify {block}: no such block on the server (create it in the UI's Blocks page)"
                ) from None
    return ids


def notify(deployment_id: str, full_name: str, blocks: dict[str, str]) -> list[str]:
    """Create (or update, when it differs) one notification automation per block (`block_ids`); returns
    the automations' ids."""
    return [ensure(notification(deployment_id, full_name, i, block))[0] for block, i in blocks.items()]
