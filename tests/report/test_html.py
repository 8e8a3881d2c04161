"""The contact sheet over a real run with every route and the statuses a catalog run meets (succeeded, a
chain, a masked edit, text outputs, a `no_image`, an `unknown`), opened in a real headless Chromium (the
system's package; `.ci/run` installs it): every thumbnail loads, the filters change what is shown, and
the page can fetch nothing from the network."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.browser import dom
from helpers.runs import cli, read_results

from imagebatch.storage.folder import FolderBackend

pytestmark = pytest.mark.usefixtures("prefect_harness", "restore_logging")  # these tests run the flow


@pytest.fixture
def finished_run(service_env: Any, examples: Path, tmp_path: Path, capsys: Any) -> Path:
    """`imagebatch run` over the mixed example (every route, a chain, a masked edit, text relays), with
    one answer refused for safety (`no_image`) and one connection dropped (`unknown`)."""
    service_env.set_faults(scripts=[{"outcomes": ["no_image"], "match": "lighthouse"},
                                    {"outcomes": ["drop"], "match": "teapot"}])  # fmt: skip
    manifest = json.loads((examples / "mixed.json").read_text())
    jobs = manifest["jobs"] if isinstance(manifest, dict) else manifest
    jobs += [{"id": "refused", "prompt": "a lighthouse"}, {"id": "dropped", "prompt": "a teapot"}]
    (examples / "mixed.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    _, stdout, err = cli(capsys, "run", str(examples / "mixed.json"), "--out", str(out))
    assert f"report: {out.resolve() / 'report.html'}" in stdout, err
    return out


def test_the_report_shows_every_request_with_its_images_and_reasons(
    finished_run: Path, tmp_path: Path
) -> None:
    out = finished_run
    rows = read_results(out)
    statuses = {r["status"] for r in rows}
    assert {"succeeded", "no_image", "unknown"} <= statuses
    page = (out / "report.html").read_text()
    assert page.count('class="card ') == len(rows)
    assert "http://" not in page and "https://" not in page and "default-src 'none'" in page
    assert "the service said" in page and "it may have been billed" in page and "SAFETY" in page
    thumbs = list((out / "thumbs").glob("*.jpg"))
    assert len(thumbs) >= sum(int(r["images"] or 0) for r in rows if r["status"] == "succeeded")

    shown = dom(out / "report.html", tmp_path / "chromium-0")
    body = re.search(r'<body data-images="(\d+)" data-loaded="(\d+)"', shown)
    assert body and int(body[1]) > 0 and body[1] == body[2], "every thumbnail loads"

    only_unknown = dom(out / "report.html", tmp_path / "chromium-1", "#status=unknown")
    tags = re.findall(r'<div class="card [^>]*>', only_unknown)
    visible = [re.search(r'data-status="(\w+)"', t)[1] for t in tags if "hidden" not in t]  # type: ignore[index]
    assert len(tags) == len(rows) and visible == ["unknown"]


def test_the_report_command_rebuilds_it_and_makes_each_thumbnail_once(
    finished_run: Path, capsys: Any
) -> None:
    first = {p: p.stat().st_mtime_ns for p in (finished_run / "thumbs").glob("*.jpg")}
    (finished_run / "report.html").unlink()
    assert cli(capsys, "report", str(finished_run))[0] == 0
    assert (finished_run / "report.html").is_file()
    assert {p: p.stat().st_mtime_ns for p in (finished_run / "thumbs").glob("*.jpg")} == first


def test_the_report_of_a_folder_without_results_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    code, _, err = cli(capsys, "report", str(tmp_path))
    assert code == 2 and "no results.csv" in err


def test_large_runs_are_paged(tmp_path: Path) -> None:
    from imagebatch.report import build_report

    header = "job_id,request_index,turn_index,status,paths,images,width,height,mime_type,model,route,"
    header += "idempotency_key,attempts,finish_reason,error,request_id\n"
    lines = [f"j{i},0,0,failed,,0,,,,native-image-2,native,ib1-{i:032x},1,,HTTP 503,\n" for i in range(1201)]
    (tmp_path / "results.csv").write_text(header + "".join(lines))
    first = build_report(tmp_path, page_size=500)
    pages = sorted(p.name for p in tmp_path.glob("report*.html"))
    assert pages == ["report-2.html", "report-3.html", "report.html"]
    assert first.read_text().count('class="card ') == 500
    assert (tmp_path / "report-3.html").read_text().count('class="card ') == 201
    assert "1201 requests" in first.read_text() and "failed 1201" in first.read_text()
    # A run gives its own plan (no manifest loaded again): each card shows its request's prompt.
    plan = {f"ib1-{i:032x}": SimpleNamespace(prompt=f"prompt number {i}", reference_images=[], mask=None)
            for i in range(1201)}  # fmt: skip
    build_report(tmp_path, page_size=500, details=plan)
    assert "prompt number 1200" in (tmp_path / "report-3.html").read_text()
    assert "prompt number 0<" in first.read_text() and "prompt number 500<" not in first.read_text()


def test_a_run_without_report_makes_no_thumbnail_and_the_command_makes_them_later(
    service_env: Any, examples: Path, out: Path, capsys: Any
) -> None:
    code, stdout, _ = cli(capsys, "run", str(examples / "catalog.csv"), "--out", str(out), "--no-report")
    assert code == 0 and "report:" not in stdout
    assert not (out / "report.html").exists() and not list(out.glob("thumbs/*"))
    assert json.loads((out / "run.json").read_text())["options"]["report"] is False
    assert cli(capsys, "report", str(out))[0] == 0
    images = [p for row in read_results(out) for p in row["paths"].split(";")]
    assert len(list(out.glob("thumbs/*.jpg"))) == len(images) > 0 and (out / "report.html").is_file()


def test_thumbnails_asked_for_by_many_threads_are_decoded_in_two_threads_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoded 4K image freed in a request thread stays in that thread's malloc arena (16 threads: 1 GB)."""
    import io
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from imagebatch.work import thumbnails

    png = io.BytesIO()
    Image.effect_noise((600, 400), 64).convert("RGB").save(png, "PNG")
    threads: set[str] = set()
    now, peak = [0], [0]
    lock = threading.Lock()
    save = thumbnails.save_thumbnail

    def watched(source: Any, target: Path) -> None:
        with lock:
            threads.add(threading.current_thread().name)
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        try:
            save(source, target)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(thumbnails, "save_thumbnail", watched)
    folder = FolderBackend(tmp_path)
    with ThreadPoolExecutor(16, thread_name_prefix="request") as pool:
        list(
            pool.map(
                lambda i: thumbnails.keep_thumbnail(folder, f"images/j/{i}.png", png.getvalue()), range(32)
            )
        )
    assert len(threads) <= thumbnails.THUMBNAIL_THREADS  # not the 16 request threads that asked
    assert all(name.startswith("imagebatch-thumbnail") for name in threads)
    thumbs = sorted((tmp_path / "thumbs").iterdir())
    assert len(thumbs) == 32 and peak[0] <= thumbnails.THUMBNAIL_THREADS
    with Image.open(thumbs[0]) as im:
        assert max(im.size) == thumbnails.THUMB_SIDE


def test_a_results_csv_another_tool_wrote_or_split_is_reported_not_a_key_error(
    tmp_path: Path, capsys: Any
) -> None:
    """Issue 29 #2: a row cut by a bare CR, or a file without a `status` column, crashed `report`."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_bytes(b"job_id,request_index,note\nj1,0,mid\rdle\nj2\n")
    code, printed, err = cli(capsys, "report", str(out))
    assert (code, err) == (0, "")
    assert printed.strip().endswith("report.html")
    assert "j1" in (out / "report.html").read_text()
