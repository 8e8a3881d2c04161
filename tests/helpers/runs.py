"""Small readers and writers shared by the tests that run the flow (tests/flows, tests/report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from imagebatch.flows.cli import main
from imagebatch.tasks.csvcells import read_csv


def write_jsonl(path: Path, jobs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def read_results(out: Path) -> list[dict[str, str]]:
    """results.csv's rows, every cell as it was before the writer neutralised formulas."""
    return list(read_csv(out / "results.csv"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary_counts(out: str) -> dict[str, int]:
    """The rows of the summary table printed on stdout: {status: requests}."""
    counts = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 2 and cells[1].isdigit():
            counts[cells[0]] = int(cells[1])
    return counts


def peak_in_flight(requests: list[dict[str, Any]]) -> int:
    """The most requests the emulator was answering at once, from its request log's start and end times."""
    edges = [(r["time"], 1) for r in requests] + [(r["ended"], -1) for r in requests]
    peak = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak
