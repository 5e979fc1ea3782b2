"""Store schema versions: what a provider's code writes, what a store holds, and
the report of a migration.

Every provider that keeps data names its **component** (``reminders``,
``membership``, ``directory``, ``grain_state:<table>``, ``streams``,
``silo_status``) and the schema version its code reads and writes. A store
records, per component, the version it was last migrated to and the release that
did it:

    PostgreSQL   the table ``orleanspy_schema (component, version, release)``
                 (``_postgres.migrate``; steps are SQL, each in the transaction
                 that records it, under an advisory lock)
    Redis        the hash ``orleanspy:schema`` (component -> msgpack
                 ``[version, release]``) in each Redis database (``_redis.migrate``;
                 steps are coroutines, run under a lock key; one key, so one slot
                 on a Redis Cluster)
    memory       nothing: an in-process store is always this release's

**Forward only.** Migrations are applied in order, each once, and are additive
(new columns with defaults, new tables, new keys), so the previous release keeps
running against a migrated store while a cluster rolls. A provider's ``start``
migrates by default (the first silo that needs a step applies it, under the
lock; the others find it done); ``orleanspy migrate --storage URL`` does the same
ahead of a roll and says what it did. A store whose schema is **newer** than the
code's is refused with ``SchemaTooNewError`` naming both versions and releases;
the code never guesses at a layout it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from orleanspy.errors import StorageError
from orleanspy.versions import __version__

__all__ = [
    "MEMORY_SCHEMA",
    "MigrationReport",
    "SchemaTooNewError",
    "SchemaVersion",
    "too_new",
]

Store = Literal["memory", "redis", "postgres"]


class SchemaTooNewError(StorageError):
    """The store was migrated by a newer release than this code: run that release."""


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """A provider's schema: the ``store`` it keeps data in, its ``component``, and
    the ``version`` its code reads and writes."""

    store: Store
    component: str
    version: int

    @property
    def key(self) -> str:
        """``"postgres:reminders"``: how a membership row and the CLI name it."""
        return f"{self.store}:{self.component}"


MEMORY_SCHEMA: Final = 1
"""The version every in-memory provider reports: nothing is stored to migrate."""


@dataclass(slots=True)
class MigrationReport:
    """What a migration found and did to one component: the version it found
    (``before``, 0 for a store that had none), the version it left (``after``),
    and one line per step applied (empty: nothing to do)."""

    store: Store
    component: str
    before: int
    after: int
    release_before: str | None = None
    applied: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for an operator, e.g. ``postgres:reminders 6 -> 7: ...``."""
        where = f"{self.store}:{self.component}"
        if not self.applied:
            by = f", recorded by orleanspy {self.release_before}" if self.release_before else ""
            return f"{where}: at version {self.after}{by}; nothing to do"
        return f"{where}: {self.before} -> {self.after}: " + "; ".join(self.applied)


def too_new(
    store: Store, component: str, stored: int, release: str | None, knows: int
) -> SchemaTooNewError:
    """The error for a store at ``stored`` when this code knows versions up to
    ``knows``: it names both versions, both releases and the way out."""
    by = f"orleanspy {release}" if release else "a newer release"
    return SchemaTooNewError(
        f"the {store} {component} schema is at version {stored}, migrated by {by}; "
        f"this release (orleanspy {__version__}) knows versions up to {knows}. Run "
        f"{by} or newer: a store is never migrated backwards (docs/upgrades.md)"
    )
