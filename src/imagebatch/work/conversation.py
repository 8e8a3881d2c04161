"""The conversation behind each native answer, kept so that a rejected image can later be edited by a
follow-up turn (`imagebatch run --redo rejected --edit`), which the spec allows only with the complete
earlier model content sent back: same parts, same order, unaltered `thoughtSignature`.

Kept: `{"key": ..., "contents": [...]}`, every content sent and the model content answered, in order
(`OutputStore.save_conversation`); an edit chain's own turns are in its chain file (`work.chain`), not
kept twice. Each image is kept once, as a reference to its file (why and how: on `compact_model`).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebatch.gateway import ImageResult
from imagebatch.manifest import PlannedRequest
from imagebatch.manifest.models import FileRef
from imagebatch.manifest.plan import idempotency_key
from imagebatch.manifest.sources import is_url
from imagebatch.work.build import InputChangedError, read_input
from imagebatch.work.records import Result
from imagebatch.work.store import OutputStore, RequestRecord

Content = dict[str, Any]
Ref = dict[str, str]


class HistoryError(Exception):
    """A kept conversation cannot be sent back exactly as it was (missing, or a file it names changed)."""


def compact_model(content: Content, files: Sequence[tuple[str, bytes]]) -> Content:
    """A model content as kept: its k-th final image part (not a thought) refers to `files[k]` (its name
    and bytes: the answer's k-th image, decoded from that part by the reader), when the part's data is
    exactly the standard base64 of those bytes; every other part, and every key, unchanged.

    Choice: **the image is kept once**. A model content carries its image inline as base64 (the 1K PNG of
    the service is about 1.5 MB, so 2 MB of base64; 4K, several times more), and the image is already in
    `images/`. So a part's `inlineData.data` is stored as a reference, `{"file": "images/...", "sha256":
    ...}` (an output image) or `{"input": "/path/of/reference.png", "sha256": ...}` (a manifest's reference
    image in a user turn), and put back, re-encoded, when the conversation is sent. That is exact only when
    the service's base64 is the standard encoding of the file's bytes: a part is stored as a reference only
    if `base64(file bytes) == data` character for character (else it stays inline, whole), and a reference
    whose file's sha256 no longer matches is refused (`HistoryError`): never a rebuilt or altered turn. What
    stays inline is small: text, signatures, and a thought image if the answer had one (measured:
    `bench/bench_conversation.py`, README "Regenerate the rejects"). The parts are matched by position, not by
    decoding the base64 again: the k-th final image part is the answer's k-th image (the reader's own order),
    a user turn's k-th image the request's k-th reference image.
    """
    refs: dict[int, Ref] = {}
    finals = [i for i, p in enumerate(_parts(content)) if _data(p) is not None and not p.get("thought")]
    for index, (name, data) in zip(finals, files, strict=False):
        if _standard_base64_of(data, _data(_parts(content)[index]) or ""):
            refs[index] = {"file": name, "sha256": hashlib.sha256(data).hexdigest()}
    return _with_refs(content, refs)


def compact_user(turn: Content, inputs: Sequence[tuple[FileRef, str | None]]) -> Content:
    """A user turn as kept: its k-th image part refers to `inputs[k]` (a manifest's image and the sha256
    the plan hashed). The turn is imagebatch's own (`gateway.requests.user_turn`, the standard base64 of
    the bytes `build.read_input` checked against that sha256), so its images are those files."""
    images = [i for i, p in enumerate(_parts(turn)) if _data(p) is not None]
    refs = {
        i: {"input": str(path), "sha256": sha} for i, (path, sha) in zip(images, inputs, strict=False) if sha
    }
    return _with_refs(turn, refs)


def _parts(content: Content) -> list[Any]:
    parts = content.get("parts")
    return parts if isinstance(parts, list) else []


def _data(part: Any) -> str | None:
    """The base64 data of an image part, or None (not an image, or already a reference)."""
    inline = part.get("inlineData") if isinstance(part, dict) else None
    data = inline.get("data") if isinstance(inline, dict) else None
    return data if isinstance(data, str) else None


def _standard_base64_of(raw: bytes, data: str) -> bool:
    """Whether `data`, which strict base64 decoding turned into `raw` (the reader's own decoding:
    alphabet and padding checked), is character for character `base64.b64encode(raw)`: its length is
    that of the standard encoding, and so is its last group (only the last group has spare bits another
    spelling could set). Costs a few bytes' encoding, not the image's."""
    if len(data) != 4 * -(-len(raw) // 3):
        return False
    tail = len(raw) % 3 or 3
    return not raw or base64.b64encode(raw[-tail:]).decode("ascii") == data[-4:]


def _with_refs(content: Content, refs: Mapping[int, Ref]) -> Content:
    """`content` with the data of part i replaced by `refs[i]`, in the data's place (keys in their order:
    put back, the part reads the same)."""
    if not refs:
        return content
    parts = [
        {k: ({**v, "data": refs[i]} if k == "inlineData" else v) for k, v in part.items()}
        if i in refs
        else part
        for i, part in enumerate(_parts(content))
    ]
    return {k: (parts if k == "parts" else v) for k, v in content.items()}


def inline(contents: Sequence[Content], store: OutputStore) -> list[Content]:
    """The contents to send: each reference put back as the base64 of its file, checked by its sha256."""
    return [_inline_content(content, store) for content in contents]


def _inline_content(content: Content, store: OutputStore) -> Content:
    parts = content.get("parts")
    if not isinstance(parts, list) or not any(_is_ref(p) for p in parts):
        return content
    out = []
    for part in parts:
        if not _is_ref(part):
            out.append(part)
            continue
        data = base64.b64encode(_read(part["inlineData"]["data"], store)).decode("ascii")
        new_inline = {k: (data if k == "data" else v) for k, v in part["inlineData"].items()}
        out.append({k: (new_inline if k == "inlineData" else v) for k, v in part.items()})
    return {k: (out if k == "parts" else v) for k, v in content.items()}


def _is_ref(part: Any) -> bool:
    return (
        isinstance(part, dict)
        and isinstance(part.get("inlineData"), dict)
        and isinstance(part["inlineData"].get("data"), dict)
    )


def _read(ref: Mapping[str, Any], store: OutputStore) -> bytes:
    sha = ref.get("sha256")
    if isinstance(ref.get("file"), str):
        name = ref["file"]
        data = store.backend.get(name)
        if data is None:
            raise HistoryError(f"{name}, an image of the kept conversation, is gone")
        if hashlib.sha256(data).hexdigest() != sha:
            raise HistoryError(
                f"{name} changed since its answer was kept: its conversation cannot be sent back"
            )
        return data
    if isinstance(ref.get("input"), str) and isinstance(sha, str):
        try:
            source = ref["input"]  # a file's path, or an object's URL (a manifest in a bucket)
            return read_input(source if is_url(source) else Path(source), sha).data
        except InputChangedError as exc:
            raise HistoryError(str(exc)) from None
    raise HistoryError(f"a kept conversation names an image it cannot find: {ref!r}")


def chain_turns(store: OutputStore, req: PlannedRequest, upto: int) -> list[Content]:
    """The contents of turns 0..upto-1 of `req`'s edit chain, from its chain file, as far as their keys are
    the plan's; `HistoryError` if they are not all there."""
    if upto == 0:
        return []  # nothing to read (a plain request: no chain file to look for)
    saved = store.load_chain(req.job_id, req.request_index) or {}
    turns = saved.get("turns") or []
    contents: list[Content] = []
    for turn_index in range(upto):
        want = idempotency_key(req.job, req.request_index, turn_index)
        if turn_index >= len(turns) or turns[turn_index].get("key") != want:
            name = store.chain_name(req.job_id, req.request_index)
            raise HistoryError(f"{name} lacks turn {turn_index} of this chain")
        contents += turns[turn_index]["contents"]
    return contents


@dataclass(frozen=True)
class History:
    """A conversation as kept: the first `chain_turns` turns of the request's edit chain (kept once, in its
    chain file: `chain_turns`), then `contents`, in stored form (references in place)."""

    chain_turns: int = 0
    contents: list[Content] = field(default_factory=list)

    def sent(self, store: OutputStore, req: PlannedRequest) -> list[Content]:
        """The contents to send, as the service returned them (`HistoryError` if they cannot be)."""
        return chain_turns(store, req, self.chain_turns) + inline(self.contents, store)

    def check(self, store: OutputStore, req: PlannedRequest) -> None:
        """`HistoryError` unless every turn and every file it names is there as it was kept."""
        chain_turns(store, req, self.chain_turns)
        for content in self.contents:
            for part in _parts(content):
                if _is_ref(part):
                    _read(part["inlineData"]["data"], store)


def kept(store: OutputStore, req: PlannedRequest) -> History:
    """The whole conversation behind `req`'s answer, ending with its model content; `HistoryError` if it
    was not kept."""
    if req.variant == 1 and req.job.turns:
        return History(req.turn_index + 1)
    saved = store.load_conversation(req)
    contents = saved.get("contents") if saved is not None else None
    turns = saved.get("chain_turns", 0) if saved is not None else 0
    if not isinstance(contents, list) or not isinstance(turns, int):
        raise HistoryError(f"no conversation was kept for {req.idempotency_key}")
    return History(turns, contents)


def earlier(store: OutputStore, req: PlannedRequest) -> History:
    """What `req` sends before its own user turn: the edited variant's whole conversation for an edit,
    the chain's earlier turns for a later turn of a chain, else nothing."""
    if req.edit_of is not None:
        return kept(store, req.edit_of.base)
    return History(req.turn_index)


def keeper(
    store: OutputStore, req: PlannedRequest, before: History, sent_turn: Content
) -> Callable[[Result, RequestRecord], None]:
    """The `on_answer` of a native request: keep `before`, the user turn sent and the model content
    answered, images as references to their files (written right after, under these names)."""
    hashes: Sequence[str | None] = req.reference_sha256 or [None] * len(req.reference_images)
    inputs = list(zip(req.reference_images, hashes, strict=False))

    def keep(result: Result, record: RequestRecord) -> None:
        content = getattr(result, "model_content", None)
        if not isinstance(result, ImageResult) or content is None:
            return  # nothing to edit later
        files = [(path, image.data) for path, image in zip(record.paths, result.images, strict=False)]
        contents = [*before.contents, compact_user(sent_turn, inputs), compact_model(content, files)]
        kept: dict[str, Any] = {"chain_turns": before.chain_turns} if before.chain_turns else {}
        store.save_conversation(req, {**kept, "contents": contents})

    return keep
