"""A local folder's whole-file operations for a writer that delivers into it (an export's DEST) or reads
it by path (its OUT): held alone by `flock` on the folder itself, files made in a staging folder inside it
and renamed into place, kept and moved aside by hard link and rename, and never through a symbolic link
that leads out of the folder. `storage.folder.FolderBackend` is one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from imagebatch.storage import layout
from imagebatch.storage.location import LocalFolder, OutputLockedError, OutsideRootError, confined

if TYPE_CHECKING:
    from imagebatch.storage.backend import MakeThumbnail, Served


_SHARED_SOURCE = threading.Lock()
"""Many cards share a reference image (a source outside the folder): one thread makes its thumbnail while
the others wait, rather than each make it again."""


class FolderFiles(LocalFolder):
    """The delivery side of a local folder (`storage.backend.Backend`'s "files delivered" methods)."""

    write_threads = 1
    """Files placed one at a time: a rename costs no wait worth a thread."""

    @property
    def identity(self) -> str:
        return str(self.root.resolve())

    def check(self) -> str | None:
        if self.root.exists() and not self.root.is_dir():
            return "is a file, not a folder"
        return None

    def name_room(self, most: int, reserved: int) -> int:
        return most

    @contextlib.contextmanager
    def exclusive(self, name: str, what: str) -> Iterator[None]:
        """The folder locked (made if missing; no file is left in it, and the lock goes with the
        process); the folders made for it removed at the end if still empty, so that a refused writer
        leaves no folder behind."""
        created = [f for f in (self.root, *self.root.parents) if not f.exists()]  # deepest first
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputLockedError(f"{what} is running; wait for it to finish") from None
            yield
        finally:
            os.close(fd)
            for folder in created:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty

    @contextlib.contextmanager
    def staging(self, prefix: str) -> Iterator[Path]:
        """Inside the folder (hidden), so that placing a file is a rename on one file system."""
        path = self.root / f"{prefix}{uuid.uuid4().hex[:12]}"
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def sources(self, names: list[str]) -> Iterator[str | bytes | None]:
        """Each file's path: the worker reading it may be another process."""
        return (str(self.root / name) for name in names)

    def leads_out(self, name: str) -> bool:
        try:
            confined(self.root, name)
        except OutsideRootError:
            return True
        return False

    def plain_file(self, name: str) -> bool:
        try:
            path = confined(self.root, name)
        except OutsideRootError:
            return False
        return not path.is_symlink() and path.is_file()

    def links(self, names: Iterable[str]) -> list[str]:
        return [name for name in names if (self.root / name).is_symlink()]

    def link(self, name: str) -> str | None:
        return None

    def image(self, name: str) -> bytes | None:
        source = served_file(self.root, name)
        return None if source is None else source.read_bytes()

    def thumbnail(self, name: str, source: str | Path | None, make: MakeThumbnail) -> Served | None:
        """Made once into thumbs/, remade if its source is newer; neither thumbs/ nor the thumbnail may
        lead out of the folder, nor may a source named in it."""
        real = served_file(self.root, source) if isinstance(source, str) else source
        if real is None or not all(self._not_out(p) for p in (layout.THUMBS_DIR, name)):
            return None
        target = confined(self.root, name)
        try:
            with _SHARED_SOURCE if isinstance(source, Path) else contextlib.nullcontext():
                if not target.exists() or target.stat().st_mtime < real.stat().st_mtime:
                    make(real, target)
        except (OSError, ValueError):  # not a readable image, or too large to thumbnail
            return None
        thumb = served_file(self.root, name)
        return None if thumb is None else (thumb.read_bytes(), name)

    def _not_out(self, name: str) -> bool:
        """Whether `name`, where it exists, lies inside the folder (no link out of it)."""
        return not os.path.lexists(self.root / name) or served_path(self.root, name) is not None

    def place(self, staged: Path, name: str, replace: bool) -> bool:
        """A rename; a new name by a hard link, which fails if the name was taken meanwhile."""
        target = confined(self.root, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if replace:
            os.replace(staged, target)
            return True
        try:
            os.link(staged, target)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links
            if target.exists():
                return False
            os.replace(staged, target)
        return True

    def keep_copy(self, name: str, kept: str) -> None:
        """A hard link: the same file, which a replacement's rename then leaves there alone."""
        target, path = confined(self.root, name), self._made_path(kept)
        try:
            os.link(target, path)
        except FileNotFoundError:
            return
        except OSError:  # a file system without hard links
            shutil.copy2(target, path)

    def move(self, name: str, to: str | None) -> None:
        """A rename (a copy onto another file system); the folders it leaves empty removed."""
        path = confined(self.root, name)
        if to is None:
            path.unlink(missing_ok=True)
        else:
            target = self._made_path(to)
            with contextlib.suppress(FileNotFoundError):  # gone meanwhile: nothing to move
                try:
                    os.replace(path, target)
                except OSError:  # another file system under the folder
                    shutil.move(path, target)
        folder = path.parent
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def _made_path(self, rel: str) -> Path:
        """The path `rel` for a write: no folder on its way a symbolic link (`OutsideRootError`
        otherwise), its folders made."""
        path = confined(self.root, rel)
        folder = self.root
        for part in Path(rel).parts[:-1]:
            folder = folder / part
            if folder.is_symlink():
                raise OutsideRootError(f"{folder} is a symbolic link: nothing is moved through it")
            folder.mkdir(exist_ok=True)
        return path


def served_path(root: Path, name: str) -> Path | None:
    """What `root/name` really is (links resolved), or None if it is missing or lies outside `root`: the
    rule every write into OUT follows too (`confined`), then the file must exist."""
    try:
        return confined(root, name).resolve(strict=True)
    except (OSError, RuntimeError):  # outside, missing, or a loop of links
        return None


def served_file(root: Path, name: str) -> Path | None:
    """The regular file `root/name` really is, if it is one and inside `root` (`served_path`)."""
    real = served_path(root, name)
    return real if real is not None and real.is_file() else None
