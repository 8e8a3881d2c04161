"""`export_deliverables`: `imagebatch export` as a Prefect flow, for teams that schedule delivery or
chain it after the generation flow (README, "Review and delivery"):

    from prefect import flow
    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.delivery.options import ExportOptions
from imagebatch.flows.compat import EARLIER_EXPORT, EarlierShapeFlow, export_options_of
from imagebatch.run.constants import EXPORT_FLOW_NAME
    from imagebatch.flows.deliver import export_deliverables

    @flow
    def nightly_catalog() -> None:
        generate_from_manifest(manifest="catalog.csv", out="s3://shop/catalog")
        export_deliverables(out="s3://shop/catalog", to="s3://shop-cdn/products",
                            options=ExportOptions(name="{sku}/{colour}.{ext}", format="jpeg",
                                                  max_side=2000, quality=85, approved_only=True))

The work is `delivery.export.export`, the same as the command's (the command does not start Prefect). A
refused export (the rows named in the log) fails the flow run and writes nothing; the flow run's log
names the missing deliverables, the earlier export's files set aside and the images below the delivery
size (a warning), and its markdown artifact `imagebatch-export` gives the counts. The parameters are
OUT, DEST and the command's options as one `ExportOptions` (a dict of its fields in a deployment's
parameters); none is a secret (an object store's credentials come from its standard chain where the
flow runs).

A deployment whose runs give each option as a parameter of its own (`name`, `format`, ..., each an
`ExportOptions` field) still runs: they are read into `options` as the run starts (`flows.compat`) and
the run's log warns to redeploy; a name that is no option fails the run in one line.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from prefect import get_run_logger

from imagebatch.delivery.export import export
from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.delivery.listing import EXPORT_CSV
from imagebatch.delivery.options import ExportOptions
from imagebatch.flows.compat import EARLIER_EXPORT, EarlierShapeFlow, export_options_of
from imagebatch.run.constants import EXPORT_FLOW_NAME


def _say_redeploy(logger: Any) -> None:
    """Warn in the run's log when its deployment gave the earlier flat parameters (Prefect validates the
    parameters before the run's logger exists, so the flow run's parameters as given are read here)."""
    from prefect.context import FlowRunContext

    with contextlib.suppress(Exception):  # a courtesy: the run goes on without it
        context = FlowRunContext.get()
        given = context.flow_run.parameters if context and context.flow_run else {}
        if flat := sorted(set(given) & EARLIER_EXPORT):
            logger.warning(
                "%s: the deployment's parameters %s were read into `options`; redeploy the flow so that "
                "they are given there",
                EXPORT_FLOW_NAME,
                ", ".join(flat),
            )


@functools.partial(
    EarlierShapeFlow,
    name=EXPORT_FLOW_NAME,
    earlier=EARLIER_EXPORT,
    fold=export_options_of,
    log_prints=False,
    validate_parameters=True,
)
def export_deliverables(out: str, to: str, options: ExportOptions | None = None) -> dict[str, int]:
    """Export OUT's images to `to` as `imagebatch export OUT --to TO ...` does with `options` (default:
    the command's defaults); the counts (`ExportSummary.counts`: delivered, written, unchanged,
    replaced, overwritten, missing, set aside). Raises (the flow run Failed, nothing written) when the
    export is refused: an unknown column, unsafe or colliding names, a '/' inside a value, a different
    file in the way, an image of OUT linked out of it, another export into the same DEST still running
    (one at a time: `delivery.destlock`)."""
    logger = get_run_logger()
    _say_redeploy(logger)
    try:
        summary = export(out, to, options)
    except ExportRefused as exc:
        for problem in exc.problems:
            logger.error(problem)
        raise
    for line in summary.lines():
        logger.info(line)
    for warning in summary.warnings():
        logger.warning(warning)
    counts = summary.counts()
    markdown = "\n".join(
        [f"# imagebatch export: {out} -> {summary.dest}", "", "| deliverables | count |", "|-|-|"]
        + [f"| {what} | {n} |" for what, n in counts.items()]
        + ["", f"Each file's source, size and sha256: `{EXPORT_CSV}` in the destination."]
    )
    with contextlib.suppress(Exception):  # the files are written; the artifact is a courtesy
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(
            key="imagebatch-export", markdown=markdown, description="what the export wrote"
        )
    return counts
