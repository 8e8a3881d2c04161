"""`EarlierShapeFlow`: a flow that still runs for a deployment whose runs give each option as a parameter of
its own (`concurrency=8`, `format="jpeg"`), as an earlier imagebatch made them, where the flow takes its
options as one model (`options`). Those parameters are read into the model, while the flow's form (its
parameter schema) shows only the parameters the flow declares.

Prefect's engine binds a deployment run's stored parameters to the flow function's signature before the
flow validates them (`prefect.flow_engine`, as a worker runs a flow run), so the signature the engine reads
gains one keyword-only parameter per earlier name, default None and hidden from the form
(`SkipJsonSchema`); the flow's validation then reads the given ones into its declared parameters (`fold`)
and hands its function those alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Flow
from prefect.exceptions import ParameterTypeError
from pydantic import ValidationError
from pydantic.json_schema import SkipJsonSchema

from imagebatch.delivery.options import ExportOptions
from imagebatch.options import OWNER, RunOptions, ShardRole
from imagebatch.run.constants import EXPORT_FLOW_NAME

P = ParamSpec("P")
R = TypeVar("R")

Fold = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
"""Reads (declared parameters, earlier parameters given) into the declared parameters alone."""


class EarlierShapeFlow(Flow[P, R]):
    """A flow that also runs with the flat parameters of an earlier deployment (`earlier`, read into its
    declared ones by `fold`); a parameter it neither declares nor reads fails the run in one line."""

    def __init__(self, fn: Callable[P, R], *, earlier: frozenset[str], fold: Fold, **options: Any) -> None:
        super().__init__(fn, **options)  # the form: from the declared parameters alone
        self.earlier_parameters = earlier
        """The parameters an earlier deployment gives, which every run still reads."""
        self.declared = frozenset(inspect.signature(fn).parameters) - earlier
        self.fold = fold
        _accept(fn, earlier)

    def validate_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        declared = {k: v for k, v in parameters.items() if k in self.declared}
        given = {k: v for k, v in parameters.items() if k not in self.declared and v is not None}
        validated = super().validate_parameters(self.fold(declared, given) if given else declared)
        return {k: v for k, v in validated.items() if k in self.declared}

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """As Prefect's, without the earlier parameters that were not given (a flow called directly binds
        each of them, at its default None)."""
        unset = {k for k, v in parameters.items() if k in self.earlier_parameters and v is None}
        return super().serialize_parameters({k: v for k, v in parameters.items() if k not in unset})

    def with_options(self, **changes: Any) -> EarlierShapeFlow[P, R]:
        """A copy with Prefect's options changed that still reads the earlier parameters (Prefect's own
        copy is a plain `Flow`)."""
        copy = super().with_options(**changes)
        vars(copy).update(earlier_parameters=self.earlier_parameters, declared=self.declared, fold=self.fold)
        copy.__class__ = type(self)
        return copy  # type: ignore[return-value]  # its class is this one's, set above


def _accept(fn: Callable[..., Any], earlier: frozenset[str]) -> None:
    """Let Prefect's engine bind the earlier parameters to `fn`: its signature gains each that it lacks, a
    keyword-only parameter at None, hidden from the form. The signature set carries its annotations
    resolved (`eval_str`): Prefect reads a set signature's annotations as they are, never resolving a
    string (`from __future__ import annotations`) in the function's module."""
    signature, hide = inspect.signature(fn, eval_str=True), SkipJsonSchema[Any]  # type: ignore[misc]  # pydantic's marker
    hidden = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hide)
        for name in sorted(earlier - set(signature.parameters))
    ]
    fn.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *hidden])  # type: ignore[attr-defined]


EARLIER_RUN = frozenset(OWNER) | frozenset(ShardRole.model_fields)
"""The batch flow's earlier parameters: each option of a run, a shard's number and its deployment."""


def run_options_of(declared: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The batch flow's `fold`: the options given alone become the model's fields of those names
    (`options`), a shard's number and deployment its `role`; a name the model has not is refused, saying
    to redeploy."""
    flat = dict(given)
    role = {k: flat.pop(k) for k in list(flat) if k in ShardRole.model_fields}
    try:
        options = RunOptions.from_flat(**flat)
    except (ValueError, ValidationError) as exc:
        raise ParameterTypeError(f"{exc}; redeploy it with this imagebatch (`imagebatch deploy`)") from None
    return declared | {"options": options, "role": ShardRole(**role)}


EARLIER_EXPORT = frozenset(ExportOptions.model_fields)
"""The export flow's earlier parameters: each option of an export."""


def export_options_of(declared: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The export flow's `fold`: the options given alone (`format="jpeg"`) read into `options`, over the
    fields it gives itself; ValueError in one line for a name that is neither a parameter nor an option."""
    if unknown := sorted(set(given) - EARLIER_EXPORT):
        raise ValueError(f"{EXPORT_FLOW_NAME}: no parameter or option named {', '.join(unknown)}")
    options = declared.get("options") or {}
    fields = options.model_dump() if isinstance(options, ExportOptions) else dict(options)
    return declared | {"options": fields | given}
