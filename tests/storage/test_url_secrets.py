"""No store credential in any message (issue 29 #4): a manifest's URL, a reference cell, export's OUT and
`--to`, `report`'s OUT, each given with a user name and password, a query and a fragment, are refused
(exit 2) by messages naming the place without them (`storage.shown_url`, `storage.redact_urls`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.runs import cli

from imagebatch.storage.location import redact_urls, shown_url

SECRETS = ("AKIDSECRET", "PASSWORDSECRET", "SIGSECRET", "FRAGSECRET")
URL = "s3://AKIDSECRET:PASSWORDSECRET@bucket/{}?X-Amz-Signature=SIGSECRET#FRAGSECRET"


def assert_no_secret(text: str) -> None:
    assert not [s for s in SECRETS if s in text], text


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", URL.format("m.csv")],
        ["run", URL.format("m.csv"), "--out", "{tmp}/out"],
        ["export", URL.format("out"), "--to", "{tmp}/dest"],
        ["export", "{tmp}/out", "--to", URL.format("dest")],
        ["report", URL.format("out"), "--to", "{tmp}/copy"],
        ["validate", "{tmp}/m.csv", "--out", URL.format("out")],
    ],
)
def test_a_location_with_credentials_is_refused_without_repeating_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "m.csv").write_text("id,prompt\ng1,a vase\n")
    code, out, err = cli(capsys, *[a.format(tmp=tmp_path) if "{tmp}" in a else a for a in argv])
    assert code == 2
    assert_no_secret(out + err)
    assert "s3://bucket/" in out + err  # the place is still named


def test_a_reference_cell_with_credentials_is_named_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"id,prompt,reference_images\ng1,a vase,{URL.format('ref.png')}\n")
    code, out, err = cli(capsys, "validate", str(manifest))
    assert code == 2
    assert_no_secret(out + err)
    assert "line 2 (id=g1), field reference_images: s3://bucket/ref.png: " in out


def test_the_redaction_of_a_url_and_of_every_url_in_a_text() -> None:
    assert shown_url("https://user:pw@host:8443/a/b?token=x#f") == "https://host:8443/a/b"
    assert shown_url("gs://a@b/c#d") == "gs://b/c"
    assert shown_url("/tmp/out?x") == "/tmp/out?x"  # a path: nothing to redact
    text = "OUT s3://K:S@b/p?sig=Q: refused ('az://u:p@c/k', http://h/x?y=z)."
    assert redact_urls(text) == "OUT s3://b/p: refused ('az://c/k', http://h/x)."
