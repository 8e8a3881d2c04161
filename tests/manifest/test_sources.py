"""A manifest and its reference images in a bucket (issue 19 item 5), against a real S3-compatible server
(moto on 127.0.0.1, `s3` in tests/conftest.py), with a counting proxy in front of it where a test asserts
which objects were read."""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.images import mask, png

from imagebatch.cli.main import build_parser
from imagebatch.cli.validate import validate_command
from imagebatch.manifest import load_manifest, plan
from imagebatch.manifest.files import InputFileError, read_reference

REF_A = png(32, 32, (200, 10, 10))
REF_B = png(32, 32, (10, 200, 10))
MASK = mask(32, 32)


def validate(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = validate_command(build_parser().parse_args(["validate", *argv]), out=out)
    return code, out.getvalue()


@pytest.fixture
def proxy(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A proxy in front of the S3 server that logs every request (and injects nothing)."""
    from helpers.s3 import FaultProxy

    p = FaultProxy(s3.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
    yield p
    p.stop()


def gets(proxy: Any, bucket: str) -> Counter[str]:
    """How many times each object of `bucket` was read (GET), by key."""
    paths = [path.split("?")[0] for method, path, _ in proxy.log if method == "GET"]
    return Counter(p.removeprefix(f"/{bucket}/") for p in paths if p.startswith(f"/{bucket}/"))


def put(s3: Any, bucket: str, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        s3.client.put_object(Bucket=bucket, Key=key, Body=data)


CATALOG = (
    "id,prompt,route,reference_images,mask\n"
    "a,edit it,images,refs/a.png,refs/mask.png\n"
    "b,edit it too,native,refs/a.png;refs/sub/../b.png,\n"
    "c,by its URL,native,s3://{bucket}/cat/refs/b.png,\n"
)


def test_a_manifest_in_a_bucket_validates_each_object_read_once_and_plans_a_local_copys_keys(
    s3: Any, proxy: Any, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    files = {"refs/a.png": REF_A, "refs/b.png": REF_B, "refs/mask.png": MASK}
    text = CATALOG.format(bucket=bucket).encode()
    put(s3, bucket, {"cat/m.csv": text, **{f"cat/{k}": v for k, v in files.items()}})
    url = f"s3://{bucket}/cat/m.csv"

    code, out = validate(url, "--keys")
    assert code == 0, out
    assert out.startswith(f"{url}: valid (csv, sha256 ")
    # The manifest and each object read once, however many rows name it and however they spell it.
    assert gets(proxy, bucket) == {
        "cat/m.csv": 1,
        "cat/refs/a.png": 1,
        "cat/refs/b.png": 1,
        "cat/refs/mask.png": 1,
    }

    manifest = load_manifest(url)
    assert manifest.path == url
    assert manifest.sha256 == hashlib.sha256(text).hexdigest()  # computed as the object was spooled
    jobs = {job.id: job for job in manifest.jobs}
    assert jobs["a"].reference_images == [f"s3://{bucket}/cat/refs/a.png"]
    assert jobs["a"].mask == f"s3://{bucket}/cat/refs/mask.png"
    assert jobs["b"].reference_images == [f"s3://{bucket}/cat/refs/a.png", f"s3://{bucket}/cat/refs/b.png"]
    assert jobs["c"].reference_images == [f"s3://{bucket}/cat/refs/b.png"]

    # The same manifest and files in a folder plan the same keys: a key names the bytes, not the place.
    local = tmp_path / "cat"
    for name, data in files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    (local / "m.csv").write_bytes(text.replace(f"s3://{bucket}/cat/".encode(), b""))
    keys = [r.idempotency_key for r in plan(manifest)]
    assert keys == [r.idempotency_key for r in plan(load_manifest(local / "m.csv"))]
    assert all(key in out for key in keys)


def test_references_that_leave_the_manifests_prefix_are_refused_unread_with_row_and_field(
    s3: Any, proxy: Any
) -> None:
    bucket, other = s3.bucket(), s3.bucket()
    rows = {
        "up": "../other/x.png",
        "root": "/other/x.png",
        "url": f"s3://{bucket}/other/x.png",
        "sibling": "../cat2/x.png",  # a prefix that begins like the manifest's is not under it
        "bucket": f"s3://{other}/x.png",
        "above": "../../x.png",
    }
    manifest = "id,prompt,reference_images\n" + "".join(f"{k},edit,{v}\n" for k, v in rows.items())
    put(s3, bucket, {"cat/m.csv": manifest.encode(), "other/x.png": REF_A, "cat2/x.png": REF_A})
    put(s3, other, {"x.png": REF_A})
    url = f"s3://{bucket}/cat/m.csv"

    code, out = validate(url)
    assert code == 2
    outside = f"outside the files root (s3://{bucket}/cat)"
    resolved = {
        "up": f"resolves to s3://{bucket}/other/x.png, {outside}",
        "root": f"resolves to s3://{bucket}/other/x.png, {outside}",
        "url": f"resolves to s3://{bucket}/other/x.png, {outside}",
        "sibling": f"resolves to s3://{bucket}/cat2/x.png, {outside}",
        "bucket": f"resolves to s3://{other}/x.png, {outside}",
        "above": f"s3://{bucket}/cat/../../x.png climbs above the bucket's root",
    }
    expected = {
        row: f"line {n} (id={row}), field reference_images: {rows[row]}: {why}"
        for n, (row, why) in enumerate(resolved.items(), start=2)
    }
    lines = out.splitlines()
    for row, message in expected.items():
        assert any(line.startswith(message) for line in lines), (row, out)
    assert f"--files-root s3://{bucket}/other)" in out  # the hint names the prefix that would allow it
    assert lines[-1] == f"{url}: 6 problems; nothing was sent"
    assert set(gets(proxy, bucket)) == {"cat/m.csv"} and not gets(proxy, other)  # none of them was read

    # The operator can allow another prefix, as a folder with --files-root.
    code, out = validate(url, "--files-root", f"s3://{bucket}/other/")
    assert code == 2
    assert [line.split(",")[0] for line in out.splitlines()[:-1]] == [
        "line 5 (id=sibling)",
        "line 6 (id=bucket)",
        "line 7 (id=above)",
    ]


def test_a_missing_reference_object_is_refused_with_its_row_field_and_url(s3: Any) -> None:
    bucket = s3.bucket()
    put(
        s3,
        bucket,
        {
            "cat/m.csv": b"id,prompt,reference_images\na,edit,refs/a.png\nb,edit,refs/none.png\n",
            "cat/refs/a.png": REF_A,
        },
    )
    code, out = validate(f"s3://{bucket}/cat/m.csv")
    assert code == 2
    assert out.splitlines()[0] == (
        f"line 3 (id=b), field reference_images: refs/none.png: object not found "
        f"(looked for s3://{bucket}/cat/refs/none.png)"
    )


@pytest.mark.parametrize("fault", ["missing object", "missing bucket", "bad credentials"])
def test_a_manifest_that_cannot_be_read_exits_2_naming_the_object_and_the_cause(
    fault: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3.bucket()
    put(s3, bucket, {"cat/m.csv": b"id,prompt\na,a cat\n"})
    url = {
        "missing object": f"s3://{bucket}/cat/none.csv",
        "missing bucket": "s3://no-such-bucket-ib/cat/m.csv",
        "bad credentials": f"s3://{bucket}/cat/m.csv",
    }[fault]
    if fault == "bad credentials":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a-wrong-secret-value")
    code, out = validate(url)
    assert code == 2
    problem, summary = out.splitlines()
    assert summary == f"{url}: 1 problem; nothing was sent"
    causes = {
        "missing object": "manifest not found: {url}",
        "missing bucket": "reading {url} failed: the bucket 'no-such-bucket-ib' does not exist "
        "(NoSuchBucket, HTTP 404)",
        "bad credentials": "reading {url} failed: SignatureDoesNotMatch, HTTP 403",
    }
    assert problem == causes[fault].format(url=url)
    assert "a-wrong-secret-value" not in out and s3.secret_key not in out


def test_a_local_manifest_may_name_objects_under_a_files_root_prefix(s3: Any, tmp_path: Path) -> None:
    bucket = s3.bucket()
    put(s3, bucket, {"refs/a.png": REF_A})
    path = tmp_path / "m.csv"
    path.write_text(f"id,prompt,reference_images\na,edit,s3://{bucket}/refs/a.png\n")
    code, out = validate(str(path))
    assert code == 2
    assert f"resolves to s3://{bucket}/refs/a.png, outside the files root ({tmp_path.resolve()})" in out
    code, out = validate(str(path), "--files-root", f"s3://{bucket}/refs")
    assert code == 0, out
    (job,) = load_manifest(path, files_root=[f"s3://{bucket}/refs"]).jobs
    assert job.reference_images == [f"s3://{bucket}/refs/a.png"]


def test_a_json_manifests_files_root_in_a_bucket_narrows_and_never_widens(s3: Any) -> None:
    bucket = s3.bucket()
    manifest = (
        b'{"defaults": {"files_root": "refs"}, "jobs": ['
        b'{"id": "in", "prompt": "edit", "reference_images": ["refs/a.png"]},'
        b'{"id": "out", "prompt": "edit", "reference_images": ["b.png"]}]}'
    )
    wide = b'{"defaults": {"files_root": ".."}, "jobs": [{"id": "a", "prompt": "edit"}]}'
    put(
        s3,
        bucket,
        {"cat/m.json": manifest, "cat/wide.json": wide, "cat/refs/a.png": REF_A, "cat/b.png": REF_B},
    )
    code, out = validate(f"s3://{bucket}/cat/m.json")
    assert code == 2
    assert out.splitlines()[0] == (
        f"job #1 (id=out), field reference_images: b.png: resolves to s3://{bucket}/cat/b.png, outside the "
        f"files root (s3://{bucket}/cat/refs) (the manifest's defaults.files_root allows only these folders)"
    )
    code, out = validate(f"s3://{bucket}/cat/wide.json")
    assert code == 2
    assert f"..: resolves to s3://{bucket}, outside the manifest's folder and every --files-root" in out


def test_an_object_is_read_only_under_the_limit(s3: Any) -> None:
    bucket = s3.bucket()
    put(s3, bucket, {"big.png": REF_A})
    url = f"s3://{bucket}/big.png"
    assert read_reference(url, len(REF_A) + 1) == REF_A
    with pytest.raises(InputFileError) as refused:
        read_reference(url, len(REF_A))
    assert refused.value.size == len(REF_A)
    assert (
        str(refused.value)
        == f"the file is {len(REF_A):,} bytes; each file must be under {len(REF_A):,} bytes"
    )
    with pytest.raises(FileNotFoundError):
        read_reference(f"s3://{bucket}/none.png", 100)


@pytest.mark.parametrize("name", ["catalog.csv", "mixed.json", "social.jsonl"])
def test_each_example_uploaded_as_it_is_plans_from_the_bucket_the_keys_it_plans_from_disk(
    name: str, s3_bucket_with_examples: str
) -> None:
    url = f"{s3_bucket_with_examples}/{name}"
    code, out = validate(url)
    assert code == 0, out
    assert [r.idempotency_key for r in plan(load_manifest(url))] == [
        r.idempotency_key for r in plan(load_manifest(EXAMPLES / name))
    ]


EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


@pytest.fixture(scope="module")
def s3_bucket_with_examples(s3_server: Any) -> Iterator[str]:
    """manifests/examples uploaded as they are, once for the module; its URL prefix."""
    bucket = s3_server.bucket()
    for path in sorted(EXAMPLES.rglob("*")):
        if path.is_file():
            key = f"examples/{path.relative_to(EXAMPLES).as_posix()}"
            s3_server.client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    with pytest.MonkeyPatch.context() as mp:
        for k, v in s3_server.env().items():
            mp.setenv(k, v)
        yield f"s3://{bucket}/examples"


@pytest.mark.parametrize("name", ["m.xlsx", "m.xlsx#Products", "m.parquet"])
def test_a_workbook_or_parquet_manifest_in_a_bucket_is_refused_with_what_to_do(name: str, s3: Any) -> None:
    bucket = s3.bucket()
    code, out = validate(f"s3://{bucket}/cat/{name}")
    assert code == 2
    fmt = "parquet" if name.endswith("parquet") else "xlsx"
    assert out.splitlines()[0] == (
        f"an .{fmt} manifest is read from a file, not a bucket: copy s3://{bucket}/cat/{name.split('#')[0]} "
        "here, or use CSV"
    )
