"""What processes sharing one data directory coordinate with: an exclusive file lock, waited for a bounded time.

Used around the SQLite store's vector index files and the ML layer's training exports, which several server, CLI
and SDK processes may rewrite at once. On a platform without `fcntl` (Windows) it excludes nothing.
"""

from __future__ import annotations

import os
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
    ends), so that `abandoned` can tell a leftover of a killed writer from a file still being written."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def abandoned(path: Path) -> bool:
    """Whether no process holds `path` by `hold_while_open` (a link is never held: True). Without `fcntl` nothing
    can be told: False."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # a link (O_NOFOLLOW) or something unreadable: no writer of ours holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
