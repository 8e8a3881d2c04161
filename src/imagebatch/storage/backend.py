"""The one interface of an output location's record (`Backend`): what the layers above ask of a place
that keeps a run's record, whatever kind of place it is. A local folder (`storage.folder.FolderBackend`)
and an object store's prefix (`storage.bucket.BucketBackend`) implement it; `storage.kinds.open_location`
picks one from `--out`, once. Every way the two differ (a lock or a lease, appended files or segments, a
rename or a multipart upload) is a method here, so nothing above storage/ asks which kind it has.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from imagebatch.storage.appendlog import WriteWatch
from imagebatch.storage.bounded import BadLine
from imagebatch.storage.location import Location

MakeThumbnail = Callable[[Path, Path], None]
"""Writes the thumbnail of the local image file (first) to the local file (second): `work.thumbnails`'
`save_thumbnail`; OSError or ValueError if it cannot."""

Served = tuple[bytes, str]
"""A file's bytes, to serve, and the name of the file they are (its suffix tells their type)."""


class LocalCopy(Protocol):
    """A local folder holding a location's files for a reader that needs paths (the report): a folder is
    its own copy; a bucket's is a staging folder, its files fetched in, what is built uploaded back."""

    folder: Path

    def fetch(self, names: Iterable[str], placeholders: Iterable[str] = ()) -> None:
        """Have the files `names` in the folder, and `placeholders` as empty files dated 1970 where they
        are not there (an image whose thumbnail is: the report keeps the thumbnail)."""

    def publish(self, names: Iterable[str]) -> None:
        """Have the files `names` written in the folder in the location too."""

    def remove(self, names: Iterable[str]) -> None:
        """Remove `names` from the location."""

    def top_names(self) -> list[str]:
        """The names of the location's files at its top (not in a sub-folder), sorted."""


class DecisionTail(Protocol):
    """One reader's place in the review decisions, read again as reviewers add to them."""

    def read(self) -> tuple[list[tuple[str, bytes]], bool]:
        """The decision lines added since the last read, each with where it is as a message names it, and
        whether they are the whole record read again from its start (the reader replays it anew)."""

    def wrote(self, name: str, line: bytes) -> bool:
        """Note the line this reader's process just added as `name` (`Backend.add_decision`): True if it
        is taken as read (the reader applies it itself), False if the next `read` gives it."""


class Backend(Location, Protocol):
    """An output location: named objects (`Location`), append-only records, and the hold a run takes."""

    watch: WriteWatch
    """Told of the first write that failed (a full disk, a lost lease): the run stops dispatching at it."""
    shard: str | None
    """`I-of-N` for one shard of a sharded run (its own records and hold), else None."""
    spool_folder: Path
    """Where a run keeps its records on disk until results.csv is written (the folder itself, or the
    machine's temporary folder for a place that has no local disk)."""
    title: str
    """The location's short name, as a page's title shows it (a folder's name, a bucket's URL)."""
    release_wait: float
    """How long a sharded run's parent waits, at most, for a shard that still holds its own hold after
    its process was ended (a lock is let go with its process; a lease only when it expires)."""

    # -- the hold: who may write --

    def hold(self) -> AbstractContextManager[None]:
        """Hold the location for one run alone (refused with `OutputLockedError` while another holds it);
        what killed shards left is merged first. Holding it already (`hold_sharded`) goes on holding it."""

    def hold_sharded(self, shards: int) -> AbstractContextManager[None]:
        """Hold the location for the parent of a sharded run, from its start to its end."""

    def shard_hold(self) -> AbstractContextManager[None]:
        """Hold the location as shard `shard`: shared with the other shards, alone for this shard."""

    def shut_out_shards(self) -> None:
        """A sharded run's parent is about to merge what its shards wrote: from now on no shard of it may
        start (one started late, by a worker once Prefect's server was back, would write beside the
        merge). Called while the parent holds the location alone (`hold`)."""

    def in_use(self) -> str | None:
        """Who is sending into the location now (a run, a shard of one), or None; holds nothing."""

    def shard_held(self, shard: str) -> bool:
        """Whether shard `shard` holds its own hold now."""

    # -- append-only records --

    def append(self, kind: str, record: dict[str, Any], *, sync: bool) -> None:
        """Append one record to `kind` (`layout.JOURNAL` or `layout.USAGE_LEDGER`); with `sync`, return
        once it is durable (with every record appended before it)."""

    def sync(self) -> None:
        """Make every record appended so far durable; a run holding the location alone also compacts
        what a rerun reads (the end of a run is the one caller)."""

    def records(self, kind: str, bad: BadLine | None = None) -> Iterator[dict[str, Any]]:
        """The records of `kind`, in the order they were appended, across every run into the location.
        `bad` is told of each line skipped as bad (`storage.bounded`)."""

    def has_records(self) -> bool:
        """Whether a run has journaled anything here (one cheap look)."""

    def keep_conversation(self, stem: str, key: str, record: dict[str, Any]) -> None:
        """Keep the conversation behind the answer whose files are `images/<stem>...` (its key `key`),
        without a sync of its own: a lost one only makes a later edit a new sample."""

    def kept_conversation(self, stem: str, key: str) -> bytes | None:
        """The bytes `keep_conversation` kept for `stem` and `key`, or None."""

    # -- whole objects --

    def make_ready(self) -> None:
        """Before a run: the location made and shown writable, and every record in it a file (a FIFO in
        results.csv's place refused now, not when a replay reaches it); OSError, or `RecordError`, if
        not. Nothing for a bucket: its lease, taken next, proves that it can be written."""

    def prepare(self) -> None:
        """Make what a run writes into exist (a folder's sub-folders); nothing for a bucket."""

    def files_exist(self, names: list[str], settled: bool) -> bool:
        """Whether the output files `names` are all there; `settled`: their outcome was journaled after
        they were written (a place whose look-up costs a request per file trusts that)."""

    def stamp(self, name: str) -> object:
        """A cheap token that changes when `name` is replaced (a folder: its time, size and inode), for a
        reader that reads it again only then; None when it cannot be told (read it again). A bucket's is
        always the same: a request per look is not worth it, so its readers read it once."""

    def records_stamp(self) -> list[Any]:
        """A token (JSON-able) that changes whenever the journal, the usage ledger or a file of
        `layout.STAMPED` changes, is replaced or goes: a folder's files' sizes, times and inodes, a
        bucket's objects' sizes and ETags from two listings. Cheap: no record is read."""

    def replacing(self, name: str) -> AbstractContextManager[BinaryIO]:
        """A binary file to write `name` into, row by row, never whole in memory: it replaces `name`
        whole when the block ends, or not at all if the block raises."""

    def read_lines(self, name: str) -> Generator[bytes, None, None]:
        """The lines of the file `name` (without their newlines), read as a stream, never whole in memory
        (a folder reads the file, a bucket streams the object); none if it is not there. A line over
        `storage.bounded.MAX_RECORD_LINE_BYTES` is refused (`RecordError`); a folder's last line without
        its newline (a write cut short) is left out. Close the iterator to stop reading early."""

    def put_derived(self, name: str, data: bytes) -> None:
        """Write a file made from others (a thumbnail), best effort: not synced, a failure ignored (its
        reader makes any that is missing)."""

    def local_copy(self, folder: Path | None = None) -> AbstractContextManager[LocalCopy]:
        """A local folder holding this location's files, fetched on demand (`LocalCopy.fetch`) into
        `folder` when given and the location is not local, else into a temporary folder removed after."""

    # -- review decisions: one record many reviewers add to at once --

    def add_decision(self, line: bytes, stamp: str) -> str:
        """Add one decision line, durable before it returns, whatever other reviewers add meanwhile; the
        name of the object made for it (`stamp` begins it), or "" where decisions share one file."""

    def decision_lines(self, bad: BadLine | None = None) -> Iterator[tuple[int, str, bytes]]:
        """Every decision line, oldest first: its number, where it is as a message names it, its bytes.
        `bad` is told the number of a line over `storage.bounded`'s bound (without it, refused)."""

    def decision_tail(self) -> DecisionTail:
        """A reader's place in the decisions, from their start."""

    # -- files delivered into the location (an export's DEST) or read from it (its OUT) --

    @property
    def identity(self) -> str:
        """The location's canonical name, to tell whether two are the same or one holds the other."""

    write_threads: int
    """How many files to place at once (a rename needs one thread; a PUT is a round trip)."""

    def check(self) -> str | None:
        """Why this place cannot be used (a bucket that does not answer, a folder that is a file), in a
        few words; None if it can."""

    def name_room(self, most: int, reserved: int) -> int:
        """The bytes a file's name may take here, at most `most`, with `reserved` more for the folder a
        file may be moved into (an object's key is bounded, prefix included)."""

    def exclusive(self, name: str, what: str) -> AbstractContextManager[None]:
        """Held by this process alone for the block (`name`: the lock object, where one is needed);
        `OutputLockedError`, saying `what` is running and what to do, while another holds it."""

    def staging(self, prefix: str) -> AbstractContextManager[Path]:
        """A fresh local folder (named from `prefix`) to make files in before `place`, removed at the end
        however the block ends: inside the folder where there is one (a rename on one file system)."""

    def sources(self, names: list[str]) -> Iterator[str | bytes | None]:
        """Each file of `names`, for a reader that may be another process: a local path, or its bytes
        (None if not there), fetched just ahead of the reader."""

    def leads_out(self, name: str) -> bool:
        """Whether `name` leads out of the location through a symbolic link (never for an object)."""

    def plain_file(self, name: str) -> bool:
        """Whether `name` could be a file written here: inside, not a link, a regular file."""

    def image(self, name: str) -> bytes | None:
        """The bytes of the file `name`, to serve a reader of the location (a review's browser); None if
        it is not there, or (a folder) is not a regular file inside it: a link out is never followed."""

    def thumbnail(self, name: str, source: str | Path | None, make: MakeThumbnail) -> Served | None:
        """The thumbnail `name` (under thumbs/) of `source`, a file of the location by its name or a local
        path (a reference image the manifest names), and the name of what the bytes are. A folder makes it
        in place with `make` where it is missing or older than its source, never through a link out, and
        None if it cannot. A bucket only reads the one a run made, else the source itself if it is the
        location's (the name says which), else None: nothing is fetched to be made there."""

    def link(self, name: str) -> str | None:
        """Where a person on another machine opens `name`: an object's URL (a bucket is reached from
        anywhere its credentials are); None for a folder's file, which is on this machine's disk only."""

    def links(self, names: Iterable[str]) -> list[str]:
        """Those of `names` that are symbolic links (none for objects)."""

    def place(self, staged: Path, name: str, replace: bool) -> bool:
        """Move the local file `staged` to `name`, whole; `replace` or only while the name is free
        (False if another file took it meanwhile)."""

    def keep_copy(self, name: str, kept: str) -> None:
        """Keep a copy of `name` (if there) as `kept`, before `name` is replaced."""

    def move(self, name: str, to: str | None) -> None:
        """Move `name` to `to`, or remove it (None)."""
