"""`imagebatch deploy` and `imagebatch serve`: a Prefect deployment of `generate_from_manifest`, on a real
Prefect server (`PREFECT_API_URL`), with a schedule, run by a work pool's workers or by this process.

    imagebatch deploy MANIFEST --out DIR|URL --name NAME --work-pool POOL [--cron EXPR | --interval S] ...
    imagebatch serve  MANIFEST --out DIR|URL --name NAME [--cron EXPR | --interval S] ...  (until Ctrl-C)

Choices (README "Scheduled runs"):

- **The entrypoint is a module path** (`imagebatch.flows.batch.generate_from_manifest`, Prefect's
  `EntrypointType.MODULE_PATH`), with no storage and no pull steps: a worker imports the flow from the
  imagebatch installed in its own environment (`prefect worker start` run from this project's
  environment, e.g. `uv run prefect worker start ...`). Not `flow.from_source(<local directory>)`: that
  pins a source folder and a file path relative to it, and loads `batch.py` as a script (a second copy of
  the module, beside the installed one); the installed package is what `imagebatch run` uses too.
  `prefect deploy` with the repository's `prefect.yaml` makes the same deployment for the same inputs,
  under its own name (`nightly-yaml`), so it never replaces one this command made; its build step is this
  command with `--check` (every check and the heartbeat automation, nothing deployed).
- **A service address is required** (`--base-url URL`, or `IMAGEBATCH_BASE_URL` here, stored in the
  deployment; the emulator only by name: `embedded`): a scheduled run on placeholder images, reporting
  Completed, is what no one wants. A deployment's run without one fails with the same line
  (`run.preflight.NO_SERVICE`).
- **Dead runs are marked Crashed** by Prefect's documented zombie-run automation, created here once and
  updated only when it differs (`platform.automations`, one per server, for runs tagged `imagebatch`):
  runs send a heartbeat every 30 s (the deployment's job variables' `env`; `serve` gives it to its
  runner), and one with none for 90 s (`IMAGEBATCH_HEARTBEAT_WINDOW`) is Crashed, which frees the
  deployment's slot for the next; a second automation crashes a run claimed but never started.
- **One run at a time, `CANCEL_NEW`**: the deployment's concurrency limit is 1 and a run that starts while
  another holds the slot is cancelled by the server ("Deployment concurrency limit reached"), visible as
  such in the UI. A run sends everything not yet done, so a skipped firing loses nothing: the next one
  does it all. ENQUEUE would instead pile waiting runs behind a long one (one per firing) that then start
  back to back. The output folder's lock (`Backend.hold`) stays the last guard.
- **`deploy` needs a work pool** (`--work-pool` or Prefect's `PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME`);
  without one it refuses and points to `imagebatch serve`, which takes the same options and serves the
  deployment from this process until Ctrl-C (Prefect's `serve`; the schedule is paused when it stops). A
  command that deploys then blocks forever would hang every script that calls it.
- **The key is never a parameter**: only `api_key_secret_block`, a block's name. Without one, runs read
  `IMAGEBATCH_API_KEY` from the worker's (or the serving process's) environment. A named block is read
  once here, so a typo is refused before deploying.
- **The schedule is what the command says**: a deploy without `--cron`/`--interval` removes the
  deployment's schedules (runs are then started by hand: `prefect deployment run`).
- **`--out` with `{date}` is not supported**: parameters are fixed when deploying, so a folder per run
  needs the flow to expand it when it starts; refused with a message rather than creating `{date}/`.
- **The same checks as `run`** (`run.preflight.preflight`: the manifest and its files, the options, the output
  folder, the base URL), before anything reaches Prefect. Two differences: the key is looked for where the
  runs will read it (the worker's environment: not checkable from here), and an output folder held by a
  running run does not stop a redeploy (the run will release it).
- Paths (the manifest, `--out`, `--prices`) are made absolute: a worker runs the flow in a temporary
  directory. An object store's `--out` (`s3://bucket/prefix`) is kept as its URL, which never holds a
  credential (one with a user, password or query is refused, as by `run`): the bucket is checked here
  with the deploying shell's credentials (a missing bucket or refused credentials: exit 2, nothing
  deployed), and each worker reads its own from its store's standard chain when its runs start.

`deploy` and `serve` are one set of checks (address, pool, bucket, manifest, shards) feeding one
deployment; the automations it keeps are in `platform.automations`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from imagebatch.errors import UsageError
from imagebatch.gateway.constants import ENV_API_KEY
from imagebatch.gateway.environment import base_url_or_environment
from imagebatch.manifest.load import absolute
from imagebatch.options import RunOptions, ShardRole
from imagebatch.platform.automations import (
    AUTOMATION_NAME,
    HEARTBEAT_ENV,
    HEARTBEAT_SECONDS,
    TAG,
    dead_run_automations,
    ensure,
    heartbeat_window,
)
from imagebatch.platform.deploy_metadata import DeploymentMetadata, block_ids, notify
from imagebatch.platform.deploy_metadata import apply as apply_metadata
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.preflight import (
    EMBEDDED,
    locked,
    out_text,
    output_location,
    preflight,
)
from imagebatch.run.verdict import parse_allowance
from imagebatch.storage.location import is_object_url
from imagebatch.work.store import OutputLockedError, OutputStore

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment
    from prefect.utilities.callables import ParameterSchema

COLLISION = "CANCEL_NEW"
"""What the server does with a run of the deployment that starts while another one runs: cancel it."""

START_SERVER_HINT = (
    "start a Prefect server (`prefect server start`), then `export PREFECT_API_URL=http://127.0.0.1:4200/api`"
)
# Stands in for the Secret block in `preflight`'s key check: a deployment's runs read the key on the
# worker (its environment or the block), so the deploying shell need not hold it.
_KEY_AT_RUN_TIME = "<the key where the runs read it>"


@dataclass(frozen=True)
class DeployRequest:
    """What `imagebatch deploy` (or `serve`, which runs the deployment's runs from this process) asks for:
    the manifest, the output and the run's options every run of the deployment takes, its name and
    schedule, the work pool its runs go to, and its metadata."""

    manifest: str
    out: str
    name: str
    options: RunOptions
    serve: bool = False
    cron: str | None = None
    interval: float | None = None
    timezone: str | None = None
    work_pool: str | None = None
    check_only: bool = False
    """Make every check and set up the heartbeat automation, but deploy nothing."""
    metadata: DeploymentMetadata = field(default_factory=DeploymentMetadata)


@dataclass(frozen=True)
class Deployed:
    """What `deploy` did, in the lines the command prints, and the deployment `serve_runs` is to serve
    (None when it was deployed to a work pool, or only checked)."""

    lines: list[str]
    serving: RunnerDeployment | None = None


def deploy(request: DeployRequest) -> Deployed:
    """Create or update the deployment on the server (its runs go to the work pool, or to this process
    for `serve`). `ManifestError` for an invalid manifest, `UsageError` for anything else the checks or
    the server refuse; nothing is deployed then."""
    parameters = check(request)
    schedule = schedule_of(request.cron, request.interval, request.timezone)
    api_url = require_prefect_server()
    pool = None if request.serve else work_pool_of(request.work_pool)
    metadata = request.metadata
    model = RunOptions.model_validate(parameters["options"])
    blocks = _server_checks(model, pool, metadata.notify, serve=request.serve)
    window = heartbeat_window()
    for automation in dead_run_automations(window):
        ensure(automation)  # created once, updated only when it differs (platform.automations)
    if request.check_only:
        return Deployed(
            [f"checked; runs tagged {TAG!r} without a heartbeat for {window:g} s are marked Crashed"]
        )
    deployment = _apply(request.name, parameters, schedule, pool, metadata)
    deployment_id = None if request.serve else deployment.apply(work_pool_name=pool)
    if deployment_id is not None:
        notify(str(deployment_id), f"{FLOW_NAME}/{request.name}", blocks)
    shown_id = None if deployment_id is None else str(deployment_id)
    lines = [
        describe(request, api_url, parameters, schedule, pool, shown_id),
        f"  a run without a heartbeat for {window:g} s is marked Crashed (automation {AUTOMATION_NAME!r})",
    ]
    return Deployed(lines, deployment if request.serve else None)


def serve_runs(deployment: RunnerDeployment) -> None:
    """Run the deployment's runs from this process until Ctrl-C (KeyboardInterrupt), with the heartbeat
    the dead-run automation watches."""
    from prefect import serve as prefect_serve

    prefect_serve(deployment, print_starting_message=False, heartbeat_seconds=HEARTBEAT_SECONDS)


def _server_checks(
    options: RunOptions, pool: str | None, notify_blocks: tuple[str, ...], *, serve: bool
) -> dict[str, str]:
    """What the server must have before anything is deployed: the Secret block, the global limit, the
    work pool and the notification blocks (returns their ids); UsageError naming what is missing."""
    if options.service.api_key_secret_block:
        check_secret_block(options.service.api_key_secret_block)
    if options.pacing.global_limit:
        from imagebatch.run.limits import rate_limit_of

        rate_limit_of(options.pacing.global_limit)  # refuses a limit the server does not have
    if pool:
        check_work_pool(pool)
    if options.sharding.shards > 1 and serve:
        raise UsageError("--shards needs a work pool's workers: use imagebatch deploy --work-pool")
    return block_ids(notify_blocks)


def _apply(
    name: str, parameters: dict[str, Any], schedule: Any, pool: str | None, metadata: DeploymentMetadata
) -> RunnerDeployment:
    """The deployment NAME (and, for a sharded run, NAME-shards, the deployment its shards run as, applied
    now, never paused), each with the metadata given; its schedule cleared on the server when it has none."""
    if parameters["options"]["sharding"]["shards"] > 1:  # the parent plans and merges
        shard_deployment = f"{name}-shards"
        shard_runs = build_deployment(
            shard_deployment, parameters, None, pool, limit=None, version=metadata.version
        )
        apply_metadata(shard_runs, replace(metadata, paused=False)).apply(work_pool_name=pool)
        parameters["role"] = ShardRole(shard_deployment=f"{FLOW_NAME}/{shard_deployment}").model_dump(
            mode="json"
        )
    deployment = apply_metadata(
        build_deployment(name, parameters, schedule, pool, version=metadata.version), metadata
    )
    if schedule is None:
        clear_schedules(f"{FLOW_NAME}/{name}")
    return deployment


def check(request: DeployRequest) -> dict[str, Any]:
    """`run`'s checks (`preflight`), then the deployment's parameters: the manifest, the output and the
    options (`imagebatch.options`, whole: the form Prefect's UI shows), paths made absolute, the service's
    address from here, never the key.

    Served runs run here, so `serve` checks for the key here too, as `run` does."""
    serve = request.serve
    if "{" in request.out:
        raise UsageError(
            f"--out {request.out}: placeholders such as {{date}} are not supported (a deployment's "
            "parameters are fixed when it is deployed); use one folder: a rerun sends only new and "
            "changed rows"
        )
    manifest = absolute(request.manifest)  # a path made absolute, or an object's URL as it is
    where = output_location(request.out)
    out = where if isinstance(where, str) else where.expanduser().resolve()
    options = _absolute(request.options)
    service = options.service
    block = service.api_key_secret_block if serve else service.api_key_secret_block or _KEY_AT_RUN_TIME
    parse_allowance(options.outcome.allow_failures)
    try:
        checked = options.model_copy(
            update={"service": service.model_copy(update={"api_key_secret_block": block})}
        )
        preflight(manifest, out, checked, deployed=True)
    except UsageError as exc:
        # A running run holding the folder does not stop a redeploy; `preflight` checks the folder last,
        # so the message tells whether that was the only problem.
        if str(exc) != _held_message(out):
            raise
    return {"manifest": manifest, "out": out_text(out), "options": options.model_dump(mode="json")}


def _absolute(options: RunOptions) -> RunOptions:
    """The options as a worker reads them: the price table and files roots made absolute (a worker runs
    the flow in a temporary folder), the service's address from `IMAGEBATCH_BASE_URL` here if not given."""
    prices = options.budgets.prices
    roots = options.inputs.files_root
    return options.with_flat(
        base_url=base_url_or_environment(options.service.base_url),
        prices=str(Path(prices).expanduser().resolve()) if prices else None,
        files_root=[absolute(r) for r in roots] if roots else None,
    )


def _held_message(out: Path | str) -> str | None:
    """The message `preflight` gives when another run holds `out` (a folder, or a bucket's prefix), or
    None when none does."""
    if isinstance(out, Path) and not out.is_dir():
        return None
    try:
        with OutputStore(out).backend.hold():
            return None
    except OutputLockedError as exc:
        return str(locked(exc))
    except (OSError, ValueError):  # unwritable, or not a URL `--out` takes: `preflight` said why
        return None


def schedule_of(cron: str | None, interval: float | None, timezone: str | None) -> Any:
    """The Prefect schedule asked for (`prefect.schedules.Schedule`: `cron` or every `interval` seconds,
    in `timezone`, UTC by default), or None (runs started by hand)."""
    if timezone:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise UsageError(
                f"--timezone {timezone!r} is not an IANA time zone (e.g. Europe/Paris)"
            ) from None
    if interval is not None:
        from prefect.schedules import Interval

        if interval < 1:
            raise UsageError(f"--interval must be at least 1 second, not {interval:g}")
        return Interval(timedelta(seconds=interval), timezone=timezone or "UTC")
    if cron is None:
        if timezone:
            raise UsageError("--timezone needs --cron or --interval")
        return None
    from prefect.schedules import Cron

    try:
        return Cron(cron, timezone=timezone or "UTC")  # stored: what `describe` prints
    except ValueError as exc:
        raise UsageError(f"--cron {cron!r} is not a cron expression: {exc}") from None


def work_pool_of(work_pool: str | None) -> str:
    """The pool given, else Prefect's default pool; UsageError pointing to `serve` when there is none."""
    from prefect.settings import PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME

    pool = work_pool or PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME.value()
    if not pool:
        raise UsageError(
            "name the work pool whose workers will run it (--work-pool POOL), or serve it from this "
            "process until Ctrl-C instead: imagebatch serve with the same options"
        )
    return str(pool)


def require_prefect_server() -> str:
    """The configured Prefect API, answering; else UsageError saying how to start one.

    Prefect's temporary server (what runs get when `PREFECT_API_URL` is unset) cannot schedule, and a
    deployment on it would vanish with it."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise UsageError(
            "PREFECT_API_URL is not set: a deployment needs a real Prefect server (the temporary one "
            f"cannot schedule); {START_SERVER_HINT}"
        )
    import httpx

    try:
        status = httpx.get(f"{str(url).rstrip('/')}/health", timeout=5.0).status_code
    except httpx.HTTPError as exc:
        raise UsageError(
            f"no Prefect server answers at {url} ({type(exc).__name__}); {START_SERVER_HINT}"
        ) from None
    if status != 200:
        raise UsageError(f"the Prefect server at {url} answered {status} to /health")
    return str(url)


def check_secret_block(name: str) -> None:
    """The named Secret block exists on the server and holds a usable key
    (`run.preflight.resolve_api_key`)."""
    from imagebatch.run.preflight import resolve_api_key

    resolve_api_key(name)


def check_work_pool(pool: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            raise UsageError(
                f"work pool {pool!r} does not exist on the server: create it with "
                f"`prefect work-pool create {pool} --type process`"
            ) from None


def clear_schedules(full_name: str) -> None:
    """Remove the schedules of an existing deployment (Prefect's update keeps them when given none)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_deployment_by_name(full_name)
        except ObjectNotFound:
            return
        for schedule in client.read_deployment_schedules(existing.id):
            client.delete_deployment_schedule(existing.id, schedule.id)


def build_deployment(
    name: str,
    parameters: dict[str, Any],
    schedule: Any,
    pool: str | None,
    limit: int | None = 1,
    version: str | None = None,
) -> RunnerDeployment:
    """The deployment of `generate_from_manifest` (module-path entrypoint, concurrency 1, CANCEL_NEW; a
    shard deployment has no limit of its own: its parent's is what keeps runs apart). A pool's runs get
    the heartbeat frequency through the job variables' `env`, whatever the worker's own environment.
    `version` is given here, not set afterwards: Prefect replaces a version it took from the flow with
    the commit of a git checkout that has a remote (`get_inferred_version_info`); without `--version`,
    that commit is the deployment's version."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.types.entrypoint import EntrypointType

    from imagebatch.flows.batch import generate_from_manifest

    deployment = generate_from_manifest.to_deployment(
        name=name,
        version=version,
        schedules=[schedule] if schedule is not None else None,
        parameters=parameters,
        concurrency_limit=ConcurrencyLimitConfig(
            limit=limit, collision_strategy=ConcurrencyLimitStrategy(COLLISION)
        )
        if limit
        else None,
        tags=[TAG],
        work_pool_name=pool,
        job_variables={"env": HEARTBEAT_ENV} if pool else None,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    deployment = cast("RunnerDeployment", deployment)  # the sync form: a deployment, not a coroutine, here
    deployment._parameter_openapi_schema = closed_schema(deployment._parameter_openapi_schema)
    return deployment


def closed_schema(schema: ParameterSchema) -> ParameterSchema:
    """The flow's parameter schema closed to names it does not take: the server, which enforces a
    deployment's schema (Prefect's default), answers a run with an unknown parameter 409 (`'bogus' is not
    one of ['manifest', 'options', 'out', 'role']`), so it never starts: Prefect's engine would crash on it
    before the flow's code runs. `role`, set by imagebatch for a sharded run's parts, is among the names but
    not among the properties, which Prefect's form shows."""
    from prefect.utilities.callables import ParameterSchema
    from pydantic import ConfigDict

    class Closed(ParameterSchema):
        model_config = ConfigDict(extra="allow")

    names = sorted({*schema.properties, "role"})
    return Closed.model_validate(schema.model_dump(exclude_unset=True) | {"propertyNames": {"enum": names}})


def describe(
    request: DeployRequest,
    api_url: str,
    parameters: dict[str, Any],
    schedule: Any,
    pool: str | None,
    deployment_id: str | None,
) -> str:
    """What was deployed (or is served) and how its runs will run, in the lines the command prints."""
    full_name = f"{FLOW_NAME}/{request.name}"
    verb = "deployed" if deployment_id else "serving"
    lines = [f"{verb} {full_name} on {api_url}" + (f" (id {deployment_id})" if deployment_id else "")]
    if schedule is None:
        lines.append(f"  schedule: none; start a run with: prefect deployment run '{full_name}'")
    else:
        when = (
            f"cron {schedule.cron!r}" if schedule.cron else f"every {schedule.interval.total_seconds():g} s"
        )
        lines.append(
            f"  schedule: {when} ({schedule.timezone})" + (", paused" if request.metadata.paused else "")
        )
    lines.append(f"  manifest: {parameters['manifest']}")
    lines.append(f"  out: {parameters['out']} (a run sends only new and changed rows)")
    if is_object_url(parameters["out"]):
        whose = "each worker's" if pool else "this process's"
        lines.append(f"  store credentials: {whose} own (environment, profile or role; never a parameter)")
    options = RunOptions.model_validate(parameters["options"])
    if options.inputs.files_root:
        lines.append(f"  files root: the manifest's folder and {', '.join(options.inputs.files_root)}")
    if pool:
        lines.append(f"  runs on: work pool {pool!r}; a worker: imagebatch worker --pool {pool}")
    else:
        lines.append("  runs in: this process, until Ctrl-C (the schedule is paused then)")
    where = "the worker's" if pool else "this process's"
    if options.service.api_key_secret_block:
        lines.append(f"  API key: the Prefect Secret block {options.service.api_key_secret_block!r}")
    else:
        lines.append(f"  API key: {ENV_API_KEY} in {where} environment (never a parameter)")
    if str(options.service.base_url).strip().lower() == EMBEDDED:
        lines.append("  service: the embedded emulator (its images are placeholders), as asked")
    else:
        lines.append(f"  service: {options.service.base_url}")
    lines.append("  one run at a time: a run that starts while one is running is cancelled (CANCEL_NEW)")
    return "\n".join(lines)
