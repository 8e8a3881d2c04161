"""The `imagebatch` command, called in-process through `main`: exit codes, what it prints, what it sends."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.runs import cli, read_results, summary_counts
from PIL import Image

from imagebatch.cli.main import main
from imagebatch.manifest import ManifestError
from imagebatch.run.exit_codes import EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE


def invalid_manifest(folder: Path) -> Path:
    path = folder / "bad.csv"
    path.write_text("id,prompt,image_size,model\na,a red mug,1k,\nb,a blue mug,,native-image-9\n")
    return path


# --- validate --------------------------------------------------------------------------------------------


def test_validate_a_valid_manifest_prints_the_plan(examples: Path, capsys: Any) -> None:
    code, out, _ = cli(capsys, "validate", str(examples / "catalog.csv"))
    assert code == EXIT_OK == 0
    lines = out.splitlines()
    assert lines[0].startswith(f"{examples / 'catalog.csv'}: valid (csv, sha256 ")
    assert "nothing was sent" in lines[0]
    assert lines[1].split() == ["route", "model", "jobs", "requests", "images", "at", "most"]
    assert lines[2].split() == ["native", "native-image-2.1", "6", "6", "6"]


def test_validate_an_invalid_manifest_names_every_problem(tmp_path: Path, capsys: Any) -> None:
    path = invalid_manifest(tmp_path)
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == EXIT_USAGE == 2
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("line 2 (id=a), field image_size: ") and "'1k'" in lines[0]
    assert lines[1].startswith("line 3 (id=b), field model: unknown model 'native-image-9'")
    assert lines[2] == f"{path}: 2 problems; nothing was sent"


# --- run: usage errors send nothing ----------------------------------------------------------------------


def test_run_an_invalid_manifest_exits_2_and_sends_nothing(
    service_env: Any, tmp_path: Path, capsys: Any
) -> None:
    path = invalid_manifest(tmp_path)
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "run", str(path), "--out", str(out_dir))
    assert code == EXIT_USAGE
    assert "line 2 (id=a), field image_size:" in err
    assert "line 3 (id=b), field model:" in err
    assert "2 problems; nothing was sent" in err
    assert out == ""
    assert service_env.requests() == []
    assert not out_dir.exists()


def test_run_with_an_address_but_no_key_exits_2_and_sends_nothing(
    emulator: Any, examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", emulator.url)
    monkeypatch.delenv("IMAGEBATCH_API_KEY", raising=False)
    out_dir = tmp_path / "out"
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir))
    assert code == EXIT_USAGE
    assert "IMAGEBATCH_API_KEY" in err and emulator.url in err
    assert err.rstrip().endswith("; nothing was sent.") and ".;" not in err  # one stop, not two
    assert emulator.requests() == []
    assert not out_dir.exists()


@pytest.mark.parametrize("concurrency", ["0", "257", "-1"])
def test_run_concurrency_out_of_range_exits_2(
    service_env: Any, examples: Path, tmp_path: Path, capsys: Any, concurrency: str
) -> None:
    out_dir = tmp_path / "out"
    code, _, err = cli(
        capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir), "--concurrency", concurrency
    )
    assert code == EXIT_USAGE
    assert "--concurrency must be from 1 to 256" in err
    assert service_env.requests() == []
    assert not out_dir.exists()


def test_run_without_out_is_an_argparse_error(examples: Path, capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", str(examples / "catalog.csv")])
    assert exc.value.code == 2
    assert "--out" in capsys.readouterr().err


def test_run_with_a_missing_secret_block_exits_2_and_sends_nothing(
    emulator: Any, examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", emulator.url)
    monkeypatch.delenv("IMAGEBATCH_API_KEY", raising=False)
    try:
        code, _, err = cli(
            capsys, "run", str(examples / "catalog.csv"), "--out", str(tmp_path / "out"),
            "--api-key-block", "no-such-block",
        )  # fmt: skip
    finally:
        assert emulator.requests() == []
    assert code == EXIT_USAGE
    assert "no-such-block" in err


# --- run: against the session emulator -------------------------------------------------------------------


def test_run_prints_a_summary_keeps_the_key_out_and_a_rerun_skips_everything(
    service_env: Any, examples: Path, tmp_path: Path, capsys: Any, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    manifest = str(examples / "catalog.csv")
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "run", manifest, "--out", str(out_dir))
    assert code == EXIT_OK, err
    assert f"imagebatch: 6 requests -> {out_dir.resolve()}" in out
    assert summary_counts(out) == {"succeeded": 6}, out
    assert "embedded emulator" not in err  # an address is configured
    rows = read_results(out_dir)
    assert [r["status"] for r in rows] == ["succeeded"] * 6
    assert len(service_env.requests()) == 6
    assert "usage (all runs into this folder)" in out
    with (out_dir / "usage-summary.csv").open(newline="") as fh:
        usage = list(csv.DictReader(fh))
    assert sum(int(u["requests"]) for u in usage) == 6 and sum(int(u["images"]) for u in usage) >= 6

    # The key came from the environment: it is in no output, no log record and no file of the output folder.
    key = service_env.api_key
    assert key not in out and key not in err and key not in caplog.text
    files = [p for p in out_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"results.csv", "usage.jsonl", "journal.jsonl", "run.json"}
    for path in files:
        assert key.encode() not in path.read_bytes(), path

    code, out, err = cli(capsys, "run", manifest, "--out", str(out_dir))
    assert code == EXIT_OK, err
    assert [r["status"] for r in read_results(out_dir)] == ["skipped"] * 6
    assert summary_counts(out) == {"skipped": 6}, out
    assert len(service_env.requests()) == 6  # nothing sent the second time
    assert key not in out and key not in err


def test_run_with_a_failed_request_exits_1(
    service_env: Any, examples: Path, tmp_path: Path, capsys: Any
) -> None:
    # A 503 on the native route: a single attempt, then failed (503: nothing was generated).
    service_env.set_faults(scripts=[{"outcomes": [503], "match": "canvas tote bag"}])
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir))
    assert code == EXIT_INCOMPLETE == 1
    rows = read_results(out_dir)
    assert [r["status"] for r in rows] == ["succeeded"] * 2 + ["failed"] + ["succeeded"] * 3
    assert rows[2]["attempts"] == "1" and "503" in rows[2]["error"]
    assert len(service_env.requests()) == 6
    assert summary_counts(out) == {"succeeded": 5, "failed": 1}, out
    assert "Stopped early" not in err

    # The failed row is sent again by the next run, which then completes.
    code, _, _ = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir))
    assert code == EXIT_OK
    assert [r["status"] for r in read_results(out_dir)].count("succeeded") == 1
    assert len(service_env.requests()) == 7


def test_run_with_a_rejected_key_stops_and_says_what_to_fix(
    service_env: Any, examples: Path, tmp_path: Path, capsys: Any
) -> None:
    service_env.set_faults(scripts=[{"outcomes": [401], "match": "canvas tote bag"}])
    out_dir = tmp_path / "out"
    code, out, err = cli(
        capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir), "--concurrency", "1"
    )
    assert code == EXIT_INCOMPLETE
    assert summary_counts(out) == {"succeeded": 2, "failed": 1, "not_attempted": 3}, out
    assert [r["status"] for r in read_results(out_dir)] == [
        "succeeded", "succeeded", "failed", "not_attempted", "not_attempted", "not_attempted",
    ]  # fmt: skip
    assert "Stopped early" in err and "401" in err and "set IMAGEBATCH_API_KEY to a valid key" in err
    assert "A rerun picks up where this one stopped" in err
    assert len(service_env.requests()) == 3
    assert service_env.api_key not in out + err


def test_run_with_a_dropped_answer_reports_unknown(
    service_env: Any, examples: Path, tmp_path: Path, capsys: Any
) -> None:
    service_env.set_faults(scripts=[{"outcomes": ["drop"], "match": "desk lamp"}])
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir))
    assert code == EXIT_INCOMPLETE
    assert summary_counts(out) == {"succeeded": 5, "unknown": 1}, out
    assert [r["status"] for r in read_results(out_dir)][3] == "unknown"
    assert "1 request ended with an unknown outcome" in err and "--retry-unknown" in err


def test_run_on_the_embedded_emulator_says_so(
    examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("IMAGEBATCH_BASE_URL", raising=False)
    monkeypatch.delenv("IMAGEBATCH_API_KEY", raising=False)
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out_dir))
    assert code == EXIT_OK, err
    notices = [line for line in err.splitlines() if "embedded emulator" in line]
    assert len(notices) == 1 and "placeholders" in notices[0]
    assert [r["status"] for r in read_results(out_dir)] == ["succeeded"] * 6
    assert "imagebatch: 6 requests" in out


# --- emulator --------------------------------------------------------------------------------------------


def test_emulator_subcommand_is_wired(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["emulator", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--api-key" in out


@pytest.mark.parametrize(
    ("base_url", "key", "says"),
    [
        ("http://127.0.0.1:9/v1", "valid-key-123", "without /v1"),
        ("http://127.0.0.1:9/v1beta/", "valid-key-123", "without /v1beta"),
        ("ftp://127.0.0.1:9", "valid-key-123", "http(s)"),
        ("http://127.0.0.1:9", "secret key with spaces", "spaces"),
        ("http://127.0.0.1:9", "secret-key\n", "line breaks"),
        ("http://127.0.0.1:9", "clé-secrète", "non-ASCII"),
    ],
)
def test_bad_configuration_exits_2_before_prefect_starts(
    examples: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    base_url: str,
    key: str,
    says: str,
) -> None:
    monkeypatch.setenv("IMAGEBATCH_BASE_URL", base_url)
    monkeypatch.setenv("IMAGEBATCH_API_KEY", key)
    started: list[Any] = []
    import imagebatch.flows.batch as batch

    monkeypatch.setattr(batch, "generate_from_manifest", lambda **kw: started.append(kw))
    code, out, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(tmp_path / "out"))
    assert code == EXIT_USAGE
    assert says in err and "nothing was sent" in err
    assert started == [] and not (tmp_path / "out").exists()
    assert key.strip() not in out + err  # a key is never echoed, even a malformed one


@pytest.mark.parametrize("where", ["option", "environment"])
def test_a_base_url_with_a_password_exits_2_without_echoing_it(
    examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, where: str
) -> None:
    """Issue 21 #6: the URL would be stored in run.json and Prefect's flow-run parameters."""
    url = "http://robot:Hunter2-PASS@127.0.0.1:9"
    monkeypatch.setenv("IMAGEBATCH_API_KEY", "valid-key-123")
    option = ["--base-url", url] if where == "option" else []
    if where == "environment":
        monkeypatch.setenv("IMAGEBATCH_BASE_URL", url)
    started: list[Any] = []
    import imagebatch.flows.batch as batch

    monkeypatch.setattr(batch, "generate_from_manifest", lambda **kw: started.append(kw))
    out = tmp_path / "out"
    code, stdout, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out), *option)
    assert code == EXIT_USAGE
    assert "must not hold a user name or password" in err and "nothing was sent" in err
    assert "Hunter2-PASS" not in stdout + err and "robot" not in stdout + err
    assert started == [] and not out.exists()


def test_out_that_is_a_file_exits_2(examples: Path, tmp_path: Path, capsys: Any) -> None:
    target = tmp_path / "out"
    target.write_text("not a folder")
    code, _, err = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(target))
    assert code == EXIT_USAGE and "not a folder" in err


def test_max_images_sends_exactly_up_to_the_cap_and_a_rerun_goes_on(
    service_env: Any, tmp_path: Path, capsys: Any
) -> None:
    """20 one-image jobs, --max-images 5: five sent, the rest not_attempted with the cap named; the cap is
    per run, so a rerun with --max-images 10 sends ten more, none twice."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(f'{{"id": "j{i:02d}", "prompt": "cup {i}"}}\n' for i in range(20)))
    out = tmp_path / "out"
    code, stdout, err = cli(capsys, "run", str(manifest), "--out", str(out), "--max-images", "5")
    assert code == EXIT_INCOMPLETE, err
    assert summary_counts(stdout) == {"succeeded": 5, "not_attempted": 15}, err
    assert "--max-images 5 reached" in err and "Traceback" not in err
    assert len(service_env.ledger()) == 5

    code, stdout, err = cli(capsys, "run", str(manifest), "--out", str(out), "--max-images", "10")
    assert summary_counts(stdout) == {"succeeded": 10, "skipped": 5, "not_attempted": 5}, err
    keys = [e["idempotency_key"] for e in service_env.ledger()]
    assert len(keys) == len(set(keys)) == 15


PRICES = 'currency = "USD"\n[images]\n"native-image-2.1" = 0.25\n'


def test_validate_with_prices_prints_the_most_it_can_cost(tmp_path: Path, capsys: Any) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"id": "a", "prompt": "cup", "count": 3}\n{"id": "b", "prompt": "x", "max_images": 2}\n'
    )
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    code, out, _ = cli(capsys, "validate", str(manifest), "--prices", str(prices))
    assert code == EXIT_OK
    assert "native-image-2.1         1.25 USD" in out  # (3 x 1 + 1 x 2) images at most x 0.25


def test_max_spend_stops_at_the_exact_boundary(service_env: Any, tmp_path: Path, capsys: Any) -> None:
    """At 0.25 an image, --max-spend 1.00 allows exactly four one-image requests of twenty."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(f'{{"id": "s{i:02d}", "prompt": "bowl {i}"}}\n' for i in range(20)))
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    out = tmp_path / "out"
    argv = ["run", str(manifest), "--out", str(out), "--prices", str(prices)]
    code, stdout, err = cli(capsys, *argv, "--max-spend", "1.00")
    assert code == EXIT_INCOMPLETE, err
    assert summary_counts(stdout) == {"succeeded": 4, "not_attempted": 16}, err
    assert "--max-spend 1.00 USD reached" in err and len(service_env.ledger()) == 4
    assert "estimated spend this run: 1.00 USD" in stdout


def test_max_spend_without_prices_is_a_usage_error(examples: Path, tmp_path: Path, capsys: Any) -> None:
    code, _, err = cli(
        capsys, "run", str(examples / "catalog.csv"), "--out", str(tmp_path / "o"), "--max-spend", "5"
    )
    assert code == EXIT_USAGE and "needs a price table" in err


# --- hostile files (issue 21): clear lines, exit 2, nothing sent ----------------------------------------


def hostile_manifest(folder: Path) -> Path:
    """A JSON Lines manifest in `folder/m/` whose every line is refused: a FIFO, /dev/zero, a symlink, a
    `..` path and an absolute path to a real PNG outside the folder, a NUL in a prompt and in a path, a
    line nested 10,000 deep, and metadata named like a results column."""
    (folder / "m").mkdir()
    (folder / "outside").mkdir()
    Image.new("RGB", (8, 8)).save(folder / "outside" / "x.png")
    Image.new("RGB", (8, 8)).save(folder / "m" / "ok.png")
    os.mkfifo(folder / "m" / "pipe.png")
    os.symlink(folder / "outside" / "x.png", folder / "m" / "link.png")
    jobs = [
        {"id": "fifo", "prompt": "x", "reference_images": ["pipe.png"]},
        {"id": "zero", "prompt": "x", "reference_images": ["/dev/zero"]},
        {"id": "link", "prompt": "x", "reference_images": ["link.png"]},
        {"id": "up", "prompt": "x", "reference_images": ["../outside/x.png"]},
        {"id": "abs", "prompt": "x", "reference_images": [str(folder / "outside" / "x.png")]},
        {"id": "nulp", "prompt": "a cat\x00"},
        {"id": "nulf", "prompt": "x", "reference_images": ["ok.png\x00"]},
        {"id": "meta", "prompt": "x", "status": "approved"},
    ]
    lines = [json.dumps(job) for job in jobs]
    lines.insert(5, '{"id": "deep", "prompt": "x", "tag": ' + "[" * 10_000 + "]" * 10_000 + "}")
    path = folder / "m" / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


EXPECTED_LINES = {
    1: "field reference_images: pipe.png: is a FIFO (named pipe), not a regular file",
    2: "field reference_images: /dev/zero: resolves to /dev/zero, outside the files root",
    3: "field reference_images: link.png: resolves to {x}, outside the files root",
    4: "field reference_images: ../outside/x.png: resolves to {x}, outside the files root",
    5: "field reference_images: {x}: resolves to {x}, outside the files root",
    6: "lists and objects are nested more than 32 deep",
    7: "field prompt: holds a NUL character",
    8: "field reference_images: holds a NUL character",
    9: "field status: 'status' is also a column of results.csv",
}


def cli_in_thread(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """`cli`, failing (not hanging) if the command does not return within two minutes."""
    result: list[tuple[int, str, str]] = []
    thread = threading.Thread(target=lambda: result.append(cli(capsys, *argv)), daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), f"imagebatch {argv[0]} hangs"
    return result[0]


def test_validate_refuses_hostile_files_with_each_line(tmp_path: Path, capsys: Any) -> None:
    path = hostile_manifest(tmp_path)
    code, out, _ = cli_in_thread(capsys, "validate", str(path))
    assert code == EXIT_USAGE
    x = str((tmp_path / "outside" / "x.png").resolve())
    lines = out.splitlines()
    assert len(lines) == len(EXPECTED_LINES) + 1, out
    for line, (number, text) in zip(lines, EXPECTED_LINES.items(), strict=False):
        assert line.startswith(f"line {number}") and text.format(x=x) in line, line
    assert "\x00" not in out
    assert lines[-1] == f"{path}: {len(EXPECTED_LINES)} problems; nothing was sent"


def test_run_refuses_hostile_files_and_sends_nothing(service_env: Any, tmp_path: Path, capsys: Any) -> None:
    path = hostile_manifest(tmp_path)
    out_dir = tmp_path / "out"
    code, out, err = cli_in_thread(capsys, "run", str(path), "--out", str(out_dir))
    assert out == ""
    assert code == EXIT_USAGE
    for number in EXPECTED_LINES:
        assert f"line {number} (id=" in err or f"line {number}: " in err
    assert f"{len(EXPECTED_LINES)} problems; nothing was sent" in err
    assert service_env.requests() == [] and not out_dir.exists()


def test_files_root_lets_a_run_send_a_file_from_another_folder(
    service_env: Any, tmp_path: Path, capsys: Any
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "shared").mkdir()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "shared" / "x.png")
    path = tmp_path / "m" / "m.csv"
    path.write_text("id,prompt,reference_images\na,edit it,../shared/x.png\n")
    out_dir = tmp_path / "out"
    code, out, _ = cli(capsys, "validate", str(path))
    assert code == EXIT_USAGE and "outside the files root" in out
    code, out, _ = cli(capsys, "validate", str(path), "--files-root", str(tmp_path / "shared"))
    assert code == EXIT_OK, out
    code, _, err = cli(
        capsys, "run", str(path), "--out", str(out_dir), "--files-root", str(tmp_path / "shared")
    )
    assert code == EXIT_OK, err
    assert [r["status"] for r in read_results(out_dir)] == ["succeeded"]
    assert len(service_env.requests()) == 1


def test_deploy_passes_the_files_root_as_an_absolute_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imagebatch.cli.deploy import request_of
    from imagebatch.cli.main import build_parser
    from imagebatch.platform.deploy import check

    (tmp_path / "m").mkdir()
    (tmp_path / "shared").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "shared" / "x.png")
    path = tmp_path / "m" / "m.csv"
    path.write_text("id,prompt,reference_images\na,edit it,../shared/x.png\n")
    monkeypatch.chdir(tmp_path)
    argv = ["deploy", str(path), "--out", str(tmp_path / "out"), "--name", "n", "--base-url", "embedded"]
    with pytest.raises(ManifestError, match="outside the files root"):
        check(request_of(build_parser().parse_args(argv)))
    parameters = check(request_of(build_parser().parse_args([*argv, "--files-root", "shared"])))
    assert parameters["options"]["inputs"]["files_root"] == [str((tmp_path / "shared").resolve())]


def test_a_reader_that_stops_early_ends_validate_quietly(examples: Path) -> None:
    """`imagebatch validate M.csv | head -1`, made certain: the pipe's reading end is closed before the
    command writes, so its first line meets a broken pipe. It ends as a process stopped by SIGPIPE ends
    (141), and says nothing on stderr: no traceback, no "Exception ignored" at exit."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "imagebatch.cli.main", "validate", str(examples / "catalog.csv")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")
