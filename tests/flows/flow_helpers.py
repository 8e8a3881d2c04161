"""Small readers and writers shared by the flow tests."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, jobs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    return path


def read_results(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
