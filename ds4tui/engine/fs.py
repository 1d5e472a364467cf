"""Why a folder that exists cannot be written into, told apart by cause.

``os.access`` alone answers "no" alike for a read-only file system and for a folder this user may
not write into, and says nothing of a full disk; the remedy differs for each (remount or another
folder, free space, change the folder's permissions).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def unwritable(folder: str | os.PathLike) -> int | None:
    """Why nothing can be written into the existing folder ``folder``, as an errno code, or None
    when it can as far as the file system says: ``errno.EROFS`` on a read-only file system (statvfs
    ``ST_RDONLY``), ``errno.EACCES`` when this user may not write into it (``os.access``
    W_OK|X_OK), ``errno.ENOSPC`` when its disk has no free block left for this user (statvfs
    ``f_bavail`` 0).  A file system with no blocks at all (``/proc``, ``/sys``) is not full: a folder
    made and removed there says whether it takes files, and the OS error of that is the code."""
    try:
        st = os.statvfs(folder)
    except OSError:
        st = None
    if st is not None and st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if not os.access(folder, os.W_OK | os.X_OK):
        return errno.EACCES
    if st is not None and st.f_bavail == 0 and st.f_blocks == 0:
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".ds4tui-write-check-", dir=folder))
        except OSError as exc:
            return exc.errno or errno.EACCES
        return None
    if st is not None and st.f_bavail == 0:
        return errno.ENOSPC
    return None


#: The codes :func:`unwritable` reads off the file system; any other is the OS error of a folder that
#: could not be made there (a file system with no blocks, such as /proc), said as it is.
NAMED_CODES = frozenset((errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM))


def found_in(folder: str | os.PathLike, code: int) -> str:
    """What :func:`unwritable`'s ``code`` found at ``folder``, in words naming it."""
    if code not in NAMED_CODES:
        return f"{folder}, which cannot be written: {os.strerror(code)}"
    return {errno.EROFS: f"{folder} on a read-only file system",
            errno.ENOSPC: f"no space left on the disk of {folder}"}.get(code, f"no permission to write in {folder}")


def fix_for(folder: str | os.PathLike, code: int) -> str:
    """What to do about :func:`unwritable`'s ``code`` at ``folder`` (a caller adds its own other
    folder to choose)."""
    folder = Path(folder)
    if code not in NAMED_CODES:
        return f"choose a folder outside {folder}"
    return {errno.EROFS: f"remount the file system of {folder} read-write",
            errno.ENOSPC: f"free some space on the disk of {folder}"}.get(code, f"make {folder} writable for this user")
