"""What processes sharing one data directory coordinate with: an exclusive file lock, waited for a bounded time.

Used around the SQLite store's vector index files and the ML layer's training exports, which several server, CLI
and SDK processes may rewrite at once. On a platform without `fcntl` (Windows) it excludes nothing.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import IO

from .errors import StoreError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_WAIT_S = 30.0


def acquire_exclusive(path: Path, what: str, timeout_s: float = LOCK_WAIT_S) -> IO[bytes] | None:
    """Hold an exclusive `flock` on `path` (created if missing) until the returned handle is closed; None where
    there is no `fcntl`. Another holder past `timeout_s` (a process stopped with Ctrl-Z, a hung one) is a
    StoreError that names the file, rather than a wait without end or message."""
    if fcntl is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")
    except OSError as error:
        raise StoreError(
            f"Cannot open the lock file {path} that guards {what} ({error.strerror or error}); it must be a plain "
            "file the server may write (remove whatever is there: it is created again)."
        ) from None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                raise StoreError(
                    f"Another process has held {path} for {timeout_s:.0f} s ({what}): an amfs-server, CLI or SDK "
                    "process that is stopped (Ctrl-Z) or hung. Resume or end it, then try again."
                ) from None
            time.sleep(0.05)
        except BaseException:
            handle.close()
            raise


def hold_while_open(fd: int) -> None:
    """Mark a file being written by this process (an exclusive `flock` on `fd`, gone when the process is, however it
    ends), so that `remove_if_abandoned` leaves it alone. FileNotFoundError when the file was removed as abandoned
    before the lock was taken (it had just been made)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
    if os.fstat(fd).st_nlink == 0:
        raise FileNotFoundError(errno.ENOENT, "removed before it could be held (retry)")


def remove_if_abandoned(name: str | Path, dir_fd: int | None = None) -> bool:
    """Remove the file `name` (relative to `dir_fd` if given) unless a live process holds it by `hold_while_open`;
    whether it is gone. Checked and removed under its lock, and only while the name still leads to the file that was
    checked, so a file a writer has just made in its place is kept. A link is removed, never followed; anything but
    a regular file (a FIFO would block an open) is left. Without `fcntl` nothing can be told, and it is removed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError as error:
        if error.errno != errno.ELOOP:
            return False
        os.unlink(name, dir_fd=dir_fd)  # a link (O_NOFOLLOW): removing it touches nothing it points to
        return True
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            return False
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    finally:
        os.close(fd)
