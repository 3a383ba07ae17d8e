"""PostgreSQL plumbing shared by the entry store (`postgres.py`) and the learning store
(`postgres_learning.py`): the schema rule, start-up under one advisory lock, versioned migrations with a
ledger table, the connection pool, and transactions that retry on deadlock and turn driver errors into
the core's errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import shlex
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from ..core.errors import ConflictError, StorageFullError, StoreError, ValidationError

T = TypeVar("T")
logger = logging.getLogger("amfs_server.adapters.postgres")

DEFAULT_SCHEMA = "amfs"
CONNECT_TIMEOUT_S = 10.0
# One database-wide lock for extension + schema creation and migrations (a bigint key; per-key write
# locks use the two-int4 form, a separate key space).
MIGRATION_LOCK_KEY = 0x616D_6673_6D69_6772  # "amfsmigr"
MAX_TX_ATTEMPTS = 8
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def schema_from_dsn(dsn: str) -> str | None:
    """The first schema of the DSN's search path, if it names one.

    Understands libpq's `?options=-csearch_path%3Dname` (also `-c search_path=name`, `--search_path=name`)
    and asyncpg's `?search_path=name`; `$user` and an empty path name none.
    """
    query = parse_qs(urlsplit(dsn).query)
    path: str | None = None
    if query.get("search_path"):
        path = query["search_path"][-1]
    elif query.get("options"):
        try:
            tokens = shlex.split(query["options"][-1])
        except ValueError:
            tokens = query["options"][-1].split()
        settings: list[str] = []
        for index, token in enumerate(tokens):
            if token == "-c" and index + 1 < len(tokens):
                settings.append(tokens[index + 1])
            elif token.startswith("-c"):
                settings.append(token[2:])
            elif token.startswith("--"):
                settings.append(token[2:])
        for setting in settings:
            name, sep, value = setting.partition("=")
            if sep and name.strip().replace("-", "_").lower() == "search_path":
                path = value
    if path is None:
        return None
    first = path.split(",")[0].strip().strip('"')
    return first if first and first != "$user" else None


def redact_dsn(dsn: str) -> str:
    """The DSN without its password or query (which may carry one), for messages. Split by hand at the last '@':
    a password with an unencoded '/', '?' or '#' makes urlsplit take part of it for the host and port."""
    scheme, _, rest = dsn.partition("://")
    userinfo, at, location = rest.rpartition("@")
    user = userinfo.split(":", 1)[0] if at else ""
    location = location.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}://{user + '@' if user else ''}{location or 'localhost'}"


def rowcount(status: str) -> int:
    """`DELETE 3` -> 3."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except (ValueError, AttributeError):
        return 0


async def vacuum(pool: Any, where: str, *tables: str) -> bool:
    """VACUUM after a delete that must not linger: dead tuples (the deleted values) stay readable in the
    table files until vacuum reclaims them. It runs outside a transaction; a failure is logged, not
    raised (autovacuum gets there later), since the delete itself has committed. True when it ran."""
    try:
        async with pool.acquire() as conn:
            await conn.execute(f"VACUUM {', '.join(tables)}")
    except Exception as error:
        logger.warning("VACUUM of %s at %s failed: %s", ", ".join(tables), where, error)
        return False
    return True


async def _keep_session(conn: Any) -> None:
    """The pool's reset between borrowers, in place of asyncpg's `SELECT pg_advisory_unlock_all(); CLOSE ALL;
    UNLISTEN *; RESET ALL` (a round trip each time a connection goes back: five a retrieve). asyncpg still rolls back
    an open transaction first; nothing else is left to reset, since the stores keep no session state on a pooled
    connection: settings are `SET LOCAL`, locks are transaction locks, cursors live in transactions, nothing
    listens (a session lock is taken on a connection of its own: `PostgresStore._split_words_of_older_rows`)."""


class PostgresDatabase:
    """Base of the PostgreSQL stores. Subclasses set the class attributes below and `_bootstrap` (what to
    create at start-up, called in one transaction holding the migration lock)."""

    DESCRIPTION = "PostgreSQL store"
    CONNECT_HINT = "Check AMFS_POSTGRES_DSN and that the server is running."
    APPLICATION_NAME = "amfs-server"
    POOL_MIN_SIZE = 1
    POOL_MAX_SIZE = 10
    NUL_MESSAGE = "PostgreSQL cannot store the NUL character (\\x00) in text; remove it."

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise StoreError("The PostgreSQL DSN must be a postgresql:// URL, e.g. postgresql://user@host:5432/amfs")
        schema = schema or schema_from_dsn(dsn) or DEFAULT_SCHEMA
        if not _IDENTIFIER.fullmatch(schema):
            raise StoreError(
                f"PostgreSQL schema name {schema!r} is not a plain identifier (letters, digits, _ ; at most 63 "
                "characters, not starting with a digit). Pick another schema name."
            )
        self.dsn = dsn
        self.schema = schema
        self._pool: Any | None = None
        self._open_lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return f"{redact_dsn(self.dsn)} (schema {self.schema})"

    @property
    def _search_path(self) -> str:
        return quote_ident(self.schema)

    async def open(self) -> None:
        """Connect, create what is missing (`_bootstrap`), and start the pool. Idempotent."""
        if self._pool is not None:
            return
        async with self._open_lock:
            if self._pool is not None:
                return
            import asyncpg

            try:
                conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
            except Exception as error:
                raise StoreError(
                    f"Cannot connect to PostgreSQL at {redact_dsn(self.dsn)} for the {self.DESCRIPTION}: "
                    f"{type(error).__name__}: {error}. {self.CONNECT_HINT}"
                ) from error
            try:
                await self._bootstrap(conn)
            except StoreError:
                raise
            except Exception as error:
                raise StoreError(
                    f"Cannot prepare the {self.DESCRIPTION}'s tables at {self.where}: {type(error).__name__}: {error}"
                ) from error
            finally:
                await conn.close()
            try:
                self._pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=self.POOL_MIN_SIZE,
                    max_size=self.POOL_MAX_SIZE,
                    timeout=CONNECT_TIMEOUT_S,
                    init=self._init_connection,
                    reset=_keep_session,
                    # warning: a keyword piece made only of stop words becomes an empty tsquery, which would print a
                    # NOTICE on every search
                    server_settings={"search_path": self._search_path, "application_name": self.APPLICATION_NAME,
                                     "client_min_messages": "warning"},
                )
            except Exception as error:
                raise StoreError(
                    f"Cannot open a connection pool to PostgreSQL at {self.where}: {type(error).__name__}: {error}"
                ) from error

    async def _bootstrap(self, conn: Any) -> None:
        raise NotImplementedError

    async def _init_connection(self, conn: Any) -> None:
        """Hook: prepare each new pool connection (type codecs)."""

    async def _create_schema(self, conn: Any) -> None:
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", self.schema):
            await conn.execute(f"CREATE SCHEMA {quote_ident(self.schema)}")
        await conn.execute(f"SET LOCAL search_path TO {self._search_path}")

    async def _migrate(self, conn: Any, ledger: str, migrations: list[str], render: Callable[[str], str] = str) -> None:
        """Apply the steps of `migrations` past the version recorded in the `ledger` table (each step's
        version is its 1-based position); refuse a schema newer than this code."""
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ledger} (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {ledger}")
        if current > len(migrations):
            raise StoreError(
                f"The {self.DESCRIPTION} at {self.where} has schema version {current}, newer than this amfs-server "
                f"({len(migrations)}). Upgrade amfs-server."
            )
        for number, script in enumerate(migrations[current:], start=current + 1):
            await conn.execute(render(script))
            await conn.execute(f"INSERT INTO {ledger} (version) VALUES ($1)", number)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def drop_schema(self) -> None:
        """Close, then drop this store's schema and everything in it (DROP SCHEMA ... CASCADE). For tests and teardown."""
        import asyncpg

        await self.close()
        conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(self.schema)} CASCADE")
        finally:
            await conn.close()

    def _require_pool(self) -> Any:
        if self._pool is None:
            raise StoreError(f"The {self.DESCRIPTION} is not open; call `await store.open()` first.")
        return self._pool

    async def _tx(
        self, fn: Callable[[Any], Awaitable[T]], *, readonly: bool = False, isolation: str | None = None,
        transaction: bool = True,
    ) -> T:
        """Run `fn(conn)` in one transaction; retry it on deadlock / serialisation failure. `transaction=False`: `fn`
        runs one statement, which is its own transaction (two round trips fewer: no BEGIN, no COMMIT)."""
        import asyncpg

        pool = self._require_pool()
        for attempt in range(1, MAX_TX_ATTEMPTS + 1):
            try:
                async with pool.acquire() as conn:
                    if not transaction:
                        return await fn(conn)
                    async with conn.transaction(readonly=readonly, isolation=isolation):
                        return await fn(conn)
            # InvalidCachedStatementError: a statement prepared before another process changed the schema (`memory
            # reembed` changing the vector column's width); asyncpg has dropped the pool's statement cache.
            except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError, asyncpg.InvalidCachedStatementError) as error:
                if attempt == MAX_TX_ATTEMPTS:
                    raise ConflictError(
                        f"A PostgreSQL transaction kept conflicting with concurrent ones ({error}); retry the call."
                    ) from error
                await asyncio.sleep(random.uniform(0.005, 0.02) * attempt)
            except asyncpg.CharacterNotInRepertoireError as error:
                raise ValidationError(self.NUL_MESSAGE) from error
            except asyncpg.DiskFullError as error:
                raise StorageFullError(
                    f"PostgreSQL at {self.where} has no space left ({error}); nothing was written. Free space on "
                    "the database server's disk. Reads keep working meanwhile."
                ) from error
            except Exception as error:
                explained = self._explain(error)
                if explained is None:
                    raise
                raise explained from error
        raise AssertionError("unreachable")  # pragma: no cover

    async def _read(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run `fn(conn)` outside an explicit transaction (one statement, or reads that need not agree)."""
        import asyncpg

        pool = self._require_pool()
        try:
            async with pool.acquire() as conn:
                return await fn(conn)
        except asyncpg.CharacterNotInRepertoireError as error:
            raise ValidationError(self.NUL_MESSAGE) from error
        except Exception as error:
            explained = self._explain(error)
            if explained is None:
                raise
            raise explained from error

    async def _read_with_settings(self, settings: Sequence[str], fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run `fn(conn)` in a read-only transaction with these `SET LOCAL` settings (`"name = value"`), begun in
        the same message as they are set: one round trip for BEGIN and every setting."""
        async def run(conn: Any) -> T:
            await conn.execute("BEGIN READ ONLY;" + "".join(f"SET LOCAL {setting};" for setting in settings))
            try:
                result = await fn(conn)
            except Exception:
                # (the pool would roll back too when the connection goes back, but reports it as an error)
                with contextlib.suppress(Exception):
                    await conn.execute("ROLLBACK")
                raise
            await conn.execute("COMMIT")
            return result

        return await self._read(run)

    def _explain(self, error: Exception) -> Exception | None:
        """The error to raise in place of a driver error a caller should understand; None: `error` as it is."""
        if _connection_lost(error):
            return StoreError(f"Lost the connection to PostgreSQL at {self.where}: {error}")
        return None


def _connection_lost(error: BaseException) -> bool:
    """Whether `error` means the server or the connection went away (a restart, a failover, a network cut):
    reported as such, with the call to retry, rather than as an internal error."""
    import asyncpg

    if isinstance(error, (OSError, asyncpg.PostgresConnectionError, asyncpg.ConnectionDoesNotExistError,
                          asyncpg.OperatorInterventionError)):  # 57P01 admin shutdown, 57P03 cannot connect now
        return True
    # The client's own errors after a connection died mid-call ("underlying connection is closed", "cannot switch
    # to state 12"); other interface errors are bugs and stay internal.
    text = str(error).lower()
    return isinstance(error, (asyncpg.InterfaceError, asyncpg.InternalClientError)) and (
        "connection" in text or "switch to state" in text
    )
