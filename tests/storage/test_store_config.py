"""A malformed store address in the environment is one clear line and exit 2 before obstore sees it
(issue 29 #7: `AWS_ENDPOINT_URL='not a url'` made obstore panic: a `PanicException` traceback, exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.runs import cli

from imagebatch.storage.location import store_config_fault

BAD = [
    "not a url",
    "file:///etc",
    "http://",
    "http://host:port",
    "ftp://h",
    "http://u:SECRETPW@h",
    "http://h\n",
]


@pytest.mark.parametrize("endpoint", BAD)
def test_a_malformed_endpoint_is_refused_by_every_command_that_opens_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], endpoint: str
) -> None:
    for name, value in {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRETKEY",
                        "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    (tmp_path / "out").mkdir()
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\ng1,a vase\n")
    for argv in (
        ["validate", str(manifest), "--out", "s3://bucket/run"],
        ["run", str(manifest), "--out", "s3://bucket/run"],
        ["validate", "s3://bucket/m.csv"],
        ["export", str(tmp_path / "out"), "--to", "s3://bucket/dest"],
        ["report", "s3://bucket/run", "--to", str(tmp_path / "copy")],
    ):
        code, out, err = cli(capsys, *argv)
        assert code == 2, argv
        assert "AWS_ENDPOINT_URL" in out + err, argv
        assert "Traceback" not in err and "Panic" not in err and "SECRET" not in out + err, argv


def test_a_good_endpoint_and_no_endpoint_pass() -> None:
    for env in (
        {},
        {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"},
        {"AWS_ENDPOINT_URL": "https://s3.example"},
    ):
        assert store_config_fault("s3", env) is None
    assert store_config_fault("az", {"AZURE_STORAGE_ENDPOINT": "file:///x"}) is not None
    assert store_config_fault("gs", {"AWS_ENDPOINT_URL": "file:///x"}) is None  # another store's variable


def test_an_output_prefix_too_long_for_the_keys_under_it_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29 #12: a 1,100-character prefix was accepted (moto stored 1,142-byte keys; S3 allows 1,024)."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,prompt\ng1,a vase\n")
    for command in ("validate", "run"):
        code, out, err = cli(capsys, command, str(manifest), "--out", "s3://bucket/" + "p" * 1100)
        assert code == 2, command
        assert "the prefix is 1,100 bytes long; at most 767 " in out + err, command
        assert "Traceback" not in err
    from imagebatch.storage.location import check_store_config

    check_store_config("s3", "é" * 383)  # 766 bytes: room for a run's names
    with pytest.raises(ValueError, match="the prefix is 768 bytes long"):
        check_store_config("s3", "é" * 384)
