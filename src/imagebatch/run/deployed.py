"""What only a deployment's run does before it reads or sends anything: compare what it asks with its
deployment's stored parameters, its sharded parent's and its worker's allow-lists (`run.trust`), and refuse
it (`Refused`) when they do not allow it. A run outside a deployment (a terminal's, a Python caller's) is its
caller's own, and is not checked."""

from __future__ import annotations

from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.exceptions import ParameterTypeError
from prefect.runtime import deployment, flow_run
from pydantic import ValidationError

from imagebatch.options import RunOptions, ShardRole, environment_value
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.trust import Asked, Parent, Refused, policy_from_environment, refusal


def trusted(out: str, options: RunOptions, role: ShardRole) -> None:
    """Return when the run may go on; raise `Refused` when a deployment's run asks what neither its
    deployment nor its worker allows."""
    if deployment.id is None:
        return
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        made = client.read_deployment(str(run.deployment_id))
        parent = None
        if role.shard is not None and run.parent_task_run_id is not None:
            task = client.read_task_run(run.parent_task_run_id)
            above = client.read_flow_run(task.flow_run_id) if task.flow_run_id else None
            if above is not None and (asked := _asked(above.parameters)) is not None:
                parent = Parent(asked, above.state.type.value if above.state else None)
    stored = _asked(made.parameters)
    name = f"{FLOW_NAME}/{made.name}"
    if stored is None:
        raise Refused(f"the parameters of deployment {name} are not this imagebatch's: redeploy it")
    policy = policy_from_environment()
    why = refusal(Asked(out, options, role), stored, name, policy, parent, environment_value("base_url"))
    if why:
        raise Refused(why)


def _asked(parameters: dict[str, Any]) -> Asked | None:
    """A run's (or deployment's) stored parameters as the running flow reads its own (every shape it
    accepts), or None when it cannot."""
    context = FlowRunContext.get()
    if context is None or context.flow is None:
        return None
    try:
        valid = context.flow.validate_parameters(parameters)
    except (ParameterTypeError, ValidationError, TypeError, ValueError):
        return None
    return Asked(str(valid["out"]), valid.get("options") or RunOptions(), valid.get("role") or ShardRole())
