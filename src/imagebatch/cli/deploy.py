"""`imagebatch deploy` and `imagebatch serve`: their arguments (a deployment's name, schedule and runner,
and the options model's flags a scheduled run takes: `cli.flags`); the commands are `platform.deploy`."""

from __future__ import annotations

import argparse
from typing import Any

from imagebatch.cli.common import MANIFEST_HELP, command, sheet_argument
from imagebatch.cli.flags import add_option_flags
from imagebatch.platform.deploy_metadata import add_arguments as add_metadata_arguments
from imagebatch.run.constants import FLOW_NAME


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
    add_metadata_arguments(parser, work_pool=True)  # tags, description, ... (platform.deploy_metadata)
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
    add_metadata_arguments(parser, work_pool=False)
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


def deploy_command(args: argparse.Namespace) -> int:
    from imagebatch.platform.deploy import deploy_main, serve_main

    return deploy_main(args) if args.command == "deploy" else serve_main(args)
