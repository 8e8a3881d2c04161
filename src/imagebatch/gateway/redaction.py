"""The API key removed from everything the service sends back, in every form a service may echo it.

A service (or a proxy in front of it) may echo the key it was sent: in a request id, an error message,
a text answer, or the text chunks of an image. What it sends back reaches results.csv, the journal, the
usage ledger, the report and the output files, so the client removes the key from all of it first. The
forms caught (and those not) are listed on `key_pattern`; images are cleaned as images (`clean_image_b64`).
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from .imagefile import JPEG_MAGIC, PNG_MAGIC

REDACTED = "[redacted]"
MIN_BASE64 = 16
"""The shortest base64 text of a key that is matched (characters): a short key's would erase unrelated
base64 and words."""
MAX_CHUNK_TEXT = 4 << 20
"""A compressed text chunk is read up to this many bytes; one that holds more cannot be checked and goes."""
_DATA_URL = re.compile(r"(data:image/(?:png|jpeg);base64,)([A-Za-z0-9+/=]+)")
_URLSAFE = str.maketrans("+/", "-_")
_STANDARD = str.maketrans("-_", "+/")


def _embedded_b64(raw: bytes, offset: int) -> str:
    """The base64 characters fixed by `raw` alone when it starts `offset` bytes into a 3-byte group."""
    encoded = base64.b64encode(b"\0" * offset + raw + b"\0\0").decode()
    first = -(-8 * offset // 6)  # the first character whose 6 bits all belong to `raw`
    end = 8 * (offset + len(raw)) // 6  # past the last such character
    return encoded[first:end]


def _base64_forms(secret: str) -> list[str]:
    """Every base64 text of the key this module matches, longest first."""
    forms: set[str] = set()
    for variant in {secret, secret.lower(), secret.upper()}:
        raw = variant.encode()
        whole = base64.b64encode(raw).decode()
        found = {whole, whole.rstrip("="), *(_embedded_b64(raw, k) for k in range(3))}
        found = {f for f in found if len(f) >= MIN_BASE64}
        forms |= found | {f.translate(_URLSAFE) for f in found}
    return sorted(forms, key=lambda f: (-len(f), f))


def _text_form(secret: str) -> str:
    """The key, each character as is or percent-encoded (matched ignoring case)."""
    parts = []
    for char in secret:
        encoded = "".join(f"%{b:02X}" for b in char.encode())
        parts.append(f"(?:{re.escape(char)}|{re.escape(encoded)})")
    return "".join(parts)


@lru_cache(maxsize=8)
def key_pattern(secret: str) -> re.Pattern[str]:
    """One pattern for every form of `secret`.

    Forms caught in text (each replaced by `[redacted]`):

    - the key in any case (case-folded), any of its characters percent-encoded (`%2D` or `%2d`) or not;
    - the key (as is, lower-cased and upper-cased) base64-encoded, standard (`+/`) or URL-safe (`-_`), with
      or without padding, standing alone;
    - the same inside a larger base64 text (the key's bytes somewhere in bigger encoded data): base64 turns
      3 bytes into 4 characters, so the key's bytes start at one of 3 alignments, and each gives a different
      text. For each alignment the characters that depend on the key's bytes alone are matched (the 1 or 2
      characters at each end that also carry neighbouring bytes stay).

    Base64 forms are matched when at least `MIN_BASE64` characters long (keys of 12 bytes or more), so that a
    short key cannot erase unrelated text. Not caught: other encodings (hex, base32, HTML entities), two
    encodings stacked (base64 of the percent-encoded key), a key split across strings.

    Images are not text: a `data:image/...;base64,` URL and the image fields of a body (`b64_json`,
    `inlineData.data`) are decoded instead, and any chunk of the image that carries the key in any of the
    forms above is removed (`clean_image`); every other byte, the pixel data included, is kept as it came.
    """
    alternatives = [f"(?i:{_text_form(secret)})", *(re.escape(f) for f in _base64_forms(secret))]
    return re.compile("|".join(alternatives))


def carries_key(text: str, secret: str) -> bool:
    """Whether `text` holds `secret` in any form this module knows."""
    return key_pattern(secret).search(text) is not None


def redact(text: str, secret: str | None) -> str:
    """`text` with every form of `secret` replaced by `[redacted]`; an image in a data URL is cleaned as
    an image (`clean_image_b64`), never cut as text (a chat answer carries its images that way)."""
    if not secret:
        return text
    if "data:image/" not in text:
        return key_pattern(secret).sub(REDACTED, text)
    pieces: list[str] = []
    last = 0
    for match in _DATA_URL.finditer(text):
        pieces.append(key_pattern(secret).sub(REDACTED, text[last : match.start()]))
        pieces.append(match.group(1) + clean_image_b64(match.group(2), secret))
        last = match.end()
    pieces.append(key_pattern(secret).sub(REDACTED, text[last:]))
    return "".join(pieces)


def redact_json(value: Any, secret: str | None) -> Any:
    """`value` (a parsed JSON body) with `secret` removed from every string in it, keys included; image
    data is cleaned as an image (`clean_image_b64`)."""
    if not secret:
        return value
    if isinstance(value, str):
        return redact(value, secret)
    if isinstance(value, list):
        return [redact_json(v, secret) for v in value]
    if isinstance(value, dict):
        return {
            redact(k, secret): clean_image_b64(v, secret)
            if _is_image_data(value, k, v)
            else redact_json(v, secret)
            for k, v in value.items()
        }
    return value


def _is_image_data(parent: dict[str, Any], key: str, value: Any) -> bool:
    """Base64 image bytes (an `inlineData.data`, a `b64_json`): cutting text out of them would break the
    image, so they are decoded and cleaned as images."""
    image = key == "b64_json" or (key == "data" and ("mimeType" in parent or "mime_type" in parent))
    return image and isinstance(value, str)


def clean_image_b64(data: str, secret: str) -> str:
    """Base64 image data with the chunks that carry `secret` removed, in the alphabet and padding it came
    in; the same string when none does. Data that is not a PNG or JPEG that can be walked chunk by chunk
    is no image: it is redacted as text (the image reader refuses it anyway)."""
    urlsafe = "-" in data or "_" in data
    try:
        text = data.translate(_STANDARD) if urlsafe else data
        raw = binascii.a2b_base64(text + "=" * (-len(text) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        raw = b""
    cleaned = clean_image(raw, lambda t: carries_key(t, secret))
    if cleaned is None:
        return key_pattern(secret).sub(REDACTED, data)
    if cleaned is raw:
        return data
    encoded = base64.b64encode(cleaned).decode()
    if urlsafe:
        encoded = encoded.translate(_URLSAFE)
    return encoded.rstrip("=") if len(data) % 4 else encoded  # unpadded stays so, padded (or exact) too


def _views(payload: bytes) -> str:
    """The bytes of a chunk as text to search: Latin-1 (which keeps ASCII and UTF-8 keys as they are)
    and UTF-16 in both byte orders (EXIF's XP tags, ICC descriptions)."""
    views = [payload.decode("latin-1")]
    for codec in ("utf-16-le", "utf-16-be"):
        for start in (0, 1):
            views.append(payload[start:].decode(codec, errors="ignore"))
    return "\n".join(views)


def clean_image(data: bytes, carries: Callable[[str], bool]) -> bytes | None:
    """`data` (PNG or JPEG) without the chunks for which `carries(chunk text)` is true: `data` itself (the
    same object) when nothing is removed; None when it is no PNG or JPEG, or one that cannot be walked
    chunk by chunk (cut short, a length past its end)."""
    if data.startswith(PNG_MAGIC):
        return _clean_png(data, carries)
    if data.startswith(JPEG_MAGIC):
        return _clean_jpeg(data, carries)
    return None


def _inflate(data: bytes) -> bytes | None:
    """zlib data inflated up to `MAX_CHUNK_TEXT` bytes; None when it is damaged or holds more."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, MAX_CHUNK_TEXT)
    except zlib.error:
        return None
    return None if inflater.unconsumed_tail else out


def _png_chunk_text(kind: bytes, body: bytes) -> str | None:
    """What an ancillary PNG chunk says, decompressed where the chunk is compressed (zTXt, iTXt with its
    flag set, iCCP); None when it cannot be read."""
    if kind in (b"zTXt", b"iCCP"):
        name, _, rest = body.partition(b"\0")
        text = _inflate(rest[1:])
        return None if text is None else _views(name + b"\0" + text)
    if kind == b"iTXt":
        name, _, rest = body.partition(b"\0")
        if rest[:1] == b"\1":
            lang, _, rest2 = rest[2:].partition(b"\0")
            translated, _, compressed = rest2.partition(b"\0")
            text = _inflate(compressed)
            return None if text is None else _views(b"\0".join((name, lang, translated, text)))
    return _views(body)


def _clean_png(data: bytes, carries: Callable[[str], bool]) -> bytes | None:
    """Ancillary chunks (text, EXIF, private ones) that carry the key, or cannot be read, are dropped, and
    so are bytes after IEND that carry it; critical chunks (IHDR, PLTE, IDAT, IEND) are never touched."""
    kept: list[bytes] = [data[:8]]
    pos, removed = 8, False
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            return None
        ancillary = bool(kind[0] & 0x20)
        if ancillary:
            text = _png_chunk_text(kind, data[pos + 8 : pos + 8 + length])
            if text is None or carries(text):
                removed, pos = True, end
                continue
        kept.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break
    else:
        return None  # no IEND: cut short
    tail = data[pos:]
    if tail and carries(_views(tail)):
        removed, tail = True, b""
    return b"".join(kept) + tail if removed else data


_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
"""The next marker after entropy-coded data (0xFF 0x00 is a stuffed byte, 0xFF 0xD0-D7 restart markers)."""


def _clean_jpeg(data: bytes, carries: Callable[[str], bool]) -> bytes | None:
    """APPn segments (EXIF, XMP, ICC, ...) and comments that carry the key are dropped; every other
    segment and all entropy-coded (pixel) data are copied as they are."""
    kept: list[bytes] = [data[:2]]
    pos, removed = 2, False
    while pos + 1 < len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            kept.append(data[pos : pos + 1])
            pos += 1
            continue
        if marker == 0xD9 or 0xD0 <= marker <= 0xD7 or marker == 0x01:
            kept.append(data[pos : pos + 2])
            pos += 2
            if marker == 0xD9:
                break
            continue
        end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if end > len(data) or end < pos + 4:
            return None
        if (0xE0 <= marker <= 0xEF or marker == 0xFE) and carries(_views(data[pos + 4 : end])):
            removed, pos = True, end
            continue
        kept.append(data[pos:end])
        pos = end
        if marker == 0xDA:  # start of scan: its data runs to the next marker
            found = _JPEG_MARKER.search(data, pos)
            stop = found.start() if found else len(data)
            kept.append(data[pos:stop])
            pos = stop
    else:
        return None  # no end-of-image marker: cut short
    kept.append(data[pos:])
    return b"".join(kept) if removed else data
