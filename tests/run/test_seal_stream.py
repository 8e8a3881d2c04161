"""The seal is streamed (`run.settled`): written as JSON Lines from paths spooled to disk, read back a chunk
of paths at a time, so a rerun settled from it holds a bounded share of memory however many files its
records name; a seal of an older format, torn, truncated, with a wrong count of paths or a path that is not
a string is never trusted (the rerun settles in full and leaves a new seal)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.memory import traced_peak
from helpers.runs import write_csv

from imagebatch.manifest import load_manifest
from imagebatch.manifest.plan import plan
from imagebatch.options import RunOptions
from imagebatch.run.nothing_to_send import settle_without_prefect
from imagebatch.run.preflight import preflight
from imagebatch.run.settled import SEAL_FORMAT
from imagebatch.storage import layout
from imagebatch.work.request_record import file_stem

OPTIONS = RunOptions.from_flat(report=False, base_url="http://127.0.0.1:9")
"""Nothing is sent: every request of these folders is finished."""
STARTED = "2026-11-29T09:07:39.636855+00:00"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IMAGEBATCH_API_KEY", "test-key")


def _finished(tmp_path: Path, rows: int) -> tuple[Path, Path]:
    """A manifest of `rows` rows and an output folder in which each of its requests succeeded, journaled
    as a run journals it, its image a hard link of one file (a rerun only looks it up)."""
    manifest = write_csv(tmp_path / "m.csv", ({"id": f"item-{i}", "prompt": f"a cup, angle {i}"}
                                              for i in range(rows)))  # fmt: skip
    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    image = out / "images" / ".one.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    with (out / layout.jsonl(layout.JOURNAL)).open("w") as journal:
        for req in plan(load_manifest(manifest).jobs):
            key, path = req.idempotency_key, f"images/{file_stem(req, False)}.png"
            ids = {"idempotency_key": key, "job_id": req.job_id, "request_index": req.request_index,
                   "turn_index": req.turn_index, "variant": 1, "route": req.route, "model": req.model,
                   "attempt": 1, "started_at": STARTED}  # fmt: skip
            record = {"job_id": req.job_id, "request_index": req.request_index, "turn_index": 0,
                      "status": "succeeded", "model": req.model, "route": req.route, "idempotency_key": key,
                      "paths": [path], "images": 1, "width": 1024, "height": 1024, "mime_type": "image/png",
                      "attempts": 1, "finish_reason": "STOP", "error": None, "request_id": "req_" + key[4:36],
                      "http_status": None, "variant": 1}  # fmt: skip
            finished = {"duration_s": 1.0, "outcome": "ok", "error_code": None, "images": 1,
                        "request_id": "req_" + key[4:36], "retry_in": None}  # fmt: skip
            lines = [{"event": "attempt_started", **ids}, {"event": "attempt_finished", **ids, **finished},
                     {"event": "answered", **record}, {"event": "outcome", **record}]  # fmt: skip
            for line in lines:
                journal.write(json.dumps(line) + "\n")
            (out / path).parent.mkdir(exist_ok=True)
            os.link(image, out / path)
    return manifest, out


def _settle(manifest: Path, out: Path) -> dict[str, Any]:
    info = settle_without_prefect(preflight(manifest, out, OPTIONS), OPTIONS)
    assert info is not None and info["counts"]["skipped"] == info["requests"]
    return info


def _written(out: Path) -> tuple[int, int]:
    """results.csv's inode and modification time: a rerun settled in full writes it anew."""
    st = (out / layout.RESULTS_CSV).stat()
    return st.st_ino, st.st_mtime_ns


def _seal(out: Path) -> list[bytes]:
    return (out / layout.SETTLED).read_bytes().splitlines(keepends=True)


def _is_current_seal(out: Path, paths: int) -> bool:
    header, *lines = _seal(out)
    settled = json.loads(header)
    return settled["settled_on"]["format"] == SEAL_FORMAT and settled["paths"] == paths == len(lines)


def test_a_rerun_settled_from_a_seal_of_15000_paths_holds_a_bounded_share_of_memory(tmp_path: Path) -> None:
    manifest, out = _finished(tmp_path, 15_000)
    _settle(manifest, out)  # in full: leaves the seal
    checked, written = preflight(manifest, out, OPTIONS), _written(out)
    info, peak = traced_peak(lambda: settle_without_prefect(checked, OPTIONS), 3 * 2**20)
    assert info is not None and info["counts"]["skipped"] == 15_000
    assert _written(out) == written  # settled from the seal: every path of it was looked up
    # Flat: 1.8 MiB here with a seal of 5,000 paths or of 30,000. The 15,000 paths held at once would be
    # about 2 MiB more (their strings, their list, the seal's bytes read whole).
    assert peak < 3 * 2**20, f"the rerun settled from the seal peaked at {peak / 2**20:.1f} MiB"
    assert _is_current_seal(out, 15_000)


def _old_format(out: Path) -> None:
    """The seal as the format before this one wrote it: one JSON object, every path in one list."""
    header, *lines = _seal(out)
    old = json.loads(header)
    old["settled_on"]["format"] = SEAL_FORMAT - 1
    old["paths"] = [json.loads(line) for line in lines]
    (out / layout.SETTLED).write_text(json.dumps(old))


def _torn(out: Path) -> None:
    (out / layout.SETTLED).write_bytes(b"".join(_seal(out))[:-9])  # the last path cut short


def _truncated(out: Path) -> None:
    (out / layout.SETTLED).write_bytes(b"".join(_seal(out)[:-1]))  # the last path's line gone whole


def _count(change: int) -> Callable[[Path], None]:
    def counted(out: Path) -> None:
        header, *lines = _seal(out)
        settled = json.loads(header)
        settled["paths"] += change
        (out / layout.SETTLED).write_bytes(json.dumps(settled).encode() + b"\n" + b"".join(lines))

    return counted


def _not_a_string(path: bytes) -> Callable[[Path], None]:
    def replaced(out: Path) -> None:
        header, _, *rest = _seal(out)
        (out / layout.SETTLED).write_bytes(b"".join([header, path + b"\n", *rest]))

    return replaced


@pytest.mark.parametrize(
    "change",
    [_old_format, _torn, _truncated, _count(1), _count(-1), _not_a_string(b"7"), _not_a_string(b"null"),
     _not_a_string(b'["images/x.png"]'), lambda out: (out / layout.SETTLED).write_bytes(b"{\n")],
    ids=["an older format", "torn", "truncated", "a path more counted", "a path fewer counted", "a number",
         "null", "a list", "a header that is not JSON"],
)  # fmt: skip
def test_a_seal_that_does_not_hold_whole_is_not_trusted_and_a_new_one_is_left(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    manifest, out = _finished(tmp_path, 3)
    full = _settle(manifest, out)
    change(out)
    written = _written(out)
    again = _settle(manifest, out)  # in full
    assert _written(out) != written and again["counts"] == full["counts"]
    assert _is_current_seal(out, 3)  # left anew
    written = _written(out)
    _settle(manifest, out)
    assert _written(out) == written  # and trusted by the next rerun
