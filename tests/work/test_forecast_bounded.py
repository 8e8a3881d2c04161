"""What `validate --out` and `validate --prices` keep while they go over a plan: the estimate counted in one
pass of a stream, and the journal's last key of each request kept past memory's share in a file."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.runs import write_jsonl

from imagebatch.manifest import load_manifest, plan
from imagebatch.work.forecast import LastKeys
from imagebatch.work.prices import Estimate, PriceTable, estimate, estimate_lines

JOBS = [
    {"id": "a", "prompt": "a red cup", "model": "native-image-2.1", "count": 3},
    {"id": "b", "prompt": "a blue cup", "model": "compat-image-2"},
    {"id": "c", "prompt": "a green cup", "model": "native-image-pro", "image_size": "4K"},
]


def test_estimate_goes_over_a_stream_once_and_counts_what_a_list_does(tmp_path: Path) -> None:
    requests = list(plan(load_manifest(write_jsonl(tmp_path / "m.jsonl", JOBS))))
    table = PriceTable(images={"native-image-2.1": 0.04, "native-image-pro": {"1K": 0.13, "4K": 0.24}})
    stream = iter(requests)

    lines = estimate_lines(stream, table)

    assert next(stream, None) is None  # consumed, and in one pass: a second one would have found nothing
    assert lines == [
        "  compat-image-2           0.00",
        "  native-image-2.1         0.12",
        "  native-image-pro         0.24",
        "  total                    0.36",
        "  no price for compat-image-2: counted as 0",
    ]
    assert estimate(iter(requests), table) == {
        "compat-image-2": 0.0,
        "native-image-2.1": pytest.approx(0.12),
        "native-image-pro": 0.24,
    }
    added = Estimate(table)
    for req in requests:
        added.add(req)
    assert added.lines() == lines


def test_last_keys_keeps_the_journals_last_key_of_each_request_past_its_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LastKeys, "BUFFER", 4)
    keys = LastKeys()
    for i in range(10):
        keys.note({"job_id": f"job-{i}", "request_index": 0, "turn_index": 0, "idempotency_key": f"k{i}"})
    keys.note({"job_id": "job-1", "request_index": 0, "turn_index": 0, "idempotency_key": "k1-edited"})
    keys.note({"job_id": "job-9", "request_index": 0, "turn_index": 0, "idempotency_key": "k9-edited"})
    for i in range(10, 14):  # job-1's and job-9's edits leave memory for the file with these
        keys.note({"job_id": f"job-{i}", "request_index": 0, "turn_index": 0, "idempotency_key": f"k{i}"})

    assert keys.get("job-0", 0, 0) == "k0"  # written to the file with the first buffer
    assert keys.get("job-1", 0, 0) == "k1-edited"  # the file's row overwritten by the later event
    assert keys.get("job-9", 0, 0) == "k9-edited"
    assert keys.get("job-13", 0, 0) == "k13"
    assert keys.get("job-1", 1, 0) is None and keys.get("job-1", 0, 1) is None
    assert keys.get("job-", 10, 0) is None  # no two requests share a name ("job-1", 0 is not "job-", 10)
