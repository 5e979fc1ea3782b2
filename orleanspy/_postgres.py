"""Shared PostgreSQL plumbing for the PostgreSQL backends: pools from URLs, error
translation, and versioned schema migrations.

Each backend imports ``asyncpg`` only through this module (and only when a
``postgresql://`` URL or a pool is chosen), so a connection failure always
surfaces as ``StorageUnavailableError`` and anything else the server refuses as
``StorageError``.

Schemas are the providers' business, never an operator's: every provider names
its component and the list of migration steps it needs; ``migrate`` applies the
missing ones under an advisory lock and records the component's version in
``orleanspy_schema``. Two silos starting at once therefore never race on
``CREATE TABLE``, and a newer release adds steps without touching old ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from typing import Any, TypeAlias

from orleanspy._tasks import raise_if_cancelled
from orleanspy.errors import StorageError, StorageUnavailableError
from orleanspy.schema import MigrationReport, too_new
from orleanspy.schemes import missing_extra
from orleanspy.versions import __version__

try:
    import asyncpg
except ModuleNotFoundError as exc:  # the optional extra: one line, not a traceback
    if exc.name != "asyncpg":
        raise
    raise missing_extra("asyncpg", "postgres", "a postgresql:// URL") from None

__all__ = ["Pool", "connect", "migrate", "open_pool", "translate_errors"]

# asyncpg ships no type information: an ``asyncpg.Pool``, typed loosely.
Pool: TypeAlias = Any

# JIT compilation of a plan costs ~200 ms on a fresh connection and pays off only
# for long analytic queries; the providers run short indexed statements, some with
# large (and pessimistic) cost estimates, e.g. read_due over the whole ring.
SERVER_SETTINGS = {"jit": "off"}

# Any fixed number: the advisory lock that serialises schema migrations.
_MIGRATION_LOCK = 0x6F726C65

_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,
    # What asyncpg raises when a connection the server ended is used mid-protocol.
    asyncpg.exceptions.InternalClientError,
)


async def _keep_session(connection: Any) -> None:
    """A pooled connection's release without asyncpg's reset query (``RESET ALL``,
    ``UNLISTEN *``, ...): the providers leave no session state on pooled
    connections (no ``SET``, no ``LISTEN``, no cursors, only transaction-scoped
    advisory locks), and that query was one more round trip and one more commit
    per statement. asyncpg still rolls back a transaction left open."""


async def open_pool(source: str | Pool, stack: AsyncExitStack, *, max_size: int = 10) -> Pool:
    """The pool for ``source``: a URL gets a new pool (``SERVER_SETTINGS`` on every
    connection, released without a reset query: ``_keep_session``) closed when
    ``stack`` unwinds; a pool is used as is (its owner closes it, and chooses its
    settings)."""
    if not isinstance(source, str):
        return source
    with translate_errors("connect"):
        pool = await asyncpg.create_pool(
            source,
            min_size=1,
            max_size=max_size,
            timeout=10,
            server_settings=SERVER_SETTINGS,
            reset=_keep_session,
        )
    stack.push_async_callback(pool.close)
    return pool


async def connect(source: str | Pool) -> Any:
    """A connection of its own (for LISTEN), not taken from any pool's quota when
    ``source`` is a URL; taken from the pool (and to be released there) otherwise."""
    if isinstance(source, str):
        with translate_errors("connect"):
            return await asyncpg.connect(source, timeout=10, server_settings=SERVER_SETTINGS)
    with translate_errors("connect"):
        return await source.acquire(timeout=10)


async def migrate(
    pool: Pool,
    component: str,
    steps: Sequence[Sequence[str]],
    *,
    summaries: Sequence[str] = (),
) -> MigrationReport:
    """Bring ``component``'s schema to version ``len(steps)`` and say what was done.

    Step ``i`` (1-based) is a list of statements taking the schema from version
    ``i - 1`` to ``i``; each step runs in the transaction that records its
    version and this release, under an advisory lock, so two silos starting at
    once apply it once. ``summaries[i - 1]`` (optional) describes step ``i`` for
    the report. Raises ``SchemaTooNewError`` if the stored version is newer than
    the steps this release knows (a newer release migrated the table: run it).
    """
    with translate_errors(f"{component} schema migration"):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS orleanspy_schema "
                "(component text PRIMARY KEY, version integer NOT NULL)"
            )
            # Which release migrated last (0.2). 0.1.x writes rows without it and
            # reads only component and version, so it runs beside this column.
            await conn.execute("ALTER TABLE orleanspy_schema ADD COLUMN IF NOT EXISTS release text")
            stored = await conn.fetchrow(
                "SELECT version, release FROM orleanspy_schema WHERE component = $1", component
            )
            current = 0 if stored is None else int(stored["version"])
            release = None if stored is None else stored["release"]
            if current > len(steps):
                raise too_new("postgres", component, current, release, len(steps))
            report = MigrationReport("postgres", component, current, len(steps), release)
            for number, statements in enumerate(steps[current:], start=current + 1):
                for statement in statements:
                    await conn.execute(statement)
                summary = summaries[number - 1] if number <= len(summaries) else ""
                report.applied.append(f"{number}: {summary}" if summary else f"step {number}")
            if current < len(steps):
                await conn.execute(
                    "INSERT INTO orleanspy_schema (component, version, release) "
                    "VALUES ($1, $2, $3) ON CONFLICT (component) DO UPDATE "
                    "SET version = EXCLUDED.version, release = EXCLUDED.release",
                    component,
                    len(steps),
                    __version__,
                )
    return report


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Re-raise asyncpg errors as the project's storage errors, naming ``what``."""
    try:
        yield
    except StorageError:
        raise
    except _CONNECTION_ERRORS as exc:
        raise_if_cancelled()
        raise StorageUnavailableError(f"postgresql unavailable during {what}: {exc}") from exc
    except asyncpg.PostgresError as exc:
        raise_if_cancelled()
        raise StorageError(f"postgresql error during {what}: {exc}") from exc
    raise_if_cancelled()
