"""A job's route and model, checked against each other (the service's rule is `gateway.constants.serves`):
the default model of each route, the route an image model implies, and a message with a hint for every
way a pair can be wrong. Apart from the checker (`manifest.check`) because it is the one place to change
when a route or model is added (docs/architecture.md, "Where to add").
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable

from pydantic_core import PydanticCustomError

from imagebatch.gateway.compat_models import check_text_model
from imagebatch.gateway.constants import (
    ASPECT_RATIOS,
    COMPAT_IMAGE_MODEL,
    DEFAULT_NATIVE_MODEL,
    IMAGE_MODELS,
    NATIVE_MODELS,
    serves,
)

from .models import MANIFEST_ROUTES, wire_route

Add = Callable[..., None]
"""Records one problem of the row: `add(field, message, hint=None)`."""


def ratio_hint(model: str, ratio: str) -> str | None:
    """A hint for an aspect ratio `model` does not support: the spelling meant, or the models that do."""
    supported = ASPECT_RATIOS[model]
    guess = re.sub("\\s*[xX/:\u00d7]\\s*", ":", ratio.strip())
    if guess != ratio and guess in supported:
        return f"did you mean {guess!r}?"
    others = [m for m, ratios in ASPECT_RATIOS.items() if ratio in ratios]
    if others:
        return f"{ratio} is supported by {' and '.join(others)}"
    return None


@functools.lru_cache(maxsize=1024)  # a catalog names a few (route, model) pairs on 100,000 rows
def route_serves(route: str, model: str | None) -> bool:
    """Whether the manifest route `route` serves `model`: the service's rule (`gateway.constants.serves`);
    False for a route that is not one (reported by `resolve`)."""
    return route in MANIFEST_ROUTES and serves(wire_route(route), model)


def _model_hint(model: str, candidates: tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(model, candidates, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def resolve(route: str | None, model: str | None, add: Add) -> tuple[str | None, str | None]:
    """The job's route and model, checked against each other; None for whichever is at fault."""
    if route is not None and route not in MANIFEST_ROUTES:
        _unknown_route(route, add)
        return None, None
    if model is None:
        if route in ("messages", "responses"):
            add(
                "model", f"model is required on the {route} route: a text model ID from the service's catalog"
            )
            return route, None
        # The images routes serve one model; everything else defaults to the newest native model.
        model = COMPAT_IMAGE_MODEL if route == "images" else DEFAULT_NATIVE_MODEL
    if route is None:
        return _implied_route(model, add), model
    if route_serves(route, model):
        return route, model
    if route in ("native", "chat"):
        _not_native(route, model, add)
        return route, None
    if route == "images":
        _not_images(model, add)
        return route, None
    if route in ("messages", "responses"):
        try:
            check_text_model(model)
        except PydanticCustomError as exc:
            add("model", f"{exc.message()}; the {route} route relays text models", "use a text model ID")
            return route, None
    return route, model


def _unknown_route(route: str, add: Add) -> None:
    lowered = route.strip().lower()
    hint = None
    if lowered in MANIFEST_ROUTES:
        hint = f"did you mean {lowered!r}?"
    elif lowered.startswith("images"):
        hint = "use 'images': generations or edits follow from reference_images"
    add("route", f"unknown route {route!r}; routes are {', '.join(MANIFEST_ROUTES)}", hint)


def _implied_route(model: str, add: Add) -> str | None:
    """The route an image model implies (a job that names no route); None, reported, for any other."""
    for implied in ("native", "images"):
        if route_serves(implied, model):
            return implied
    hint = _model_hint(model, IMAGE_MODELS)
    if hint:
        add("model", f"unknown model {model!r}; image models are {', '.join(IMAGE_MODELS)}", hint)
    else:
        add(
            "route",
            f"route is required: model {model!r} is not an image model, so no route follows from it",
            "set route to messages or responses for a text model",
        )
    return None


def _not_native(route: str, model: str, add: Add) -> None:
    if model == COMPAT_IMAGE_MODEL:
        add(
            "model", f"{model} is served on the images route, not on the {route} route", "set route to images"
        )
    else:
        add(
            "model",
            f"unknown model {model!r} for the {route} route; models: {', '.join(NATIVE_MODELS)}",
            _model_hint(model, NATIVE_MODELS),
        )


def _not_images(model: str, add: Add) -> None:
    if model in NATIVE_MODELS:
        add(
            "model",
            f"{model} is not served on the images route (the service answers unsupported_endpoint)",
            f"use route native or chat, or model {COMPAT_IMAGE_MODEL}",
        )
    else:
        add(
            "model",
            f"unknown model {model!r} for the images route; it serves {COMPAT_IMAGE_MODEL}",
            _model_hint(model, (COMPAT_IMAGE_MODEL,)),
        )
