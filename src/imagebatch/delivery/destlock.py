"""One export into a DEST at a time: two at once would each set aside, replace and list files from what
it read of DEST before the other wrote, leaving files export.csv does not list (and so that no later
export sets aside) and summaries naming moves the other one made.

A local DEST is locked with `flock` on the folder itself (no file is left in it; the lock goes with the
process, however it ends). A bucket has no such lock: the export creates the object `LOCK_OBJECT` under
DEST's prefix (create-only, so one of two exports wins) and deletes it when it ends; an export killed
outright (SIGKILL, a lost machine) leaves it, and the next export is refused naming it: delete it once
no export is running. The second export is refused (`ExportRefused`, exit 2) before it reads DEST.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from imagebatch.delivery.exportplan import ExportRefused
from imagebatch.storage.backend import Backend
from imagebatch.storage.location import OutputLockedError

LOCK_OBJECT = ".imagebatch-export.lock"


@contextlib.contextmanager
def exclusive(dest: Backend) -> Iterator[None]:
    """DEST held by this export alone for the block; `ExportRefused` if another holds it."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(dest.exclusive(LOCK_OBJECT, "another export into it"))
        except OutputLockedError as exc:
            raise ExportRefused([f"--to {dest.url}: {exc}"]) from None
        yield
