"""The key removed in every form a service may echo it: case-folded, percent-encoded, base64 (standard and
URL-safe, padded or not, alone or at any of the 3 alignments inside larger base64), and from the chunks of
returned images, whose other bytes stay as they came (issue 21 #6)."""

from __future__ import annotations

import base64
import io
import zlib
from urllib.parse import quote

import pytest
from helpers.images import b64, jpeg
from PIL import Image, PngImagePlugin

from imagebatch.gateway.redaction import carries_key, clean_image, clean_image_b64, redact, redact_json

KEY = "sk-live-Abc123xyz789QWE"


def encodings(key: str) -> list[str]:
    raw = key.encode()
    return [
        key, key.upper(), key.lower(), key.swapcase(),
        quote(key, safe=""), "".join(f"%{b:02x}" for b in raw), "".join(f"%{b:02X}" for b in raw),
        base64.b64encode(raw).decode(), base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode().rstrip("="),
        base64.b64encode(key.upper().encode()).decode(), base64.b64encode(key.lower().encode()).decode(),
    ]  # fmt: skip


@pytest.mark.parametrize("form", encodings(KEY))
def test_every_form_of_the_key_is_redacted(form: str) -> None:
    assert redact(f"id=req-{form}-42 and {form}", KEY) == "id=req-[redacted]-42 and [redacted]"


@pytest.mark.parametrize("prefix", [b"", b"x", b"xy", b"xyz", b"wxyz"])
@pytest.mark.parametrize("urlsafe", [False, True])
def test_the_key_inside_larger_base64_is_found_at_each_alignment(prefix: bytes, urlsafe: bool) -> None:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    blob = encode(b"some other bytes " + prefix + KEY.encode() + b" and more").decode()
    assert carries_key(blob, KEY)
    redacted = redact(blob, KEY)
    assert "[redacted]" in redacted
    # What is left around the mark cannot give the key back: at most 2 characters at each end.
    assert len(blob) - len(redacted) + len("[redacted]") >= len(base64.b64encode(KEY.encode())) - 4


def test_ordinary_text_and_a_near_miss_are_left_alone() -> None:
    text = f"sk-live-Abc123xyz789QW {base64.b64encode(KEY[:-2].encode()).decode()} plain words"
    assert redact(text, KEY) == text
    assert redact(text, None) == text


def test_a_short_key_has_no_base64_forms() -> None:
    """A base64 form under 16 characters could match unrelated text; only the key itself is matched."""
    assert redact("aw k K %6B", "k") == "aw [redacted] [redacted] [redacted]"


def tagged_png(*chunks: tuple[str, str, str]) -> tuple[bytes, bytes]:
    """(a PNG with text chunks (kind, keyword, text), the same PNG without them)."""
    image = Image.new("RGB", (32, 24), (10, 120, 200))
    image.putpixel((3, 4), (255, 0, 0))
    plain = io.BytesIO()
    image.save(plain, "PNG")
    info = PngImagePlugin.PngInfo()
    for kind, keyword, text in chunks:
        if kind == "iTXt":
            info.add_itxt(keyword, text, zip=True)
        else:
            info.add_text(keyword, text, zip=kind == "zTXt")
    tagged = io.BytesIO()
    image.save(tagged, "PNG", pnginfo=info)
    return tagged.getvalue(), plain.getvalue()


def pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGBA").tobytes()


def test_png_text_chunks_carrying_the_key_are_removed_and_nothing_else_changes() -> None:
    key64 = base64.b64encode(KEY.encode()).decode()
    tagged, plain = tagged_png(
        ("tEXt", "Comment", f"made with {KEY}"),
        ("zTXt", "Software", KEY.upper()),
        ("iTXt", "Description", f"key={key64}"),
        ("tEXt", "Title", quote(KEY, safe="")),
    )
    cleaned = clean_image(tagged, lambda t: carries_key(t, KEY))
    assert cleaned == plain  # the file as it would be without those chunks, byte for byte
    assert pixels(cleaned) == pixels(tagged)


def test_a_png_whose_chunks_do_not_carry_the_key_is_the_same_object() -> None:
    tagged, _ = tagged_png(("tEXt", "Comment", "a vase"), ("zTXt", "Software", "renderer 2"))
    assert clean_image(tagged, lambda t: carries_key(t, KEY)) is tagged
    text = b64(tagged)
    assert clean_image_b64(text, KEY) is text


def test_a_compressed_chunk_that_cannot_be_read_is_removed() -> None:
    tagged, plain = tagged_png(("zTXt", "Comment", "x"))
    start = tagged.index(b"zTXt") - 4
    length = int.from_bytes(tagged[start : start + 4], "big")
    body = b"Comment\0\0" + b"not zlib"
    chunk = len(body).to_bytes(4, "big") + b"zTXt" + body + zlib.crc32(b"zTXt" + body).to_bytes(4, "big")
    broken = tagged[:start] + chunk + tagged[start + 12 + length :]
    assert clean_image(broken, lambda t: carries_key(t, KEY)) == plain


def test_jpeg_comment_exif_and_xmp_carrying_the_key_are_removed_pixels_untouched() -> None:
    image = Image.new("RGB", (40, 30), (200, 50, 20))
    exif = Image.Exif()
    exif[0x010E] = f"by {KEY}"  # ImageDescription
    tagged_io, plain_io = io.BytesIO(), io.BytesIO()
    image.save(tagged_io, "JPEG", comment=KEY.lower().encode(), exif=exif.tobytes(), quality=90)
    image.save(plain_io, "JPEG", quality=90)
    tagged = tagged_io.getvalue()
    xmp = b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta>" + base64.b64encode(KEY.encode()) + b"</x:xmpmeta>"
    segment = b"\xff\xe1" + (len(xmp) + 2).to_bytes(2, "big") + xmp
    tagged = tagged[:2] + segment + tagged[2:]
    cleaned = clean_image(tagged, lambda t: carries_key(t, KEY))
    assert cleaned == plain_io.getvalue()
    assert pixels(cleaned) == pixels(tagged)


def test_base64_image_data_is_cleaned_in_its_own_alphabet_and_padding() -> None:
    tagged, plain = tagged_png(("tEXt", "Comment", KEY))
    assert clean_image_b64(b64(tagged), KEY) == b64(plain)
    urlsafe = base64.urlsafe_b64encode(tagged).decode().rstrip("=")
    assert clean_image_b64(urlsafe, KEY) == base64.urlsafe_b64encode(plain).decode().rstrip("=")


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_cleaned_base64_is_padded_whenever_its_length_needs_it(extra: int) -> None:
    """Removing a chunk changes the length mod 3: padding follows the new length, not the old text."""
    tagged, plain = tagged_png(("tEXt", "Comment", KEY + "x" * extra))
    assert clean_image_b64(b64(tagged), KEY) == b64(plain)
    assert base64.b64decode(clean_image_b64(b64(tagged), KEY), validate=True) == plain


def test_data_that_is_no_image_is_redacted_as_text() -> None:
    fake = base64.b64encode(b"\x89PNG\r\n\x1a\n" + KEY.encode()).decode()  # PNG magic, then no chunks
    assert "[redacted]" in clean_image_b64(fake, KEY)
    assert clean_image_b64(base64.b64encode(b"hello " + KEY.encode()).decode(), KEY).endswith("[redacted]")


def test_a_body_is_cleaned_everywhere_images_included() -> None:
    tagged, plain = tagged_png(("iTXt", "Comment", KEY.upper()))
    photo = b64(jpeg())
    body = {
        "candidates": [{"content": {"parts": [
            {"text": f"here, {quote(KEY)}"},
            {"inlineData": {"mimeType": "image/png", "data": b64(tagged)}},
        ]}}],
        "choices": [{"message": {"content": f"![a](data:image/png;base64,{b64(tagged)}) {KEY.lower()}"}}],
        "data": [{"b64_json": photo, "revised_prompt": base64.b64encode(KEY.encode()).decode()}],
        f"x-{KEY}": "key",
    }  # fmt: skip
    clean = redact_json(body, KEY)
    parts = clean["candidates"][0]["content"]["parts"]
    assert parts[0]["text"] == "here, [redacted]"
    assert parts[1]["inlineData"]["data"] == b64(plain)
    assert clean["choices"][0]["message"]["content"] == f"![a](data:image/png;base64,{b64(plain)}) [redacted]"
    assert clean["data"][0] == {"b64_json": photo, "revised_prompt": "[redacted]"}
    assert "x-[redacted]" in clean
