"""Reminder rows, priorities, missed-tick actions, tick status, change records."""

from __future__ import annotations

import base64
import enum
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from orleanspy._frozen import maker
from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError, SerializationError
from orleanspy.identity import GrainId
from orleanspy.reminders.calendars import Calendar, Excluded
from orleanspy.serialization import pack, register_type, unpack

__all__ = [
    "ENDED",
    "MAX_BUFFERED_SLOTS",
    "MAX_ERROR_TEXT",
    "MAX_RETRY_ATTEMPTS",
    "TICK_DEDUPLICATED",
    "FireOutcome",
    "FireRecord",
    "MissedReminder",
    "MissedReminderAction",
    "OverlapPolicy",
    "ReminderChange",
    "ReminderEntry",
    "ReminderPriority",
    "RetryPolicy",
    "ScheduleUpdate",
    "SkipReason",
    "TickStatus",
    "bind_tick",
    "error_text",
    "extras_from_record",
    "make_entry",
    "occurrence_of",
    "row_key",
]

#: ``next_due`` of a schedule update that removes a row whose schedule ended (a
#: one-shot after its tick, a bounded reminder after its last slot): later than
#: any slot, so nothing that reads a pending update takes the row for due.
ENDED = datetime(9999, 1, 1, tzinfo=UTC)
#: The most attempts a ``RetryPolicy`` may ask for.
MAX_RETRY_ATTEMPTS = 100
_MAX_RETRY_BACKOFF = timedelta(days=1)
_MS = timedelta(milliseconds=1)


def row_key(grain_id: GrainId, name: str) -> str:
    """``grain_id.canonical|name``: a row's key inside its shard, and its identity in
    the service's memory. (Names cannot contain ``|``; registration refuses them.)"""
    return f"{grain_id.canonical}|{name}"


class ReminderPriority(enum.IntEnum):
    """Named priorities; any int in -128..127 is accepted where a priority is asked."""

    CRITICAL = 100
    NORMAL = 0
    BACKGROUND = -100


class MissedReminderAction(enum.IntEnum):
    """What to do with missed ticks: a tick reached later than its grace after its
    slot (the row's ``grace``, else ``ReminderOptions.missed_tick_grace``), or once
    a further slot of the row has passed too (catch-up is never a burst).

    ``FIRE_IMMEDIATELY``: deliver one tick now for the latest passed slot
    (``TickStatus.missed_ticks`` counts the earlier ones), then resume the grid.
    ``SKIP``: move on to the next future slot (Orleans' only behaviour; the default).
    ``NOTIFY``: skip, and publish a ``MissedReminder`` on ``orleanspy.reminders.missed``.
    """

    FIRE_IMMEDIATELY = 1
    SKIP = 2
    NOTIFY = 3


class OverlapPolicy(enum.IntEnum):
    """What a slot that falls due while the previous tick of the same reminder
    is still running becomes (an *overlapping* slot). docs/reminders.md
    ("Overlapping ticks") has the table; in short:

    ``SKIP``: overlapping slots are skipped (counted); the reminder resumes at
    its first slot after the running tick returns.
    ``BUFFER_ONE`` (the default, and what every release before 0.2 did): the
    slots wait for the running tick; when it returns they are planned like any
    slot reached late, so at most one tick follows it: the first of them when it
    is the only one and within its grace, else the missed-tick action decides
    (``FIRE_IMMEDIATELY``: one tick for the latest, ``SKIP``/``NOTIFY``: none).
    ``BUFFER_ALL``: every overlapping slot is delivered after the running tick,
    in order, each as its own slot (at most ``MAX_BUFFERED_SLOTS`` wait; older
    ones are skipped).
    ``CANCEL_OTHER``: the running tick is cancelled where it runs when the next
    slot falls due, and that slot is delivered at once.
    ``ALLOW_ALL``: a slot is delivered when it falls due, the running tick
    keeps running: ticks of the reminder run side by side. Only for grains
    whose ``receive_reminder`` may interleave (``@reentrant`` classes, or
    ``@always_interleave`` on it); a non-reentrant grain's turns would queue
    them anyway, so registering it there is a ``ConfigurationError``.
    """

    SKIP = 1
    BUFFER_ONE = 2
    BUFFER_ALL = 3
    CANCEL_OTHER = 4
    ALLOW_ALL = 5


#: Overlapping slots a ``BUFFER_ALL`` reminder keeps waiting at most; older ones
#: are skipped (counted as overlap skips).
MAX_BUFFERED_SLOTS = 100


class SkipReason(enum.StrEnum):
    """Why a slot was not delivered (a reminder's skip counters, by reason)."""

    PAUSED = "paused"  #: it fell due while the reminder was paused
    OVERLAP = "overlap"  #: the previous tick still ran (``OverlapPolicy``)
    #: excluded by the reminder's calendar (reserved: counted where calendars apply)
    CALENDAR = "calendar"
    #: older than the reminder's ``catchup_window`` when it was reached
    CATCHUP_WINDOW = "catchup_window"
    LATE = "late"  #: reached past its grace, and the missed-tick action skipped it


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Re-deliver a tick whose grain raised, within the same slot (opt-in).

    ``max_attempts`` counts every delivery of the slot, the first included
    (``RetryPolicy(3, ...)``: the first delivery and up to two retries);
    ``backoff`` is the wait after each failed attempt. A retry is given up when
    it could not start before the reminder's next slot: a slot never overlaps
    the next one. Waiting retries hold no delivery permit. ``ReminderError`` for
    ``max_attempts`` outside 1..100 or ``backoff`` outside 1 ms..1 day.
    """

    max_attempts: int = 3
    backoff: timedelta = timedelta(seconds=1)

    def __post_init__(self) -> None:
        n = self.max_attempts
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RETRY_ATTEMPTS:
            raise ReminderError(
                f"RetryPolicy.max_attempts must be an int in 1..{MAX_RETRY_ATTEMPTS} "
                f"(the first delivery included), got {n!r}"
            )
        b = self.backoff
        if not isinstance(b, timedelta) or not timedelta(milliseconds=1) <= b <= _MAX_RETRY_BACKOFF:
            raise ReminderError(
                f"RetryPolicy.backoff must be a timedelta from 1 ms to 1 day, got {b!r}"
            )
        # Stored in whole milliseconds, as every reminder duration.
        object.__setattr__(self, "backoff", timedelta(milliseconds=b // _MS))


@dataclass(frozen=True, slots=True)
class ReminderEntry:
    """One reminder row. ``(service_id, grain_id, name)`` identify it.

    Exactly one of ``period`` (interval on the grid ``start_at + k * period``) and
    ``cron`` (with zone ``tz``, default UTC) is set. ``next_due`` is always set
    and is what the due index orders by. ``etag`` is ``None`` until stored.
    ``declared`` marks a row created by a ``@register_reminder`` declaration
    (removed when its declaration goes); rows registered from code have
    ``False`` and are never removed that way.
    ``paused``: the row is kept but out of the due index, so nothing is delivered
    until it is resumed; ``next_due`` keeps the slot it stopped at.
    ``fingerprint`` (declared rows): the declaration that last wrote the row
    (``remindable.declarations.fingerprint``), so a silo re-applies a
    declaration only when the code changed it; ``None`` on other rows.
    ``grace``: how late a tick may be reached and still count as on time (see
    ``MissedReminderAction``); ``None`` means ``ReminderOptions.missed_tick_grace``.

    Optional schedule fields (``None``: not used; see ``spec.new_entry``):
    a *one-shot* row has neither ``period`` nor ``cron``: its one slot is
    ``start_at``. ``jitter`` delays each slot by a deterministic offset in
    ``[0, jitter)`` drawn from the row's key and the slot, never reaching the
    next slot or past ``ends_at``; ``next_due`` is the jittered instant.
    ``starts_at``/``ends_at`` bound the slots (inclusive); ``max_ticks`` caps
    how many slots the schedule has, counted from the first, and ``final_due``
    is the last of them (derived at registration). A row whose schedule has no
    slot left is removed after its last tick. ``payload`` is a small value of
    the codec's types delivered in ``TickStatus.payload``; ``retry`` re-delivers
    a tick whose grain raised (``RetryPolicy``). ``overlap``: what a slot that
    falls due while the previous tick runs becomes (``OverlapPolicy``; ``None``:
    ``BUFFER_ONE``); ``catchup_window``: how old the latest passed slot may be
    and still get a ``FIRE_IMMEDIATELY`` catch-up tick (``None``: any age);
    ``deadline``: how long ``receive_reminder`` may run before it is cancelled
    (``None``: ``ReminderOptions.tick_deadline``). ``resumed_at``: when the row
    was last resumed after a pause (slots skipped up to then count as skipped
    while paused); set by ``resume``, never by a registration.

    ``trace_context``: the W3C ``traceparent`` of the span that registered or
    last changed the row (only while this process traces, and once the
    cluster's level has ``Feature.TRACE_LINKS``); each tick's span links to it.
    Not part of the row's value: rows that differ only in it compare equal.

    ``labels``: the row's labels (``reminders.labels``; keys sorted, ``None``
    for none), indexed for selection. ``calendar``: the name of the calendar
    whose excluded days and times apply to the slots (``reminders.calendars``),
    ``on_excluded`` what becomes of an excluded slot (``None``: ``SKIP``).
    ``_calendar_rules`` is that calendar's copy the slots are computed with, of
    version ``calendar_version``: it is stored with the row (so every owner
    computes the same slots from the row alone) but never travels in a call;
    silos attach it when they write the row.
    """

    service_id: str
    grain_id: GrainId
    name: str
    start_at: datetime
    next_due: datetime
    period: timedelta | None = None
    cron: str | None = None
    tz: str | None = None
    last_fire: datetime | None = None
    priority: int = ReminderPriority.NORMAL
    action: MissedReminderAction = MissedReminderAction.SKIP
    etag: str | None = None
    declared: bool = False
    paused: bool = False
    fingerprint: str | None = None
    grace: timedelta | None = None
    jitter: timedelta | None = None
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    max_ticks: int | None = None
    final_due: datetime | None = None
    payload: Any = field(default=None, hash=False)
    retry: RetryPolicy | None = None
    overlap: OverlapPolicy | None = None
    catchup_window: timedelta | None = None
    deadline: timedelta | None = None
    resumed_at: datetime | None = None
    trace_context: str | None = field(default=None, compare=False, hash=False)
    labels: dict[str, str] | None = field(default=None, hash=False)
    calendar: str | None = None
    on_excluded: Excluded | None = None
    calendar_version: int | None = None
    _calendar_rules: Calendar | None = None

    def __post_init__(self) -> None:
        # Ints arrive where enums left (msgpack carries IntEnums as ints).
        if type(self.action) is not MissedReminderAction:
            object.__setattr__(self, "action", MissedReminderAction(self.action))
        if self.overlap is not None and type(self.overlap) is not OverlapPolicy:
            object.__setattr__(self, "overlap", OverlapPolicy(self.overlap))
        if self.on_excluded is not None and type(self.on_excluded) is not Excluded:
            object.__setattr__(self, "on_excluded", Excluded(self.on_excluded))

    @property
    def calendar_rules(self) -> Calendar | None:
        """The calendar's rules the row's slots are computed with (``None``: no
        calendar, or a row received in a call, which leaves them behind)."""
        return self._calendar_rules

    def index_terms(self) -> list[str]:
        """The row's terms in the tables' label index: ``l:<key>=<value>`` per
        label and ``c:<calendar>`` (``reminders.labels``), sorted."""
        terms = [f"l:{k}={v}" for k, v in (self.labels or {}).items()]
        if self.calendar is not None:
            terms.append(f"c:{self.calendar}")
        return sorted(terms)

    @property
    def key(self) -> str:
        """``grain_id.canonical|name``: the row's key inside its shard."""
        return row_key(self.grain_id, self.name)

    @property
    def hash(self) -> int:
        """The grain's uniform hash: decides the ring owner and the shard."""
        return self.grain_id.uniform_hash()

    @property
    def one_shot(self) -> bool:
        """A reminder with a single slot (``start_at``): neither period nor cron."""
        return self.period is None and self.cron is None

    def same_schedule(self, other: ReminderEntry) -> bool:
        """Whether ``other`` has the same slots (all but ``next_due``/``last_fire``)."""
        return (
            self.start_at == other.start_at
            and self.period == other.period
            and self.cron == other.cron
            and self.tz == other.tz
            and self.jitter == other.jitter
            and self.starts_at == other.starts_at
            and self.ends_at == other.ends_at
            and self.final_due == other.final_due
            and self.on_excluded == other.on_excluded
            and self._calendar_rules == other._calendar_rules
        )

    def with_etag(self, etag: str | None) -> ReminderEntry:
        """This row with ``etag`` (``rescheduled``'s direct copy: ``replace``
        costs twice as much, and every registration makes one)."""
        return self.rescheduled(self.next_due, self.last_fire, etag)

    def rescheduled(
        self, next_due: datetime, last_fire: datetime | None, etag: str | None
    ) -> ReminderEntry:
        """This row with a new schedule and etag (what a schedule CAS stores).

        Same as ``dataclasses.replace`` with those three fields, at about a
        third of its cost (built by ``make_entry``): a table calls it once per
        tick, and every registration once.
        """
        return make_entry(
            self.service_id,
            self.grain_id,
            self.name,
            self.start_at,
            next_due,
            self.period,
            self.cron,
            self.tz,
            last_fire,
            self.priority,
            self.action,
            etag,
            self.declared,
            self.paused,
            self.fingerprint,
            self.grace,
            self.jitter,
            self.starts_at,
            self.ends_at,
            self.max_ticks,
            self.final_due,
            self.payload,
            self.retry,
            self.overlap,
            self.catchup_window,
            self.deadline,
            self.resumed_at,
            self.trace_context,
            self.labels,
            self.calendar,
            self.on_excluded,
            self.calendar_version,
            self._calendar_rules,
        )

    def to_record(self) -> dict[str, Any]:
        """Storage form: plain msgpack types, times as integer ms since the epoch.
        ``"u"`` (paused) is present only on paused rows, ``"gr"`` (grace, ms) only
        on rows with a grace of their own, ``"f"`` (fingerprint) only on declared
        rows that have one, and the optional schedule fields (``extras_record``)
        only when set, so rows without them are stored as before and rows
        written before them read unchanged. (A fire record's ``"f"``, *final*, is
        another record with its own decoder, ``FireRecord``.)"""
        rec: dict[str, Any] = {
            "s": self.service_id,
            "g": self.grain_id.canonical,
            "n": self.name,
            "a": to_ms(self.start_at),
            "d": to_ms(self.next_due),
            "p": None if self.period is None else self.period // timedelta(milliseconds=1),
            "c": self.cron,
            "z": self.tz,
            "l": None if self.last_fire is None else to_ms(self.last_fire),
            "r": int(self.priority),
            "x": int(self.action),
            "e": self.etag,
            "o": 1 if self.declared else None,
        }
        if self.paused:
            rec["u"] = True
        if self.fingerprint is not None:
            rec["f"] = self.fingerprint
        if self.grace is not None:
            rec["gr"] = self.grace // _MS
        extras = self.extras_record()
        if extras:
            rec.update(extras)
        return rec

    def to_compact_record(self) -> dict[str, Any]:
        """``to_record`` without the fields that are ``None``: what the Redis
        scripts store (Lua's msgpack drops nil map values anyway), built
        directly, as bulk writes make one per row."""
        start = to_ms(self.start_at)
        rec: dict[str, Any] = {
            "s": self.service_id,
            "g": self.grain_id.canonical,
            "n": self.name,
            "a": start,
            "d": start if self.next_due is self.start_at else to_ms(self.next_due),
        }
        if self.period is not None:
            rec["p"] = self.period // _MS
        if self.cron is not None:
            rec["c"] = self.cron
        if self.tz is not None:
            rec["z"] = self.tz
        if self.last_fire is not None:
            rec["l"] = to_ms(self.last_fire)
        rec["r"] = int(self.priority)
        rec["x"] = int(self.action)
        if self.etag is not None:
            rec["e"] = self.etag
        if self.declared:
            rec["o"] = 1
        if self.paused:
            rec["u"] = True
        if self.fingerprint is not None:
            rec["f"] = self.fingerprint
        if self.grace is not None:
            rec["gr"] = self.grace // _MS
        if (
            self.jitter is not None
            or self.starts_at is not None
            or self.ends_at is not None
            or self.max_ticks is not None
            or self.final_due is not None
            or self.payload is not None
            or self.retry is not None
            or self.overlap is not None
            or self.catchup_window is not None
            or self.deadline is not None
            or self.resumed_at is not None
            or self.trace_context is not None
            or self.labels is not None
            or self.calendar is not None
        ):
            rec.update(self.extras_record())
        return rec

    def extras_record(self) -> dict[str, Any]:
        """The optional schedule fields in storage form, only those set (empty for
        most rows): ``j`` jitter ms, ``sa``/``ea`` starts/ends ms, ``mt`` max ticks,
        ``fd`` final slot ms, ``py`` the payload (codec bytes, base64 text: Lua's
        msgpack has no binary type), ``rt`` ``[max_attempts, backoff ms]``,
        ``ov`` the overlap policy, ``cw`` the catch-up window ms, ``dl`` the
        deadline ms, ``rs`` when the row was last resumed (ms), ``tc`` the trace
        context (a ``traceparent``), ``lb`` the labels, ``cl`` the calendar's name,
        ``ox`` ``on_excluded``, ``cv`` the calendar's version and ``cr`` its rules
        (``Calendar.to_record``).
        Tables that keep these in one column store this map (``extras_from_record``
        reads it back)."""
        rec: dict[str, Any] = {}
        if self.jitter is not None:
            rec["j"] = self.jitter // _MS
        if self.starts_at is not None:
            rec["sa"] = to_ms(self.starts_at)
        if self.ends_at is not None:
            rec["ea"] = to_ms(self.ends_at)
        if self.max_ticks is not None:
            rec["mt"] = self.max_ticks
        if self.final_due is not None:
            rec["fd"] = to_ms(self.final_due)
        if self.payload is not None:
            rec["py"] = encode_payload(self.payload)
        if self.retry is not None:
            rec["rt"] = [self.retry.max_attempts, self.retry.backoff // _MS]
        if self.overlap is not None:
            rec["ov"] = int(self.overlap)
        if self.catchup_window is not None:
            rec["cw"] = self.catchup_window // _MS
        if self.deadline is not None:
            rec["dl"] = self.deadline // _MS
        if self.resumed_at is not None:
            rec["rs"] = to_ms(self.resumed_at)
        if self.trace_context is not None:
            rec["tc"] = self.trace_context
        if self.labels:
            rec["lb"] = dict(self.labels)
        if self.calendar is not None:
            rec["cl"] = self.calendar
            if self.on_excluded is not None:
                rec["ox"] = int(self.on_excluded)
            if self.calendar_version is not None:
                rec["cv"] = self.calendar_version
            if self._calendar_rules is not None:
                rec["cr"] = self._calendar_rules.to_record()
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any], grain_id: GrainId | None = None) -> ReminderEntry:
        """Inverse of ``to_record``. The fields that may be ``None`` may also be
        absent (Lua's msgpack drops nil map values when a script rewrites a row).
        ``grain_id``: the row's grain when the caller knows it (its canonical
        form is ``rec["g"]``), so it is not parsed again.

        Built for speed: a window smaller than the near-due set decodes every
        row again each period it rotates through."""
        get = rec.get
        period, last_fire, grace = get("p"), get("l"), get("gr")
        action = rec["x"]
        return cls(
            rec["s"],
            _grain_id(rec["g"]) if grain_id is None else grain_id,
            rec["n"],
            from_ms(rec["a"]),
            from_ms(rec["d"]),
            None if period is None else _MS * period,
            get("c"),
            get("z"),
            None if last_fire is None else from_ms(last_fire),
            rec["r"],
            _ACTIONS.get(action) or MissedReminderAction(action),
            get("e"),
            # Absent in records written before the field existed.
            bool(get("o")),
            bool(get("u", False)),
            get("f"),
            None if grace is None else _MS * grace,
            **extras_from_record(rec),
        )


#: ``MissedReminderAction`` by value: a lookup, where calling the enum costs more
#: than the rest of a field's decoding.
_ACTIONS: dict[int, MissedReminderAction] = {a.value: a for a in MissedReminderAction}

#: Grain ids decoded lately, by canonical form (``_grain_id``).
_GRAIN_IDS: dict[str, GrainId] = {}
_GRAIN_IDS_KEPT = 16384


def _grain_id(canonical: str) -> GrainId:
    """``GrainId.parse``, remembering recent ids: rows rotating through a small
    window are decoded again each period, and a remembered id keeps its cached
    hash and canonical form (which the loader then needs) instead of parsing,
    validating and hashing anew. Dropped all at once past ``_GRAIN_IDS_KEPT``."""
    gid = _GRAIN_IDS.get(canonical)
    if gid is None:
        gid = GrainId.parse(canonical)
        if len(_GRAIN_IDS) >= _GRAIN_IDS_KEPT:
            _GRAIN_IDS.clear()
        _GRAIN_IDS[canonical] = gid
    return gid


def encode_payload(value: Any) -> str:
    """A payload in storage form: the codec's bytes as base64 text."""
    return base64.b64encode(pack(value)).decode("ascii")


def payload_size(value: Any) -> int:
    """The payload's encoded size in bytes (what ``MAX_PAYLOAD_BYTES`` bounds);
    ``ReminderError`` if the codec cannot carry it."""
    try:
        return len(pack(value))
    except SerializationError as exc:
        raise ReminderError(f"payload cannot be stored: {exc}") from exc


#: The longest trace context a row keeps (a ``traceparent`` is 55 characters).
_MAX_TRACE_TEXT = 256
_EXTRA_KEYS = frozenset(
    {"j", "sa", "ea", "mt", "fd", "py", "rt", "ov", "cw", "dl", "rs", "tc", "lb", "cl"}
)


def extras_from_record(rec: dict[str, Any]) -> dict[str, Any]:
    """``ReminderEntry`` keyword arguments for the optional fields present in ``rec``
    (``ReminderEntry.extras_record``'s form); absent keys are left out."""
    if _EXTRA_KEYS.isdisjoint(rec):  # most rows: one set operation, no lookups
        return {}
    out: dict[str, Any] = {}
    if (j := rec.get("j")) is not None:
        out["jitter"] = timedelta(milliseconds=j)
    if (sa := rec.get("sa")) is not None:
        out["starts_at"] = from_ms(sa)
    if (ea := rec.get("ea")) is not None:
        out["ends_at"] = from_ms(ea)
    if (mt := rec.get("mt")) is not None:
        out["max_ticks"] = int(mt)
    if (fd := rec.get("fd")) is not None:
        out["final_due"] = from_ms(fd)
    if (py := rec.get("py")) is not None:
        out["payload"] = unpack(base64.b64decode(py))
    if (rt := rec.get("rt")) is not None:
        out["retry"] = RetryPolicy(int(rt[0]), timedelta(milliseconds=rt[1]))
    if (ov := rec.get("ov")) is not None:
        out["overlap"] = OverlapPolicy(int(ov))
    if (cw := rec.get("cw")) is not None:
        out["catchup_window"] = timedelta(milliseconds=cw)
    if (dl := rec.get("dl")) is not None:
        out["deadline"] = timedelta(milliseconds=dl)
    if (rs := rec.get("rs")) is not None:
        out["resumed_at"] = from_ms(rs)
    if (tc := rec.get("tc")) is not None and isinstance(tc, str) and len(tc) <= _MAX_TRACE_TEXT:
        out["trace_context"] = tc
    if lb := rec.get("lb"):
        out["labels"] = {str(k): str(lb[k]) for k in sorted(lb)}
    if (cl := rec.get("cl")) is not None:
        out["calendar"] = str(cl)
        if (ox := rec.get("ox")) is not None:
            out["on_excluded"] = Excluded(int(ox))
        if (cv := rec.get("cv")) is not None:
            out["calendar_version"] = int(cv)
        if (cr := rec.get("cr")) is not None:
            out["_calendar_rules"] = Calendar.from_record(cr)
    return out


#: The longest exception text a fire record keeps.
MAX_ERROR_TEXT = 500


def error_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` for a fire record (the remote type for a
    ``RemoteGrainError``), cut to ``MAX_ERROR_TEXT`` characters."""
    kind = getattr(exc, "remote_type", None) or type(exc).__name__
    message = getattr(exc, "remote_message", None)
    text = f"{kind}: {exc if message is None else message}"
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


class FireOutcome(enum.StrEnum):
    """What became of one slot of a reminder (an entry of its fire history)."""

    OK = "ok"  #: delivered; receive_reminder returned
    GRAIN_ERROR = "grain_error"  #: delivered; receive_reminder raised (not retried)
    MISSED_SKIPPED = "missed_skipped"  #: reached past the grace and skipped (SKIP)
    NOTIFIED = "notified"  #: skipped, and a MissedReminder published (NOTIFY)
    RETRYING = "retrying"  #: delivered; receive_reminder raised; retried (RetryPolicy)
    #: not run again: the grain's state had committed this occurrence
    #: (``PersistentState.write(tick=...)``); its progress persisted as if it ran
    DEDUPLICATED = "deduplicated"


#: ``ReminderEntry(...)`` with the same positional parameters, without the frozen
#: ``__init__`` (``orleanspy._frozen``) or ``__post_init__``: only for callers whose
#: ``action`` is a ``MissedReminderAction`` already (a copy of a row, a row the
#: spec checked). 1.2 us a row against 3.4 us.
make_entry = maker(ReminderEntry)


@dataclass(frozen=True, slots=True)
class FireRecord:
    """One entry of a reminder's fire history.

    ``slot``: the scheduled slot (for a triggered tick, when it was asked for;
    with jitter, the jittered instant); ``at``: when the silo delivered or
    skipped it; ``silo``: that silo's name (its address for a triggered tick,
    which the management grain delivers); ``error``: for ``GRAIN_ERROR`` and
    ``RETRYING``, the exception ``receive_reminder`` raised, as ``Type: message``
    (at most ``MAX_ERROR_TEXT`` characters), else ``None``. ``attempt``: which
    delivery of the slot this was (1 unless a ``RetryPolicy`` retried it);
    ``final``: the reminder's last slot (its row is removed after it).
    ``backfill``: a slot of a backfill (``TickStatus.backfill``).
    """

    grain_id: GrainId
    name: str
    slot: datetime
    at: datetime
    outcome: FireOutcome
    silo: str
    triggered: bool = False
    error: str | None = None
    attempt: int = 1
    final: bool = False
    backfill: bool = False

    def __post_init__(self) -> None:
        # Strings arrive where the enum left (msgpack carries StrEnums as str).
        if type(self.outcome) is not FireOutcome:
            object.__setattr__(self, "outcome", FireOutcome(self.outcome))

    @property
    def lateness(self) -> timedelta:
        return self.at - self.slot

    def to_record(self) -> dict[str, Any]:
        """Storage form (the row is known from where it is stored)."""
        rec: dict[str, Any] = {
            "t": to_ms(self.slot),
            "a": to_ms(self.at),
            "o": self.outcome.value,
            "s": self.silo,
        }
        if self.triggered:
            rec["x"] = True
        if self.error is not None:
            rec["m"] = self.error
        if self.attempt != 1:
            rec["n"] = self.attempt
        if self.final:
            rec["f"] = True
        if self.backfill:
            rec["b"] = True
        return rec

    @classmethod
    def from_record(cls, grain_id: GrainId, name: str, rec: dict[str, Any]) -> FireRecord:
        return cls(
            grain_id=grain_id,
            name=name,
            slot=from_ms(rec["t"]),
            at=from_ms(rec["a"]),
            outcome=FireOutcome(rec["o"]),
            silo=str(rec["s"]),
            triggered=bool(rec.get("x", False)),
            error=None if rec.get("m") is None else str(rec["m"]),
            attempt=int(rec.get("n", 1)),
            final=bool(rec.get("f", False)),
            backfill=bool(rec.get("b", False)),
        )


@dataclass(frozen=True, slots=True)
class ReminderChange:
    """A write to the reminder table: ``next_due`` is ``None`` when the row was removed.

    ``priority`` is set by writes that replace the whole row (``upsert``: a
    registration or a management call) to the row's priority, and ``None`` for
    schedule CASes and removals (see ``ReminderTable``). ``entry``: the row as
    written, with its new etag, when the writer is in this process (a local
    registration or management call; tables' change feeds never carry it), so
    the reminder service applies it at once, without reading it back. Neither
    takes part in equality.
    """

    grain_id: GrainId
    name: str
    next_due: datetime | None
    priority: int | None = field(default=None, compare=False)
    entry: ReminderEntry | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ScheduleUpdate:
    """One compare-and-swap of a row's schedule (see ``ReminderTable.update_schedule``)."""

    grain_id: GrainId
    name: str
    etag: str
    next_due: datetime
    last_fire: datetime | None
    #: Remove the row instead (its schedule ended); ``next_due`` is then ``ENDED``.
    remove: bool = False


@dataclass(frozen=True, slots=True)
class TickStatus:
    """What ``receive_reminder`` is told about a tick.

    ``current_tick_time`` is the scheduled slot (Orleans gives the delivery start
    time there; we give it as ``delivered_at``). ``missed_ticks`` counts the slots
    that passed undelivered and are coalesced into this tick (FIRE_IMMEDIATELY).
    ``triggered``: an extra tick asked for by an operator (``trigger``), off the
    schedule; ``current_tick_time`` is then the time it was asked for.
    ``due_at``: the instant the tick was due, ``current_tick_time`` plus the
    row's jitter offset (equal to it without jitter); the service sets it on
    every tick (``None`` only in a status built without it). ``payload``: the row's
    payload. ``attempt``: which delivery of this slot it is (above 1 only for
    a ``RetryPolicy`` retry). ``final``: the reminder's last tick (a one-shot,
    or the last slot of a bounded one); its row is removed after it.
    ``deadline``: how long this run may take before it is cancelled where it
    runs (``TickDeadlineError``): the reminder's ``deadline``, or less under
    ``OverlapPolicy.CANCEL_OTHER`` (until its next slot); ``None``: no limit.

    ``backfill``: a slot of a past range delivered by ``backfill`` (its
    ``current_tick_time`` is that slot; ``delivered_at`` is now).

    ``occurrence_id``: the same for every delivery of one slot of one
    registration of one reminder (retries, redelivery after a failover or a
    restart, a delivery to a new activation), different for every other slot,
    for each ``trigger``, for a backfilled slot (its own, apart from the live
    slot of the same time) and for a reminder registered again (a registration
    re-anchors ``first_tick_time``). The idempotency key for effects outside the
    grain (an email, a payment call). The silo that runs the tick tells the
    status where it runs (``bind_tick``; it never travels, so silos of 0.1 read
    the status too), and the id is computed when asked for (``occurrence_of``).
    """

    first_tick_time: datetime
    period: timedelta | None
    cron: str | None
    current_tick_time: datetime
    delivered_at: datetime
    missed_ticks: int = 0
    priority: int = ReminderPriority.NORMAL
    triggered: bool = False
    due_at: datetime | None = None
    payload: Any = None
    attempt: int = 1
    final: bool = False
    deadline: timedelta | None = None
    backfill: bool = False
    #: (service id, grain id, reminder name) of the silo running the tick
    #: (``bind_tick``): not part of the value, and never sent (it is ``None`` then).
    _runs: tuple[str, GrainId, str] | None = field(default=None, compare=False, repr=False)

    @property
    def occurrence_id(self) -> str:
        """See the class docstring; ``ReminderError`` for a status no silo ran."""
        runs = self._runs
        if runs is None:
            raise ReminderError(
                "this TickStatus was not delivered by a silo: its occurrence_id is known "
                "only to the status receive_reminder is given"
            )
        return occurrence_of(runs[0], runs[1], runs[2], self)

    @property
    def reminder(self) -> str | None:
        """The reminder's name, once a silo runs the tick (``None`` before)."""
        return None if self._runs is None else self._runs[2]


TICK_DEDUPLICATED = "orleanspy:deduplicated"
"""What a tick call answers when the grain's state had committed its occurrence
(``orleanspy.runtime.ticks``); any other answer is a tick that ran. A 0.1 reminder
service ignores a tick's answer, so it can travel to one."""


def bind_tick(status: TickStatus, service_id: str, grain_id: GrainId, name: str) -> None:
    """Tell ``status`` which tick it is, on the silo that runs it: its
    ``occurrence_id`` and ``reminder`` follow. Sets a field of a frozen value in
    place (one store, where ``dataclasses.replace`` cost about 4.5 us a tick); the
    status is this delivery's own."""
    object.__setattr__(status, "_runs", (service_id, grain_id, name))


def occurrence_of(service_id: str, grain_id: GrainId, name: str, status: TickStatus) -> str:
    """``status.occurrence_id`` for ``name`` of ``grain_id``: 32 hex digits of a
    hash of the service, grain, reminder, registration (``first_tick_time``) and
    slot (``current_tick_time``; a trigger's is the time it was asked for, and a
    backfilled slot's its slot, each marked apart from scheduled slots)."""
    kind = "t" if status.triggered else "b" if status.backfill else "s"
    text = (
        f"{service_id}\n{grain_id.canonical}\n{name}\n{to_ms(status.first_tick_time)}\n"
        f"{kind}{to_ms(status.current_tick_time)}"
    )
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class MissedReminder:
    """Published on ``orleanspy.reminders.missed`` for rows whose action is NOTIFY,
    and for a skipped last slot of any row (a missed one-shot under SKIP): a
    reminder never ends unseen. ``next_due`` is ``None`` when no slot is left
    (the row is removed)."""

    service_id: str
    grain_id: GrainId
    name: str
    scheduled: datetime
    detected_at: datetime
    missed_ticks: int
    next_due: datetime | None


register_type(ReminderEntry, name="orleanspy.ReminderEntry")
register_type(TickStatus, name="orleanspy.TickStatus")
register_type(MissedReminder, name="orleanspy.MissedReminder")
register_type(FireRecord, name="orleanspy.FireRecord")
register_type(RetryPolicy, name="orleanspy.RetryPolicy")
