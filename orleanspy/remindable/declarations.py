"""``@register_reminder`` at silo start-up: register-or-update every declaration.

For each grain class the silo hosts, each declared reminder and each of its
keys (``keys=[...]`` on the declaration, else the class's ``reminder_keys``):

- a missing row is created, marked ``declared`` and stamped with the
  declaration's ``fingerprint`` (a hash of its schedule: due, period, cron,
  zone, jitter and bounds; the priority, action and grace it asks for; a hash
  of its payload and retry policy);
- a row whose stored fingerprint is the code's is left alone, whatever it holds
  now: an operator's ``set-priority``, ``set-action``, ``set-grace``, ``pause`` or
  ``repair`` survives restarts until the code changes;
- a row whose fingerprint differs gets what the code changed, and only that: a
  changed schedule re-anchors the row at now (keeping ``last_fire`` and a
  pause); a changed priority, action, grace, payload or retry policy replaces
  the row's and keeps its ``next_due``. When the row's value was an
  operator's (it differs from what the old fingerprint asked for), a WARNING
  names what the code overrode. A row from before fingerprints gets the
  declaration as it did then, and the fingerprint;
- a declaration whose ``ends_at`` has passed creates no row (and its row,
  if any, ends on its own after its last slot);
- a declaration naming a ``calendar`` takes it from the table as stored then
  (an unknown calendar stops the silo's start with ``ReminderError``: set it
  first, ``orleanspy reminders calendar set`` works with no silo up); one with
  ``labels`` or a calendar needs the cluster's feature level
  (``FeatureUnavailableError`` naming the silos that lack it; roll the
  release in before code that declares them). A later change of the calendar
  reaches the row through the calendar, not the declaration.

Before any row is written, every declaration is checked for what validation
alone cannot say (``ReminderRegistry.check_spec``): ``OverlapPolicy.ALLOW_ALL``
on a class that is not reentrant, or an option some live silo does not know
yet (``FeatureUnavailableError``), is a ``ConfigurationError`` naming the
class and the reminder, and the silo does not start.

Then, for every key the class declares reminders for, a row marked
``declared`` whose name the class no longer declares for that key is removed
(with a CAS on the etag just read, so a row rewritten meanwhile is kept). Rows
registered from code are never marked, so never removed here. Rows of a class
no silo hosts any more are orphans (``reminders orphans``, ``delete-many``);
declared rows of a key no declaration names any more are not looked for (the
cost of a start-up follows the declarations, never the rows registered from
code): remove them with ``delete-many --type T --prefix KEY``.

Rows are read and written in bulk, about 2,000 at a time
(``BulkReminderTable.read_grains`` and ``upsert_if_many``: two round trips and
one on Redis).
Silos starting together all run this. Each write is conditional on the row
as read (absent, or the etag read: ``ReminderTable.upsert_if``); a
silo that loses reads the row again and finds it as declared, so each row is
created or updated exactly once. New rows are anchored at the current whole
second, so silos that fall back to plain upserts write identical rows.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from orleanspy.clock import to_ms
from orleanspy.errors import ReminderError
from orleanspy.grain import DeclaredReminder, GrainDefinition
from orleanspy.identity import GrainId, GrainKey
from orleanspy.remindable.registry import ReminderRegistry, read_calendar
from orleanspy.reminders.calendars import StoredCalendar
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderEntry,
    ReminderPriority,
    encode_payload,
)
from orleanspy.reminders.spec import new_entry

__all__ = ["DeclarationSync", "fingerprint", "register_declared_reminders"]

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
    registry: ReminderRegistry,
    defn: GrainDefinition,
    declared: DeclaredReminder,
    key: GrainKey,
    *,
    grain_id: GrainId | None = None,
    now: datetime | None = None,
    fp: str | None = None,
    calendar: StoredCalendar | None = None,
) -> ReminderEntry | None:
    """The row the declaration asks for, anchored at ``now`` (the clock's, by
    default; ``None`` once its ``ends_at`` has passed); ``ReminderError`` naming
    the class and the reminder when the declaration is invalid. ``grain_id``
    and ``fp`` are the key's grain id and the declaration's ``fingerprint``
    when the caller has them already."""
    if now is None:
        now = registry.clock.now()
    if declared.ends_at is not None and declared.ends_at <= now:
        return None
    try:
        entry = new_entry(
            declared,
            service_id=registry.service_id,
            grain_id=defn.grain_id(key) if grain_id is None else grain_id,
            name=declared.name,
            # The whole second: silos starting together compute the same row.
            now=now.replace(microsecond=0),
            options=registry.options,
            declared=True,
            fingerprint=fingerprint(declared) if fp is None else fp,
            calendar=calendar,
        )
    except (ReminderError, ValueError) as exc:
        raise ReminderError(
            f"@register_reminder({declared.name!r}) on {defn.cls.__qualname__} "
            f"(grain type {defn.type_name!r}, key {key!r}) is invalid: {exc}"
        ) from exc
    return entry


def _same_schedule(a: ReminderEntry, b: ReminderEntry) -> bool:
    return (a.period, a.cron, a.tz, a.jitter, a.starts_at, a.ends_at) == (
        b.period,
        b.cron,
        b.tz,
        b.jitter,
        b.starts_at,
        b.ends_at,
    )


def _ms(d: timedelta | float | None) -> int | None:
    """Whole milliseconds of a duration (a number is seconds, as ``@register_reminder``
    turns it into a ``timedelta``)."""
    if d is None:
        return None
    return (d if isinstance(d, timedelta) else timedelta(seconds=d)) // timedelta(milliseconds=1)


def _extras_digest(declared: DeclaredReminder) -> str:
    """A hash of the payload, retry policy, overlap policy, catch-up window,
    deadline and labels (12 hex digits); empty when the declaration sets none of
    them, so fingerprints from before them still match (and the last four join
    the hash only when set, so neither do those of 0.2's first declarations)."""
    later = (declared.overlap, declared.catchup_window, declared.deadline)
    if (
        declared.payload is None
        and declared.retry is None
        and later == (None, None, None)
        and not declared.labels
    ):
        return ""
    retry = declared.retry
    parts: tuple[object, ...] = (
        None if declared.payload is None else encode_payload(declared.payload),
        None if retry is None else (retry.max_attempts, _ms(retry.backoff)),
    )
    if later != (None, None, None):
        parts += (
            None if declared.overlap is None else int(declared.overlap),
            _ms(declared.catchup_window),
            _ms(declared.deadline),
        )
    if declared.labels:
        parts += (sorted(dict(declared.labels).items()),)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def fingerprint(declared: DeclaredReminder) -> str:
    """``"<schedule hash>:<priority>:<action>:<grace ms>:<extras hash>"``: a
    hash of the declaration's schedule (due, period, cron, zone, and jitter and
    bounds when set: 12 hex digits of SHA-256), the priority, action and grace
    it asks for (grace empty for the default) in the clear, so that a silo can
    tell which of them an operator changed since (module docstring), and a hash
    of its payload and retry policy (``_extras_digest``; absent when neither is
    set). The optional parts are left out when unused, so a declaration that
    uses none of them keeps the fingerprint it had before they existed."""
    parts: tuple[object, ...] = (
        _ms(declared.due),
        _ms(declared.period),
        declared.cron,
        declared.tz,
    )
    if (declared.jitter, declared.starts_at, declared.ends_at) != (None, None, None):
        parts += (
            _ms(declared.jitter),
            None if declared.starts_at is None else to_ms(declared.starts_at),
            None if declared.ends_at is None else to_ms(declared.ends_at),
        )
    if declared.calendar is not None:
        on_excluded = declared.on_excluded
        parts += (declared.calendar, None if on_excluded is None else int(on_excluded))
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:12]
    grace = _ms(declared.grace)
    priority = ReminderPriority.NORMAL if declared.priority is None else declared.priority
    action = MissedReminderAction.SKIP if declared.action is None else declared.action
    fp = f"{digest}:{int(priority)}:{int(action)}:{'' if grace is None else grace}"
    extras = _extras_digest(declared)
    return f"{fp}:{extras}" if extras else fp


def _parse(fp: str | None) -> tuple[str, int, MissedReminderAction, timedelta | None, str] | None:
    """The parts of a fingerprint (one without a grace, from before grace was
    declared, reads as the default grace; one without an extras hash as no
    payload and no retry policy); ``None`` for none or a malformed one."""
    if fp is None:
        return None
    try:
        digest, priority, action, *rest = fp.split(":")
        grace = timedelta(milliseconds=int(rest[0])) if rest and rest[0] else None
        extras = rest[1] if len(rest) > 1 else ""
        return digest, int(priority), MissedReminderAction(int(action)), grace, extras
    except ValueError:
        return None


#: Conditional writes one declaration may lose to other silos before giving up.
_ATTEMPTS = 5
#: Declared rows read, then written, per bulk round trip at start-up.
_CHUNK = 2000


def _rewrite(stored: ReminderEntry, desired: ReminderEntry) -> tuple[ReminderEntry, list[str]]:
    """The row to write when the code's declaration differs from the stored
    fingerprint, and the operator changes it overrides (for the warning)."""
    fp = desired.fingerprint
    assert fp is not None
    old, new = _parse(stored.fingerprint), _parse(fp)
    assert new is not None
    if old is None:
        # A row written before fingerprints: the declaration wins, as it did.
        if not _same_schedule(stored, desired):
            base = replace(desired, last_fire=stored.last_fire, paused=stored.paused)
        else:
            base = replace(
                stored,
                priority=desired.priority,
                action=desired.action,
                grace=desired.grace,
                payload=desired.payload,
                retry=desired.retry,
                overlap=desired.overlap,
                catchup_window=desired.catchup_window,
                deadline=desired.deadline,
            )
        return replace(base, declared=True, fingerprint=fp), []
    overridden: list[str] = []
    if old[0] != new[0]:
        # A changed schedule re-anchors; an operator's pause outlives it.
        base = replace(desired, last_fire=stored.last_fire, paused=stored.paused)
    else:
        base = stored
    priority, action, grace = stored.priority, stored.action, stored.grace
    if new[1] != old[1]:
        if stored.priority != old[1]:
            overridden.append(f"priority {stored.priority} -> {new[1]}")
        priority = new[1]
    if new[2] != old[2]:
        if stored.action != old[2]:
            overridden.append(f"action {stored.action.name} -> {new[2].name}")
        action = new[2]
    if new[3] != old[3]:
        if stored.grace != old[3]:
            overridden.append(f"grace {stored.grace} -> {new[3]}")
        grace = new[3]
    if new[4] != old[4]:
        # No operator command sets these: the code's simply replace them.
        base = replace(
            base,
            payload=desired.payload,
            retry=desired.retry,
            overlap=desired.overlap,
            catchup_window=desired.catchup_window,
            deadline=desired.deadline,
            labels=desired.labels,
        )
    write = replace(
        base, priority=priority, action=action, grace=grace, declared=True, fingerprint=fp
    )
    return write, overridden


def _warn(desired: ReminderEntry, overridden: list[str]) -> None:
    if overridden:
        log.warning(
            "declared reminder changed in code overrode an operator change "
            "grain=%s name=%s overridden=%s",
            desired.grain_id,
            desired.name,
            "; ".join(overridden),
        )


async def _sync_grains(
    registry: ReminderRegistry,
    grains: dict[GrainId, list[ReminderEntry]],
    declared_names: dict[GrainId, set[str]],
) -> tuple[list[str], int]:
    """Apply the declared rows of ``grains`` (each grain with its desired rows)
    and remove their declared rows whose name ``declared_names`` no longer
    holds for the grain: one bulk read of
    the grains' rows, one bulk conditional write; a write that lost a race goes
    through ``_apply`` alone. Returns the outcomes and how many were removed."""
    ids = list(grains)
    outcomes: list[str] = []
    writes: list[tuple[ReminderEntry, str | None]] = []
    plans: list[tuple[ReminderEntry, str, list[str]]] = []
    stale: list[ReminderEntry] = []
    for gid, rows in zip(ids, await registry.list_many(ids), strict=True):
        stored = {row.name: row for row in rows}
        desired_rows = grains[gid]
        names = declared_names.get(gid, set())
        stale.extend(row for row in rows if row.declared and row.name not in names)
        for desired in desired_rows:
            row = stored.get(desired.name)
            if row is None:
                writes.append((desired, None))
                plans.append((desired, "created", []))
            elif row.fingerprint != desired.fingerprint or not row.declared:
                write, overridden = _rewrite(row, desired)
                writes.append((write, row.etag))
                plans.append((desired, "updated", overridden))
    results = await registry.store_if_many(writes)
    for (desired, outcome, overridden), won in zip(plans, results, strict=True):
        if won:
            outcomes.append(outcome)
            _warn(desired, overridden)
        else:
            outcomes.append(await _apply(registry, desired))
    removed = sum([await registry.remove_if_unchanged(row) for row in stale])
    return outcomes, removed


async def _apply(registry: ReminderRegistry, desired: ReminderEntry) -> str:
    """Create or update one declared row; ``"created"``, ``"updated"`` or ``""``."""
    for _ in range(_ATTEMPTS):
        stored = await registry.get(desired.grain_id, desired.name)
        if stored is None:
            if await registry.store_if(desired, None):
                return "created"
            continue
        if stored.fingerprint == desired.fingerprint and stored.declared:
            return ""  # the code did not change: whatever an operator did stands
        write, overridden = _rewrite(stored, desired)
        if await registry.store_if(write, stored.etag):
            _warn(desired, overridden)
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
    definitions = list(definitions)
    for defn in definitions:  # all, before any row is written
        for declared in defn.reminders:
            registry.check_spec(
                defn,
                declared,
                f"@register_reminder({declared.name!r}) on {defn.cls.__qualname__}",
            )
    created = updated = removed = 0
    for defn in definitions:
        # One GrainId per key, shared by its rows (its hash is computed once).
        ids = {key: defn.grain_id(key) for key in defn.reminder_keys}
        grains: dict[GrainId, list[ReminderEntry]] = {gid: [] for gid in ids.values()}
        # Every name declared per grain, those whose ``ends_at`` has passed too
        # (their rows are not stale: they end on their own).
        names: dict[GrainId, set[str]] = {}
        for declared in defn.reminders:
            # Once per declaration: every key's row is anchored at one instant.
            fp = fingerprint(declared)
            calendar = await read_calendar(registry.table, declared.calendar)
            now = registry.clock.now()
            for key in _keys(defn, declared):
                gid = ids.get(key)
                if gid is None:
                    gid = ids[key] = defn.grain_id(key)
                grains.setdefault(gid, [])
                desired = _desired(
                    registry, defn, declared, key, grain_id=gid, now=now, fp=fp, calendar=calendar
                )
                names.setdefault(gid, set()).add(declared.name)
                if desired is not None:
                    grains.setdefault(gid, []).append(desired)
        batch: dict[GrainId, list[ReminderEntry]] = {}
        size = 0
        items = list(grains.items())
        for n, (gid, rows) in enumerate(items, 1):
            batch[gid] = rows
            size += max(1, len(rows))
            if size >= _CHUNK or n == len(items):
                outcomes, gone = await _sync_grains(registry, batch, names)
                created += outcomes.count("created")
                updated += outcomes.count("updated")
                removed += gone
                batch, size = {}, 0
    result = DeclarationSync(created, updated, removed)
    if created or updated or removed:
        log.info(
            "declared reminders synced created=%d updated=%d removed=%d",
            created,
            updated,
            removed,
        )
    return result
