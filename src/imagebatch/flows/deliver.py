"""`export_deliverables`: `imagebatch export` as a Prefect flow, for teams that schedule delivery or
chain it after the generation flow (README, "Review and delivery"):

    from prefect import flow
    from imagebatch.flows.batch import generate_from_manifest
    from imagebatch.flows.deliver import export_deliverables

    @flow
    def nightly_catalog() -> None:
        generate_from_manifest(manifest="catalog.csv", out="s3://shop/catalog")
        export_deliverables(out="s3://shop/catalog", to="s3://shop-cdn/products", name="{sku}/{colour}.{ext}",
                            format="jpeg", max_side=2000, quality=85, approved_only=True)

The work is `delivery.export.export`, the same as the command's (the command does not start Prefect). A
refused export (the rows named in the log) fails the flow run and writes nothing; the flow run's log
names the missing deliverables, the earlier export's files set aside and the images below the delivery
size (a warning), and its markdown artifact `imagebatch-export` gives the counts. The parameters are
the command's options; none is a secret (an object store's credentials come from its standard chain
where the flow runs).
"""

from __future__ import annotations

import contextlib

from prefect import flow, get_run_logger

from imagebatch.delivery.convert import Conversion
from imagebatch.delivery.export import export
from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.delivery.listing import EXPORT_CSV

EXPORT_FLOW_NAME = "export-deliverables"


@flow(name=EXPORT_FLOW_NAME, log_prints=False, validate_parameters=True)
def export_deliverables(
    out: str,
    to: str,
    name: str | None = None,
    approved_only: bool = False,
    format: str | None = None,
    max_side: int | None = None,
    quality: int | None = None,
    background: str = "white",
    canvas: str | None = None,
    slug: bool = False,
    prune: bool = False,
    overwrite: bool = False,
    workers: int | None = None,
) -> dict[str, int]:
    """Export OUT's images to `to` as `imagebatch export OUT --to TO ...` does; the counts
    (`ExportSummary.counts`: delivered, written, unchanged, replaced, overwritten, missing, set aside).
    Raises (the flow run Failed, nothing written) when the export is refused: an unknown column, unsafe
    or colliding names, a '/' inside a value, a different file in the way, an image of OUT linked out of
    it, another export into the same DEST still running (one at a time: `delivery.destlock`)."""
    logger = get_run_logger()
    conversion = Conversion.from_options(format, max_side, quality, background, canvas)
    try:
        summary = export(
            out,
            to,
            template=name,
            conversion=conversion,
            approved_only=approved_only,
            overwrite=overwrite,
            slug=slug,
            prune=prune,
            workers=workers,
        )
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
