"""`imagebatch deploy` and `imagebatch serve`: their arguments (a deployment's name, schedule, runner and
metadata, and the options model's flags a scheduled run takes: `cli.flags`) read into a `DeployRequest`,
which `platform.deploy` deploys (or serves); its refusals printed here, and the exit code."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from imagebatch.cli.common import MANIFEST_HELP, command, sheet_argument
from imagebatch.cli.flags import add_option_flags, options_from
from imagebatch.errors import UsageError
from imagebatch.platform.automations import TAG
from imagebatch.platform.deploy_metadata import DeploymentMetadata
from imagebatch.run.constants import FLOW_NAME
from imagebatch.run.exit_codes import EXIT_OK, code_of
from imagebatch.storage.location import shown_url

if TYPE_CHECKING:
    from imagebatch.platform.deploy import DeployRequest


def add_deploy(sub: Any) -> None:
    parser = command(
        sub,
        "deploy",
        "create or update a (scheduled) Prefect deployment of the flow, run by a pool's workers",
        "Needs a Prefect server (PREFECT_API_URL).",
    )
    _deployment_arguments(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="make every check and set up the heartbeat automation, but deploy nothing "
        "(prefect.yaml's build step)",
    )
    parser.add_argument(
        "--work-pool",
        default=None,
        help="the process work pool whose workers run it "
        "(default: $PREFECT_DEPLOYMENTS_DEFAULT_WORK_POOL_NAME)",
    )
    _metadata_arguments(parser, work_pool=True)  # tags, description, ... (platform.deploy_metadata)
    add_option_flags(parser, "deploy")
    parser.set_defaults(handler=deploy_command)


def add_serve(sub: Any) -> None:
    parser = command(
        sub,
        "serve",
        "create or update the deployment and serve its runs from here until Ctrl-C",
        "Needs a Prefect server (PREFECT_API_URL).",
    )
    _deployment_arguments(parser)
    _metadata_arguments(parser, work_pool=False)
    add_option_flags(parser, "serve")
    parser.set_defaults(handler=deploy_command)


def _deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """The deployment's manifest, output, name and schedule (not --force nor --retry-unknown: no one is
    there to decide; --redo rejected is decided by the reviewers' decisions, so a team can schedule it)."""
    parser.add_argument("manifest", help=f"{MANIFEST_HELP} (its absolute path, or its URL, is deployed)")
    sheet_argument(parser)
    parser.add_argument(
        "--out",
        required=True,
        help="output folder or s3://bucket/prefix (gs://, az://), the same for every run: each sends only "
        "new and changed rows",
    )
    parser.add_argument("--name", required=True, help=f"the deployment's name: runs are '{FLOW_NAME}/NAME'")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--cron", default=None, help='cron schedule, e.g. "0 2 * * *" (default: no schedule)')
    when.add_argument("--interval", type=float, default=None, help="schedule: a run every SECONDS")
    parser.add_argument(
        "--timezone", default=None, help="time zone of the schedule, e.g. Europe/Paris (default: UTC)"
    )


def _metadata_arguments(parser: argparse.ArgumentParser, *, work_pool: bool = True) -> None:
    """The knobs a platform team sets on a deployment (`platform.deploy_metadata`), on `deploy`'s parser
    (`work_pool`) or `serve`'s (no queue, job variables nor notifications: its runs run in its own process,
    watched by the person who started it)."""
    group = parser.add_argument_group("deployment metadata")
    tag_help = f"a tag of the deployment and its runs (repeatable; {TAG!r} is always there)"
    group.add_argument("--tag", action="append", default=[], metavar="TAG", help=tag_help)
    group.add_argument("--description", default=None, help="the deployment's description (shown in the UI)")
    group.add_argument("--version", default=None, help="the deployment's version (e.g. a release or commit)")
    group.add_argument("--paused", action="store_true", help="create or update it with its schedule paused")
    if work_pool:
        group.add_argument("--notify", action="append", default=[], metavar="BLOCK",
                           help="a Prefect notification block (TYPE/NAME, e.g. slack-webhook/ops) told when "
                           "a run of this deployment fails or crashes (repeatable)")  # fmt: skip
        group.add_argument(
            "--work-queue", default=None, metavar="QUEUE", help="the pool's queue its runs go to"
        )
        group.add_argument("--job-variable", action="append", default=[], metavar="KEY=VALUE",
                           help="a job variable of the work pool (VALUE as JSON where it parses, else "
                           "text; repeatable), e.g. working_dir=/srv/imagebatch")  # fmt: skip


def metadata_of(args: argparse.Namespace) -> DeploymentMetadata:
    """The metadata options given, each --job-variable's VALUE read as JSON where it parses; `UsageError`
    naming the option for one that is not KEY=VALUE (the rest `DeploymentMetadata` checks)."""
    variables: dict[str, Any] = {}
    for item in getattr(args, "job_variable", None) or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--job-variable {item!r}: give KEY=VALUE, e.g. working_dir=/srv/imagebatch")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        variables[key.strip()] = value
    return DeploymentMetadata(
        tags=tuple(t for t in dict.fromkeys(args.tag) if t != TAG),
        description=args.description,
        version=args.version,
        work_queue=getattr(args, "work_queue", None),
        job_variables=variables,
        paused=args.paused,
        notify=tuple(getattr(args, "notify", None) or ()),
    )


def request_of(args: argparse.Namespace) -> DeployRequest:
    """The deployment `deploy` or `serve` asks for, from its flags: `UsageError` naming a flag whose
    value the options or the metadata refuse."""
    from imagebatch.platform.deploy import DeployRequest

    return DeployRequest(
        manifest=str(args.manifest),
        out=str(args.out),
        name=args.name,
        options=options_from(args, args.command),
        serve=args.command == "serve",
        cron=args.cron,
        interval=args.interval,
        timezone=args.timezone,
        work_pool=getattr(args, "work_pool", None),
        check_only=bool(getattr(args, "check", False)),
        metadata=metadata_of(args),
    )


def deploy_command(args: argparse.Namespace) -> int:
    """`imagebatch deploy` (create or update the deployment; runs go to --work-pool) and `imagebatch
    serve` (the same, then its runs run from this process until Ctrl-C)."""
    from imagebatch.manifest.models import ManifestError
    from imagebatch.platform.deploy import deploy, serve_runs

    try:
        deployed = deploy(request_of(args))
    except ManifestError as exc:  # every problem, as `run` prints them
        for problem in exc.problems:
            print(str(problem), file=sys.stderr)
        where, n = shown_url(args.manifest), len(exc.problems)
        print(f"{where}: {n} problem{'s' if n != 1 else ''}; nothing was deployed.", file=sys.stderr)
        return code_of(exc)
    except UsageError as exc:
        print(f"imagebatch {args.command}: {exc}", file=sys.stderr)
        return code_of(exc)
    print("\n".join(deployed.lines))
    if deployed.serving is None:
        return EXIT_OK
    try:
        serve_runs(deployed.serving)
    except KeyboardInterrupt as exc:
        return code_of(exc)
    return EXIT_OK
