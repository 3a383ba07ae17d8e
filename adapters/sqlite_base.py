"""SQLite plumbing shared by the embedded stores: one file in WAL mode, `user_version` migrations,
`BEGIN IMMEDIATE` transactions, and one connection used from worker threads behind a lock (so the
event loop never blocks on disk and concurrent writers in other processes serialise)."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from ..core.errors import StorageFullError, StoreError
from .sql_common import SQLITE

T = TypeVar("T")

BUSY_TIMEOUT_MS = 60_000
FRESH_FILE_GRACE_S = 2.0  # see `_stays_empty`
OPEN_LOCKED_RETRY_S = 10.0  # how long opening waits out another process's lock before saying so


_ts = SQLITE.ts  # datetime -> epoch seconds, as the SQLite stores keep times
_dt = SQLITE.dt


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno == errno.ENOSPC
    return getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


class SQLiteDatabase:
    """Base of the SQLite stores. Subclasses set MIGRATIONS (each entry one schema step), DESCRIPTION
    (what the file is, for messages) and LOCATION_HINT (which setting moves it)."""

    MIGRATIONS: list[str] = []
    DESCRIPTION = "SQLite store"
    LOCATION_HINT = "set AMFS_DATA_DIR"
    secure_delete = True
    """Zero deleted content (PRAGMA secure_delete). Off only to measure what it costs (`amfs-server bench erase`)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.RLock()

    async def open(self) -> None:
        await asyncio.to_thread(self._open_sync)

    def _stays_empty(self) -> bool:
        """Whether the database file is empty and stays so for FRESH_FILE_GRACE_S: another process that created it
        an instant ago (two servers starting on a new data dir) writes its header within milliseconds."""
        wal = self.path.with_name(self.path.name + "-wal")
        deadline = time.monotonic() + FRESH_FILE_GRACE_S
        while self.path.stat().st_size == 0 and not _has_content(wal):
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.05)
        return False

    def _open_sync(self) -> None:
        with self._lock:
            if self._conn is not None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise StoreError(
                    f"The data directory {self.path.parent} (or a folder above it) is a file, not a folder; "
                    "point AMFS_DATA_DIR (data_dir) at a folder."
                ) from None
            existed = self.path.exists()
            if existed and self._stays_empty():
                # Opening writes the header at once, so an empty file that stays empty was cut short (disk
                # full, a failed copy); starting it empty would hide that every memory is gone.
                raise StoreError(self._damaged("it is empty (0 bytes), yet it was not created by this start"))
            deadline = time.monotonic() + OPEN_LOCKED_RETRY_S
            while True:
                try:
                    self._connect(existed)
                    return
                except sqlite3.OperationalError as error:
                    self._close_quietly()
                    if "locked" not in str(error) and "busy" not in str(error):
                        raise StoreError(self._unopenable(str(error))) from error
                    if time.monotonic() >= deadline:  # not damage: another process holds it
                        raise StoreError(
                            f"The {self.DESCRIPTION} at {self.path} stayed locked by another process for "
                            f"{OPEN_LOCKED_RETRY_S:.0f} s ({error}); nothing was changed. Try again, or stop the "
                            "process that holds it."
                        ) from error
                    time.sleep(0.05)  # another process is switching it to WAL or migrating it: seconds at most
                except sqlite3.DatabaseError as error:
                    self._close_quietly()
                    raise StoreError(self._unopenable(str(error))) from error

    def _connect(self, existed: bool) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
        self._conn = conn
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # Deleted rows are overwritten with zeros instead of lingering in free space (forget, clear,
        # retention); `_checkpoint` then takes the old pages out of the WAL.
        conn.execute(f"PRAGMA secure_delete = {'ON' if self.secure_delete else 'OFF'}")
        if existed:
            problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)").fetchall()]
            if problems != ["ok"]:
                self._close_quietly()
                raise StoreError(self._damaged(f"the integrity check failed: {'; '.join(problems)[:300]}"))
        self._migrate()

    def _close_quietly(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _unopenable(self, reason: str) -> str:
        """A file SQLite cannot open or write is not thereby damaged: a read-only folder got the damaged-store
        advice, which followed (move it aside, import the last export) loses every write since that export."""
        if any(sign in reason for sign in ("unable to open database file", "readonly database")):
            return (
                f"Cannot open the {self.DESCRIPTION} at {self.path}: {reason}. Nothing was changed, and the file is "
                "not known to be damaged: check that this user can read and write the file and its folder (the store "
                f"keeps its journal beside it; a read-only folder or file system cannot hold one), or "
                f"{self.LOCATION_HINT} to use another location."
            )
        if "file is not a database" in reason and not self._has_sqlite_header() and not self._whole_pages():
            return (  # never a store (AMFS_LEARNING_PATH=/etc/hostname got "move it aside")
                f"Cannot open the {self.DESCRIPTION} at {self.path}: it is not an SQLite database at all. Nothing was "
                f"changed; {self.LOCATION_HINT} to point at a store's file or a new one."
            )
        return self._damaged(reason)

    def _whole_pages(self) -> bool:
        """A file of whole 512-byte multiples, as every SQLite database is: one whose header was overwritten is a
        damaged store and keeps the damaged-store advice."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return False
        return size >= 512 and size % 512 == 0

    def _has_sqlite_header(self) -> bool:
        try:
            with open(self.path, "rb") as file:
                return file.read(16) == b"SQLite format 3\x00"
        except OSError:
            return False

    def _damaged(self, reason: str) -> str:
        return (
            f"Cannot open the {self.DESCRIPTION} at {self.path}: {reason}. Nothing was changed. Restore the file "
            f"from a backup, or move it aside and load your last export (`amfs-server memory import FILE`); "
            f"or {self.LOCATION_HINT} to use another location."
        )

    def _migrate(self) -> None:
        with self._transaction() as conn:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            if current > len(self.MIGRATIONS):
                raise StoreError(
                    f"The {self.DESCRIPTION} at {self.path} has schema version {current}, newer than this "
                    f"amfs-server ({len(self.MIGRATIONS)}). Upgrade amfs-server."
                )
            for number, script in enumerate(self.MIGRATIONS[current:], start=current + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number}")

    def _checkpoint(self, vacuum: bool = False) -> None:
        """After a delete that must leave no byte behind: copy the WAL into the file and truncate it
        (pages that held the deleted rows live on in the WAL until then), and with `vacuum` rewrite
        the file without free pages. A reader in another process that still holds an old snapshot
        makes the checkpoint partial; the next one (at the latest when the last connection closes)
        finishes it. Call with the lock held, outside a transaction."""
        conn = self._connection()
        if vacuum:
            conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _before_close(self) -> None:
        """Hook: persist in-process state (called with the lock held, connection still open)."""

    async def close(self) -> None:
        def close_sync() -> None:
            with self._lock:
                if self._conn is not None:
                    self._before_close()
                    self._conn.close()
                    self._conn = None

        await asyncio.to_thread(close_sync)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:  # SQLite has already rolled back after some errors (SQLITE_FULL, SQLITE_IOERR)
                conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"The {self.DESCRIPTION} is not open; call `await store.open()` first.")
        return self._conn

    async def _run(self, fn: Callable[[], T]) -> T:
        def locked() -> T:
            with self._lock:
                try:
                    return fn()
                except (sqlite3.Error, OSError) as error:
                    if _is_disk_full(error):
                        raise StorageFullError(self._disk_full_message(error)) from error
                    raise

        return await asyncio.to_thread(locked)

    def _disk_full_message(self, error: BaseException) -> str:
        return (
            f"The disk holding the {self.DESCRIPTION} ({self.path.parent}) is full ({error}); nothing was written. "
            f"Free space there, or {self.LOCATION_HINT} to a disk with room. Reads keep working meanwhile."
        )
