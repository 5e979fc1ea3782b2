"""``@register_reminder`` at silo start-up: register-or-update every declaration.

For each grain class the silo hosts, each declared reminder and each of its
keys (``keys=[...]`` on the declaration, else the class's ``reminder_keys``):

- a missing row is created, marked ``declared``;
- a row whose period, cron, zone, jitter, bounds, priority, action, grace,
  payload or retry policy differs from the declaration is updated. A changed
  schedule (period, cron, zone, jitter, bounds) re-anchors the row at now (like
  a registration from code); a changed priority, action, grace, payload or
  retry policy alone keeps the row's ``next_due`` and ``last_fire``;
- a declaration whose ``ends_at`` has passed creates no row (and its row,
  if any, ends on its own after its last slot);
- an unchanged row is left alone (``next_due``, ``last_fire``, etag).

Then, for every key the class declares reminders for, a row marked
``declared`` whose name the class no longer declares for that key is removed
(with a CAS on the etag just read, so a row rewritten meanwhile is kept). Rows
registered from code are never marked, so never removed here. Rows of a class
no silo hosts any more, or of a key no declaration names any more, are not
looked for (that would need a scan of the table); remove them with the
management grain.

Silos starting together all run this. Each write is conditional on the row
as read (absent, or the etag read: ``ConditionalReminderTable.upsert_if``); a
silo that loses reads the row again and finds it as declared, so each row is
created or updated exactly once. New rows are anchored at the current whole
second, so silos that fall back to plain upserts write identical rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from orleanspy.errors import ReminderError
from orleanspy.grain import DeclaredReminder, GrainDefinition
from orleanspy.identity import GrainKey
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.spec import new_entry

__all__ = ["DeclarationSync", "register_declared_reminders"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeclarationSync:
    """What one start-up pass did: rows created, updated and removed."""

    created: int = 0
    updated: int = 0
    removed: int = 0


def _keys(defn: GrainDefinition, declared: DeclaredReminder) -> tuple[GrainKey, ...]:
    return declared.keys if declared.keys is not None else defn.reminder_keys


def _desired(
    registry: ReminderRegistry, defn: GrainDefinition, declared: DeclaredReminder, key: GrainKey
) -> ReminderEntry | None:
    """The row the declaration asks for, anchored at now (``None`` once its
    ``ends_at`` has passed); ``ReminderError`` naming the class and the reminder
    when the declaration is invalid."""
    if declared.ends_at is not None and declared.ends_at <= registry.clock.now():
        return None
    try:
        entry = new_entry(
            service_id=registry.service_id,
            grain_id=defn.grain_id(key),
            name=declared.name,
            # The whole second: silos starting together compute the same row.
            now=registry.clock.now().replace(microsecond=0),
            options=registry.options,
            due=declared.due,
            period=declared.period,
            cron=declared.cron,
            tz=declared.tz,
            priority=declared.priority,
            action=declared.action,
            grace=declared.grace,
            jitter=declared.jitter,
            starts_at=declared.starts_at,
            ends_at=declared.ends_at,
            payload=declared.payload,
            retry=declared.retry,
        )
    except (ReminderError, ValueError) as exc:
        raise ReminderError(
            f"@register_reminder({declared.name!r}) on {defn.cls.__qualname__} "
            f"(grain type {defn.type_name!r}, key {key!r}) is invalid: {exc}"
        ) from exc
    return replace(entry, declared=True)


def _same_schedule(a: ReminderEntry, b: ReminderEntry) -> bool:
    return (a.period, a.cron, a.tz, a.jitter, a.starts_at, a.ends_at) == (
        b.period,
        b.cron,
        b.tz,
        b.jitter,
        b.starts_at,
        b.ends_at,
    )


def _same_options(a: ReminderEntry, b: ReminderEntry) -> bool:
    """Same priority, action, grace, payload and retry policy (what changes in place)."""
    return (a.priority, a.action, a.grace, a.payload, a.retry) == (
        b.priority,
        b.action,
        b.grace,
        b.payload,
        b.retry,
    )


#: Conditional writes one declaration may lose to other silos before giving up.
_ATTEMPTS = 5


async def _apply(registry: ReminderRegistry, desired: ReminderEntry) -> str:
    """Create or update one declared row; ``"created"``, ``"updated"`` or ``""``."""
    for _ in range(_ATTEMPTS):
        stored = await registry.get(desired.grain_id, desired.name)
        if stored is None:
            if await registry.store_if(desired, None):
                return "created"
            continue
        if not _same_schedule(stored, desired):
            # An operator's pause outlives a changed declaration.
            write = replace(desired, last_fire=stored.last_fire, paused=stored.paused)
        elif not _same_options(stored, desired):
            write = replace(
                stored,
                priority=desired.priority,
                action=desired.action,
                grace=desired.grace,
                payload=desired.payload,
                retry=desired.retry,
                declared=True,
            )
        else:
            return ""
        if await registry.store_if(write, stored.etag):
            return "updated"
    raise ReminderError(
        f"could not register declared reminder {desired.name!r} of {desired.grain_id}: "
        f"it kept changing ({_ATTEMPTS} attempts)"
    )


async def register_declared_reminders(
    registry: ReminderRegistry, definitions: Iterable[GrainDefinition]
) -> DeclarationSync:
    """Register-or-update every declaration of ``definitions`` and remove rows
    whose declaration is gone (module docstring). No grain is activated. An
    invalid declaration raises ``ReminderError`` naming its class and reminder
    (the silo does not start)."""
    created = updated = removed = 0
    for defn in definitions:
        declared_names: dict[GrainKey, set[str]] = {}
        for declared in defn.reminders:
            for key in _keys(defn, declared):
                declared_names.setdefault(key, set()).add(declared.name)
                desired = _desired(registry, defn, declared, key)
                if desired is None:
                    continue
                outcome = await _apply(registry, desired)
                created += outcome == "created"
                updated += outcome == "updated"
        for key in set(defn.reminder_keys) | set(declared_names):
            names = declared_names.get(key, set())
            for row in await registry.list(defn.grain_id(key)):
                if (
                    row.declared
                    and row.name not in names
                    and await registry.remove_if_unchanged(row)
                ):
                    removed += 1
    result = DeclarationSync(created, updated, removed)
    if created or updated or removed:
        log.info(
            "declared reminders synced created=%d updated=%d removed=%d",
            created,
            updated,
            removed,
        )
    return result
