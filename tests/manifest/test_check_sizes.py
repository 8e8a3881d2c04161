"""Whose size limit a reference image breaks: the service's 50 MB on the images route, imagebatch's own
guard on the native route (the spec gives no limit for inline images there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.manifests import assert_fields, csv_problems, json_problems

from imagebatch.gateway.constants import MAX_UPLOAD_BYTES
from imagebatch.manifest import MAX_NATIVE_IMAGE_BYTES
from imagebatch.manifest.check import size_fault

# --- M2: the 50 MB limit is the service's on the images route, imagebatch's own on the native route -----

SIZE_CASES: list[tuple[str, str, dict[str, Any], dict[str, str]]] = [
    # (case, format, fields, {field: text in message})
    (
        "native reference",
        "csv",
        {"reference_images": "images/big.png"},
        {"reference_images": "imagebatch's own guard: the spec gives no limit for inline images there"},
    ),
    (
        "native by model",
        "csv",
        {"model": "native-image-pro", "reference_images": "images/ref.png;images/big.png"},
        {"reference_images": "on the native route (imagebatch's own guard"},
    ),
    (
        "images reference",
        "csv",
        {"route": "images", "reference_images": "images/big.png"},
        {"reference_images": "on the images route (the service's limit)"},
    ),
    (
        "images mask",
        "csv",
        {"route": "images", "reference_images": "images/ref.png", "mask": "images/big.png"},
        {"mask": "on the images route (the service's limit)"},
    ),
    (
        "turn reference",
        "json",
        {"turns": [{"prompt": "x", "reference_images": ["images/big.png"]}]},
        {"turns[0].reference_images": "imagebatch's own guard"},
    ),
    (
        "route unknown",
        "csv",
        {"route": "video", "reference_images": "images/big.png"},
        {
            "route": "unknown route",
            "reference_images": "the service's limit on the images route, imagebatch's own guard",
        },
    ),
]


@pytest.mark.parametrize(
    ("fmt", "row", "expected"), [c[1:] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES]
)
def test_size_message_names_whose_limit_it_is(
    folder: Path, fmt: str, row: dict[str, Any], expected: dict[str, str]
) -> None:
    problems = csv_problems(folder, row) if fmt == "csv" else json_problems(folder, row)
    assert_fields(problems, expected)
    for problem in problems:
        if problem.field != "route":
            assert "must be under 50,000,000 bytes" in problem.message
            assert problem.hint == "downscale or recompress it"
    native = [p for p in problems if "native route (" in p.message]
    assert all("service" not in p.message for p in native)


@pytest.mark.parametrize(
    ("size", "route", "refused"),
    [
        (MAX_UPLOAD_BYTES - 1, "images", False),
        (MAX_UPLOAD_BYTES, "images", True),
        (MAX_NATIVE_IMAGE_BYTES - 1, "native", False),
        (MAX_NATIVE_IMAGE_BYTES, "native", True),
        (MAX_UPLOAD_BYTES, None, True),
        (None, "native", False),
        (10, None, False),
    ],
)
def test_size_fault(size: int | None, route: str | None, refused: bool) -> None:
    assert (size_fault(size, route) is not None) == refused
