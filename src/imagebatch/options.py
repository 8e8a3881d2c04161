"""One typed model of a run's options (`RunOptions`): the flow's parameter, the command line's flags,
deployments, the settled rerun and each shard's parameters are all read from it, so that an option is
declared once, with its type, default, bounds and help (each field's description, shown by Prefect's UI).

A field's name is unique across the groups, so `RunOptions.from_flat` and `RunOptions.flat` speak of
options by name alone (the command line's flags, run.json, a deployment whose runs give each option alone).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

from imagebatch.gateway.constants import ENV_API_KEY, ENV_BASE_URL, ENV_PRICES
from imagebatch.work.redo import REDO_KINDS, redo_kinds

MAX_CONCURRENCY = 256
DEFAULT_CONCURRENCY = 4
START_TIMEOUT = 60.0
"""Seconds a shard may wait for a worker before the parent, its own shard done, runs it itself."""


COMMANDS = frozenset({"run", "deploy", "serve"})


@dataclass(frozen=True)
class Cli:
    """How a field appears on the command line, beside its name, type and description: `flag` when it is
    not the field's name in kebab case, `metavar`, the `env` variable it falls back to (read through
    `environment_value`), and the commands that take it."""

    flag: str | None = None
    metavar: str | None = None
    env: str | None = None
    commands: frozenset[str] = COMMANDS


RUN_ONLY = Cli(commands=frozenset({"run"}))
"""Decided by a person at a terminal: no one is there to decide it for a scheduled run."""
DEPLOY_ONLY = frozenset({"deploy"})


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Service(Group):
    """The image service a run sends to; its key is never an option."""

    base_url: Annotated[str | None, Cli(env=ENV_BASE_URL, metavar="URL")] = Field(
        default=None,
        description=f"The service's root URL, or `embedded` for the emulator. Default: ${ENV_BASE_URL} where "
        "the run runs; with neither, a run on a terminal uses the embedded emulator and a deployment's "
        "run is refused.",
    )
    api_key_secret_block: Annotated[str | None, Cli(flag="--api-key-block", metavar="NAME")] = Field(
        default=None,
        description=f"The name of a Prefect Secret block holding the API key. Default: ${ENV_API_KEY} in the "
        "environment where the run runs.",
    )


class Pacing(Group):
    """How fast a run sends: requests in flight, their pacing and the account-wide limit."""

    concurrency: Annotated[int, Cli(metavar="N")] = Field(
        default=DEFAULT_CONCURRENCY,
        ge=1,
        le=MAX_CONCURRENCY,
        description=f"Requests in flight at once, 1 to {MAX_CONCURRENCY}.",
    )
    adaptive: bool = Field(
        default=True,
        description="Start with a few requests in flight and adapt to the service's HTTP 429s, never above "
        "the concurrency; off: open that many at once.",
    )
    rpm: Annotated[int | None, Cli(metavar="N")] = Field(
        default=None,
        ge=1,
        description="Space request starts to at most this many a minute. Default: no pacing.",
    )
    global_limit: Annotated[str | None, Cli(metavar="NAME")] = Field(
        default=None,
        description="A Prefect global concurrency limit each request holds while on the wire, shared by "
        "every run and machine (`imagebatch limits`; needs a Prefect server).",
    )


class Budgets(Group):
    """What a run may spend. A sharded run's budget is the whole run's: the parent splits it between the
    shards by their share of the requests to send, so the shards together never pass it."""

    max_images: Annotated[int | None, Cli(metavar="N")] = Field(
        default=None,
        ge=0,
        description="Stop before a request that could take the run past N images (the rest wait for a "
        "rerun). A sharded run's N is the whole run's, split between its shards by their share of the "
        "requests to send.",
    )
    max_spend: Annotated[float | None, Cli(metavar="AMOUNT")] = Field(
        default=None,
        ge=0,
        description="Stop before a request that could take the run's estimated spend past AMOUNT (needs "
        "prices). A sharded run's AMOUNT is the whole run's, split as max_images is.",
    )
    prices: Annotated[str | None, Cli(env=ENV_PRICES, metavar="FILE")] = Field(
        default=None,
        description=f"A price table (TOML or JSON). Default: ${ENV_PRICES}; with neither, no estimate.",
    )


class Resend(Group):
    """What a run sends again of what earlier runs into its output did."""

    force: Annotated[bool, RUN_ONLY] = Field(
        default=False, description="Regenerate even what is already done."
    )
    retry_unknown: Annotated[bool, RUN_ONLY] = Field(
        default=False,
        description="Resend requests whose outcome is unknown (check your usage history first).",
    )
    redo: Annotated[str | None, Cli(metavar="KINDS")] = Field(
        default=None,
        description=f"Send a new variant of each request whose newest variant is of these kinds "
        f"({', '.join(REDO_KINDS)}, comma separated: rejected by a reviewer, answered without an image, "
        "failed), and nothing else new; earlier variants stay.",
    )

    @field_validator("redo")
    @classmethod
    def _known_kinds(cls, value: str | None) -> str | None:
        redo_kinds(value)  # a ValueError naming the kind it does not know
        return value

    edit: bool = Field(
        default=False,
        description="With redo: make each variant as an edit of the rejected image with the reviewer's "
        "note (native route, where its conversation was kept; else a new sample, counted).",
    )


class Inputs(Group):
    """Where a manifest's reference images and masks may come from."""

    files_root: Annotated[list[str] | None, Cli(metavar="DIR")] = Field(
        default=None,
        description="Folders (or an object store's prefixes, s3://bucket/refs) reference images and masks "
        "may also come from, besides the manifest's folder or prefix (the manual's Security page, "
        "'Files root').",
    )


class Outcome(Group):
    """How a run ends: its report and what it may leave not done."""

    report: bool = Field(
        default=True,
        description="Make thumbnails and report.html (about 15 ms of CPU an image; off: `imagebatch "
        "report OUT` makes them later).",
    )
    allow_failures: Annotated[str | None, Cli(metavar="N|P%")] = Field(
        default=None,
        description="End Completed (exit 0) with up to N requests (or P% of them) not done, unless the run "
        "was stopped early. Default: none.",
    )


SHARDED = Cli(commands=DEPLOY_ONLY, metavar="N")


class Sharding(Group):
    """Many machines: a run split into shards, each a run on a work pool's workers."""

    shards: Annotated[int, SHARDED] = Field(
        default=1,
        ge=1,
        description="Split each run into N runs on the pool's workers (`imagebatch deploy --shards N` makes "
        "the second deployment, NAME-shards, they run as).",
    )
    shard_start_timeout: Annotated[float, Cli(commands=DEPLOY_ONLY, metavar="SECONDS")] = Field(
        default=START_TIMEOUT,
        ge=0,
        description="A shard no worker has started within SECONDS is run by the parent's process once its "
        "own shard is done.",
    )


class RunOptions(Group):
    """Everything a run can be asked, grouped; the manifest and the output location are not options."""

    service: Service = Service()
    pacing: Pacing = Pacing()
    budgets: Budgets = Budgets()
    resend: Resend = Resend()
    inputs: Inputs = Inputs()
    outcome: Outcome = Outcome()
    sharding: Sharding = Sharding()

    @classmethod
    def from_flat(cls, **values: Any) -> RunOptions:
        """The options from fields named alone (`concurrency=8`); a name no group has is refused."""
        groups: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            if name not in OWNER:
                raise ValueError(f"{name!r} is not an option of a run")
            groups.setdefault(OWNER[name], {})[name] = value
        return cls.model_validate(groups)

    def flat(self) -> dict[str, Any]:
        """Every field by its name alone, as run.json records them."""
        return {name: getattr(getattr(self, group), name) for name, group in OWNER.items()}

    def with_flat(self, **values: Any) -> RunOptions:
        """A copy with these fields (named alone) changed, validated."""
        return RunOptions.from_flat(**(self.flat() | values))


class ShardRole(Group):
    """A run's part in a sharded run, set by imagebatch itself, never in the form a person fills: the
    parent names the deployment its shards run as (`imagebatch deploy --shards`), and gives each shard its
    number."""

    shard_deployment: str | None = None
    shard: int | None = None


def _groups() -> dict[str, type[Group]]:
    return {name: info.annotation for name, info in RunOptions.model_fields.items()}  # type: ignore[misc]


OWNER: dict[str, str] = {field: group for group, model in _groups().items() for field in model.model_fields}
"""Each field's group, by the field's name."""


def fields() -> dict[str, FieldInfo]:
    """Every field of every group, by its name."""
    return {name: _groups()[group].model_fields[name] for name, group in OWNER.items()}


def cli_of(info: FieldInfo) -> Cli:
    return next((m for m in info.metadata if isinstance(m, Cli)), Cli())


def flag_of(name: str) -> str:
    """The command line's flag of a field: `--max-images` for `max_images`."""
    return cli_of(fields()[name]).flag or "--" + name.replace("_", "-")


def environment_value(name: str) -> str | None:
    """The value the environment gives a field that falls back to a variable (`base_url`: `$IMAGEBATCH_
    BASE_URL`), else None."""
    env = cli_of(fields()[name]).env
    return (os.environ.get(env) or None) if env else None


def problem(exc: ValidationError) -> str:
    """A validation error of the options as one line naming the flag, its value and the rule."""
    error = exc.errors()[0]
    name = next((str(part) for part in reversed(error["loc"]) if str(part) in OWNER), None)
    if name is None:
        return f"options: {error['msg']}"
    info, value = fields()[name], error.get("input")
    bounds = {
        k: getattr(m, k) for m in info.metadata for k in ("ge", "le") if getattr(m, k, None) is not None
    }
    if "ge" in bounds and "le" in bounds:
        return f"{flag_of(name)} must be from {bounds['ge']} to {bounds['le']}, not {value}"
    if "ge" in bounds and error["type"] == "greater_than_equal":
        least = "0 or more" if bounds["ge"] == 0 else f"at least {bounds['ge']}"
        return f"{flag_of(name)} must be {least}, not {value}"
    return f"{flag_of(name)} {value!r}: {error['msg']}"


def split_budgets(budgets: Budgets, weights: list[int]) -> list[Budgets]:
    """A sharded run's budgets split between its shards in proportion to `weights` (their requests to
    send), so that the parts add up to the whole and no more: images by largest remainder, spend pro rata.
    The same weights give the same split on every machine."""
    if not any(weights):
        weights = [1] * len(weights)  # nothing to send: any split bounds nothing
    total = sum(weights)
    images: list[int | None] = [None] * len(weights)
    if budgets.max_images is not None:
        whole = budgets.max_images
        parts = [whole * w // total for w in weights]
        by_remainder = sorted(range(len(weights)), key=lambda i: (-(whole * weights[i] % total), i))
        for i in by_remainder[: whole - sum(parts)]:
            parts[i] += 1
        images = list(parts)
    spend: list[float | None] = [None] * len(weights)
    if budgets.max_spend is not None:
        spend = [budgets.max_spend * w / total for w in weights[:-1]]
        spend.append(max(0.0, budgets.max_spend - sum(s or 0.0 for s in spend)))
    return [
        budgets.model_copy(update={"max_images": n, "max_spend": x})
        for n, x in zip(images, spend, strict=True)
    ]
