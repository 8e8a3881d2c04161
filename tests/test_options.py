"""The options model (`imagebatch.options`) and every path that reads it, driven by its fields so that an
option added later cannot be missed: the command line's flags, a shard's parameters, a deployment made by
an earlier imagebatch (flat parameters), the flow's form in Prefect's UI, and a sharded run's budgets."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.options import every_other, other_value
from helpers.units import planned_units
from pydantic import ValidationError

from imagebatch.cli.common import TOP_EXIT_CODES, exit_codes_of
from imagebatch.cli.flags import options_from
from imagebatch.cli.main import build_parser
from imagebatch.errors import UsageError
from imagebatch.options import (
    OWNER,
    Budgets,
    RunOptions,
    ShardRole,
    cli_of,
    fields,
    flag_of,
    problem,
    split_budgets,
)


def argv_of(name: str, value: Any) -> list[str]:
    """The command line that sets field `name` to `value`."""
    flag = flag_of(name)
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag.removeprefix("--")]
    if isinstance(value, list):
        return [part for item in value for part in (flag, str(item))]
    return [flag, str(value)]


def test_every_field_has_a_description_and_a_name_no_other_group_has() -> None:
    names = [name for model in RunOptions.model_fields.values() for name in model.annotation.model_fields]  # type: ignore[union-attr]
    assert len(names) == len(set(names)) == len(OWNER)
    assert not [name for name, info in fields().items() if not info.description]


@pytest.mark.parametrize("command", ["run", "deploy", "serve"])
def test_every_option_a_command_takes_reaches_its_options_from_the_command_line(command: str) -> None:
    base = [command, "m.csv", "--out", "o"] + (["--name", "n"] if command != "run" else [])
    taken = [name for name, info in fields().items() if command in cli_of(info).commands]
    argv = base + [part for name in taken for part in argv_of(name, other_value(name))]
    options = options_from(build_parser().parse_args(argv), command)
    assert {name: options.flat()[name] for name in taken} == {name: other_value(name) for name in taken}
    untouched = options_from(build_parser().parse_args(base), command)
    assert untouched == RunOptions()  # an absent flag is the model's default
    assert {"force", "retry_unknown"} & set(taken) == (
        {"force", "retry_unknown"} if command == "run" else set()
    )


def test_a_value_out_of_its_bounds_is_one_line_naming_the_flag() -> None:
    args = build_parser().parse_args(["run", "m.csv", "--out", "o", "--concurrency", "0"])
    with pytest.raises(UsageError) as refused:
        options_from(args, "run")
    assert str(refused.value) == "--concurrency must be from 1 to 256, not 0"
    with pytest.raises(ValidationError) as bad:
        RunOptions.from_flat(max_images=-1)
    assert problem(bad.value) == "--max-images must be 0 or more, not -1"
    with pytest.raises(ValueError, match="'colour' is not an option"):
        RunOptions.from_flat(colour="red")


def test_each_help_page_is_written_for_users_and_ends_with_its_exit_codes(capsys: Any) -> None:
    for argv in ([], ["run"], ["deploy"], ["serve"], ["validate"], ["export"], ["review"], ["worker"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*argv, "--help"])
        text = capsys.readouterr().out
        own = exit_codes_of(argv[0]) if argv else TOP_EXIT_CODES  # each command's own
        assert " ".join(text.split()).endswith(" ".join(own.split())), argv
        assert "`imagebatch" not in text.split("\n\n")[1], argv  # the description, not a module docstring
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    run_help = capsys.readouterr().out
    assert all(flag_of(name) in run_help for name, info in fields().items() if "run" in cli_of(info).commands)


def test_every_option_reaches_each_shards_parameters_with_its_part_of_the_budgets() -> None:
    from imagebatch.run.shards import requests_to_send, shard_of, shard_parameters

    units = planned_units(40)
    values = every_other() | {"shards": 2, "max_images": 10, "max_spend": 1.0, "force": False}
    options = RunOptions.from_flat(**values)
    shares = [sum(len(u.requests) for u in units if shard_of(u, 2) == i) for i in range(2)]
    assert requests_to_send(options, units, {}, frozenset()) == shares  # nothing done yet: every request
    parameters = list(shard_parameters("m.csv", "/out", options, shares).values())
    assert [p["role"] for p in parameters] == [{"shard_deployment": None, "shard": i} for i in range(2)]
    budgets = [RunOptions.model_validate(p["options"]).budgets for p in parameters]
    assert sum(b.max_images or 0 for b in budgets) == 10
    assert sum(b.max_spend or 0 for b in budgets) == pytest.approx(1.0)
    assert [b.max_images for b in budgets] == [b.max_images for b in split_budgets(options.budgets, shares)]
    for p in parameters:
        flat = RunOptions.model_validate(p["options"]).flat()
        assert {k: v for k, v in flat.items() if k not in ("max_images", "max_spend")} == {
            k: v for k, v in values.items() if k not in ("max_images", "max_spend")
        }
        assert set(p) == {"manifest", "out", "options", "role"}


def test_a_sharded_runs_budgets_add_up_to_the_whole_and_follow_the_requests_to_send() -> None:
    budgets = Budgets(max_images=10, max_spend=1.0)
    assert [b.max_images for b in split_budgets(budgets, [20, 20])] == [5, 5]
    assert [b.max_images for b in split_budgets(budgets, [3, 3, 3])] == [4, 3, 3]
    assert [b.max_images for b in split_budgets(budgets, [0, 7])] == [0, 10]  # all of it where work is
    assert sum(b.max_spend or 0 for b in split_budgets(budgets, [1, 2, 4])) <= 1.0
    assert split_budgets(Budgets(), [1, 2]) == [Budgets(), Budgets()]


def test_the_flows_form_has_the_options_with_their_descriptions_and_no_internal_field() -> None:
    from imagebatch.flows.batch import generate_from_manifest

    schema = generate_from_manifest.parameters.model_dump_for_openapi()
    assert set(schema["properties"]) == {"manifest", "out", "options"}  # no role: a shard's number is ours
    definitions = schema["definitions"]
    described = {
        n for d in definitions.values() for n, f in d.get("properties", {}).items() if f.get("description")
    }
    assert set(fields()) <= described
    assert "shard_deployment" not in str(schema) and "'shard'" not in str(schema)
    assert len(generate_from_manifest.parameters.properties) <= 6


def test_a_deployment_of_the_earlier_shape_is_read_as_the_model() -> None:
    """Flat parameters (every option a parameter of its own, as deployments were made before the model)
    become the model's fields of those names; a name the model has not is refused with what to do."""
    from prefect.exceptions import ParameterTypeError
    from prefect.utilities.callables import get_call_parameters, parameters_to_args_kwargs

    from imagebatch.flows.batch import generate_from_manifest

    flat = every_other() | {"shard": 1, "shard_deployment": "generate_from_manifest/x-shards"}
    # As Prefect's engine takes a deployment's run: bound to the function's signature, then validated.
    args, kwargs = parameters_to_args_kwargs(
        generate_from_manifest.fn, {"manifest": "m.csv", "out": "/o", **flat}
    )
    validated = generate_from_manifest.validate_parameters(
        get_call_parameters(generate_from_manifest.fn, args, kwargs)
    )
    assert set(validated) == {"manifest", "out", "options", "role"}
    assert validated["options"] == RunOptions.from_flat(**{k: v for k, v in flat.items() if k in OWNER})
    assert validated["role"] == ShardRole(shard=1, shard_deployment="generate_from_manifest/x-shards")
    with pytest.raises(ParameterTypeError, match="redeploy it"):
        generate_from_manifest.validate_parameters({"manifest": "m.csv", "out": "/o", "colour": "red"})


def test_the_environment_default_is_read_through_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from imagebatch.options import environment_value

    monkeypatch.setenv("IMAGEBATCH_BASE_URL", "https://gateway.example")
    monkeypatch.setenv("IMAGEBATCH_PRICES", "/srv/prices.toml")
    assert environment_value("base_url") == "https://gateway.example"
    assert environment_value("prices") == "/srv/prices.toml"
    assert environment_value("concurrency") is None
    assert "$IMAGEBATCH_BASE_URL" in (fields()["base_url"].description or "")
