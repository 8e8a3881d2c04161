"""From a planned request to one on the wire (`work.build`): an input file that changed after the
manifest was checked fails its request (or its chain's turn) and nothing is sent.

The service is the shared fake (tests/helpers/units.py: the `h` fixture, tests/work/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest
from helpers.images import png
from helpers.units import (
    Harness,
)

from imagebatch.manifest.files import READ_LIMIT
from imagebatch.work.context import RunContext, Unit
from imagebatch.work.store import RequestRecord
from imagebatch.work.unit import run_unit


def with_reference(h: Harness) -> Path:
    """A PNG reference image, ref.png, next to the manifest."""
    ref = h.tmp / "ref.png"
    ref.write_bytes(png(16, 16, (1, 2, 3)))
    return ref


def settle_in_thread(ctx: RunContext, unit: Unit) -> list[RequestRecord]:
    """`run_unit`, failing (not hanging) if it does not return within a minute."""
    out: list[list[RequestRecord]] = []
    thread = threading.Thread(target=lambda: out.append(run_unit(ctx, unit)), daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "run_unit hangs on the input file"
    return out[0]


def replace_with(ref: Path, kind: str) -> None:
    ref.unlink()
    if kind == "folder":
        ref.mkdir()
    elif kind == "fifo":
        os.mkfifo(ref)
    else:  # grown past the most any route takes (sparse: no disk space)
        with open(ref, "wb") as fh:
            fh.truncate(READ_LIMIT)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("folder", "is a folder"),
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("grown", f"the file is {READ_LIMIT:,} bytes"),
    ],
)
def test_an_input_that_is_no_longer_a_regular_file_fails_that_request_and_sends_nothing(
    h: Harness, kind: str, why: str
) -> None:
    ref = with_reference(h)
    unit = h.unit({"id": "a", "prompt": "edit", "reference_images": ["ref.png"]})
    replace_with(ref, kind)
    try:
        (rec,) = settle_in_thread(h.context(), unit)
    finally:
        if kind == "fifo":  # release a reader stuck on it (the bug), if any
            with contextlib.suppress(OSError):
                os.close(os.open(ref, os.O_WRONLY | os.O_NONBLOCK))
    assert rec.status == "failed"
    assert f"{ref.resolve()} changed after the manifest was checked ({why}" in (rec.error or "")
    assert h.service.count == 0 and h.events() == []


def test_a_turns_input_that_changed_fails_that_turn_and_stops_the_chain(h: Harness) -> None:
    ref = with_reference(h)
    unit = h.unit(
        {"id": "c", "prompt": "p", "turns": ["t1", {"prompt": "t2", "reference_images": ["ref.png"]}]}
    )
    replace_with(ref, "folder")
    out = run_unit(h.context(), unit)
    assert [r.status for r in out] == ["succeeded", "succeeded", "failed"]
    assert "is a folder" in (out[2].error or "")
    assert h.service.count == 2
