"""`ExportOptions`, the one model of an export's options: the flow's parameters are OUT, DEST and the
model (its schema carries each option's default and choices once), a deployment's earlier flat
parameters are read into it, and the command's refusals of a bad option still name the flag."""

from __future__ import annotations

import pytest
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema

from imagebatch.delivery.convert import FORMATS
from imagebatch.delivery.options import ExportOptions
from imagebatch.flows.deliver import export_deliverables


def test_the_flow_takes_out_dest_and_the_options_as_one_parameter() -> None:
    schema = parameter_schema(export_deliverables.fn).model_dump_for_openapi()
    assert list(schema["properties"]) == ["out", "to", "options"]
    fields = schema["definitions"]["ExportOptions"]["properties"]
    assert fields["background"]["default"] == "white"
    assert fields["format"]["anyOf"][0]["enum"] == list(FORMATS) == ["png", "jpeg", "webp"]
    assert fields["quality"]["anyOf"][0] == {"maximum": 100, "minimum": 1, "type": "integer"}
    assert set(fields) == set(ExportOptions.model_fields)


def test_a_deployments_flat_parameters_are_read_into_the_options() -> None:
    earlier = {"out": "/o", "to": "/d", "name": "{sku}.{ext}", "format": "jpeg", "quality": 80}
    bound = export_deliverables.validate_parameters(earlier)
    assert bound == {
        "out": "/o",
        "to": "/d",
        "options": ExportOptions(name="{sku}.{ext}", format="jpeg", quality=80),
    }
    both = {"out": "/o", "to": "/d", "options": {"slug": True}, "approved_only": True}
    assert export_deliverables.validate_parameters(both)["options"] == ExportOptions(
        slug=True, approved_only=True
    )


def test_a_parameter_that_is_no_option_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^export-deliverables: no parameter or option named colour$"):
        export_deliverables.validate_parameters({"out": "/o", "to": "/d", "colour": "red"})
    with pytest.raises(ParameterTypeError, match=r"options\.quality"):
        export_deliverables.validate_parameters({"out": "/o", "to": "/d", "quality": 0})


def test_a_copy_with_other_prefect_options_still_reads_the_flat_parameters() -> None:
    renamed = export_deliverables.with_options(name="nightly-export")
    assert renamed.name == "nightly-export"
    assert renamed.validate_parameters({"out": "/o", "to": "/d", "slug": True})["options"] == ExportOptions(
        slug=True
    )
