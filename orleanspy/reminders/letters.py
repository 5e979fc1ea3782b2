"""Dead letters: ticks that failed their last attempt, kept for an operator.

A tick whose ``receive_reminder`` raised on its last attempt (its
``RetryPolicy`` exhausted, or given up because the next slot came first, or no
policy at all), a ``TickDeadlineError`` included, becomes a ``DeadLetter``: the
grain, the reminder, the slot and everything its ``TickStatus`` said, the
occurrence id, how many attempts were made, and the last error's type,
message and traceback text. ``replay`` delivers it again as that slot (the
same ``occurrence_id``, so a state that committed it dedupes it) and removes
it when that succeeds; ``discard`` removes it.

A table that keeps them is a ``DeadLetterTable`` (optional; the memory, Redis
and PostgreSQL tables are). Storage is bounded: every ``add_dead_letters``
drops the letters dead-lettered before ``expire_before`` (the caller's clock
less ``ReminderOptions.dead_letter_retention``) and all but the newest
``keep`` (``ReminderOptions.max_dead_letters``) of the service's. A letter's
id is its occurrence id, so a slot dead-lettered twice (a redelivery after a
failover, a replay that failed again) is one letter, the latest write's.

Letters are listed newest first: by the time they were dead-lettered, then
by id, both descending; ``read_dead_letters`` pages through them with an
opaque cursor, optionally only one grain's and/or one reminder name's.
"""

from __future__ import annotations

import base64
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Protocol, runtime_checkable

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import TickStatus, encode_payload
from orleanspy.serialization import register_type, unpack

__all__ = [
    "MAX_DEAD_LETTER_PAGE",
    "MAX_MESSAGE_TEXT",
    "MAX_TRACEBACK_TEXT",
    "DeadLetter",
    "DeadLetterPage",
    "DeadLetterTable",
    "after_cursor",
    "clip",
    "clip_tail",
    "error_parts",
    "failed_again",
    "letter_cursor",
    "newest_first",
    "parse_letter_cursor",
]

#: The longest traceback text a dead letter keeps (its tail: the innermost frames).
MAX_TRACEBACK_TEXT: Final = 8000
#: The longest message text a dead letter keeps.
MAX_MESSAGE_TEXT: Final = 2000
#: The most letters one page may ask for.
MAX_DEAD_LETTER_PAGE: Final = 1000


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A tick that failed its last attempt (module docstring).

    ``id`` is the tick's ``occurrence_id``. ``slot`` is its
    ``TickStatus.current_tick_time`` and ``due_at`` the instant it was due
    (with jitter); ``first_tick_time``, ``period``, ``cron``, ``priority``,
    ``missed_ticks``, ``payload``, ``final`` and ``deadline`` are what its
    status said, so a replay delivers the same tick. ``attempts``: deliveries
    of the slot that failed (replays included). ``error_type`` is the
    exception's type name (the remote one for an error that crossed silos),
    ``message`` its text, ``traceback`` the formatted traceback (cut to its
    last ``MAX_TRACEBACK_TEXT`` characters). ``at``: when it was dead-lettered
    (again, after a failed replay); ``silo``: which silo did.
    """

    id: str
    grain_id: GrainId
    name: str
    slot: datetime
    first_tick_time: datetime
    attempts: int
    error_type: str
    message: str
    traceback: str
    at: datetime
    silo: str
    due_at: datetime | None = None
    period: timedelta | None = None
    cron: str | None = None
    priority: int = 0
    missed_ticks: int = 0
    payload: Any = field(default=None, hash=False)
    final: bool = False
    deadline: timedelta | None = None

    @property
    def occurrence_id(self) -> str:
        """The tick's ``TickStatus.occurrence_id`` (the letter's id)."""
        return self.id

    def status(self, delivered_at: datetime) -> TickStatus:
        """The status a replay delivers: the failed tick's, delivered at
        ``delivered_at``, as the attempt after the failed ones."""
        return TickStatus(
            first_tick_time=self.first_tick_time,
            period=self.period,
            cron=self.cron,
            current_tick_time=self.slot,
            delivered_at=delivered_at,
            missed_ticks=self.missed_ticks,
            priority=self.priority,
            due_at=self.due_at,
            payload=self.payload,
            attempt=self.attempts + 1,
            final=self.final,
            deadline=self.deadline,
        )

    def to_record(self) -> dict[str, Any]:
        """Storage form: plain msgpack types (the payload as the row stores its
        own, base64 text of the codec's bytes), times in ms; optional fields only
        when set."""
        rec: dict[str, Any] = {
            "i": self.id,
            "g": self.grain_id.canonical,
            "n": self.name,
            "t": to_ms(self.slot),
            "a": to_ms(self.first_tick_time),
            "k": self.attempts,
            "y": self.error_type,
            "m": self.message,
            "b": self.traceback,
            "w": to_ms(self.at),
            "s": self.silo,
        }
        if self.due_at is not None:
            rec["d"] = to_ms(self.due_at)
        if self.period is not None:
            rec["p"] = self.period // timedelta(milliseconds=1)
        if self.cron is not None:
            rec["c"] = self.cron
        if self.priority:
            rec["r"] = self.priority
        if self.missed_ticks:
            rec["x"] = self.missed_ticks
        if self.payload is not None:
            rec["py"] = encode_payload(self.payload)
        if self.final:
            rec["f"] = True
        if self.deadline is not None:
            rec["dl"] = self.deadline // timedelta(milliseconds=1)
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> DeadLetter:
        """Inverse of ``to_record``; ``StorageError`` for a malformed record."""
        try:
            get = rec.get
            return cls(
                id=str(rec["i"]),
                grain_id=GrainId.parse(rec["g"]),
                name=str(rec["n"]),
                slot=from_ms(rec["t"]),
                first_tick_time=from_ms(rec["a"]),
                attempts=int(rec["k"]),
                error_type=str(rec["y"]),
                message=str(rec["m"]),
                traceback=str(rec["b"]),
                at=from_ms(rec["w"]),
                silo=str(rec["s"]),
                due_at=None if get("d") is None else from_ms(rec["d"]),
                period=None if get("p") is None else timedelta(milliseconds=rec["p"]),
                cron=get("c"),
                priority=int(get("r") or 0),
                missed_ticks=int(get("x") or 0),
                payload=None if get("py") is None else unpack(base64.b64decode(rec["py"])),
                final=bool(get("f", False)),
                deadline=None if get("dl") is None else timedelta(milliseconds=rec["dl"]),
            )
        except (KeyError, TypeError, ValueError, SerializationError) as exc:
            raise StorageError(f"malformed dead letter record: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    """One page of dead letters, newest first, and the cursor of the next
    (``None``: no more)."""

    letters: list[DeadLetter]
    cursor: str | None


register_type(DeadLetter, name="orleanspy.DeadLetter")
register_type(DeadLetterPage, name="orleanspy.DeadLetterPage")


def letter_cursor(letter: DeadLetter) -> str:
    """The ``read_dead_letters`` cursor after ``letter``: ``"<at ms>:<id>"``."""
    return f"{to_ms(letter.at)}:{letter.id}"


def parse_letter_cursor(cursor: str | None) -> tuple[int, str] | None:
    """The ``(at ms, id)`` a ``letter_cursor`` names (``None`` for ``None``);
    ``ValueError`` for a string that is not such a cursor."""
    if cursor is None:
        return None
    at, sep, letter_id = cursor.partition(":")
    if not sep or not at.lstrip("-").isdigit() or not letter_id or len(cursor) > 200:
        raise ValueError(f"not a dead letter cursor: {cursor!r}")
    return int(at), letter_id


@runtime_checkable
class DeadLetterTable(Protocol):
    """A reminder table that keeps dead letters (optional; module docstring).

    Dead letters belong to the service, not to a row: removing a row keeps its
    letters (a replay still reaches the grain). Writes are not published on the
    change feed. Lost races are values: removing a letter that is not there
    returns ``False``.
    """

    async def add_dead_letters(
        self, letters: Sequence[DeadLetter], *, keep: int, expire_before: datetime
    ) -> None:
        """Store ``letters`` (one whose id is stored already replaces it), then
        drop every letter dead-lettered before ``expire_before`` and all but the
        newest ``keep`` (>= 1). One round trip (Redis: one script call on the
        service's dead-letter keys, which share one hash tag)."""
        ...

    async def read_dead_letters(
        self,
        cursor: str | None,
        limit: int,
        *,
        grain_id: GrainId | None = None,
        name: str | None = None,
    ) -> tuple[list[DeadLetter], str | None]:
        """At most ``limit`` (>= 1) letters after ``cursor`` (``None``: the
        newest), newest first, only ``grain_id``'s and/or only those of
        reminder ``name`` when given; and the cursor of the next page (``None``
        when none is left). ``ValueError`` for a cursor this table did not make."""
        ...

    async def read_dead_letter(self, letter_id: str) -> DeadLetter | None:
        """The letter with id ``letter_id``, or ``None``."""
        ...

    async def remove_dead_letter(self, letter_id: str) -> bool:
        """Remove the letter; ``False`` if there was none."""
        ...

    async def count_dead_letters(self) -> int:
        """How many letters the service has (from an index, never by reading letters)."""
        ...


def newest_first(letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """``letters`` in the listing order (``at`` then id, descending)."""
    return sorted(letters, key=lambda d: (to_ms(d.at), d.id), reverse=True)


def after_cursor(letter: DeadLetter, cursor: tuple[int, str] | None) -> bool:
    """Whether ``letter`` comes after the cursor position in the listing order."""
    if cursor is None:
        return True
    return (to_ms(letter.at), letter.id) < cursor


def clip(text: str, limit: int) -> str:
    """``text`` cut to its first ``limit`` characters (``…`` marks the cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip_tail(text: str, limit: int) -> str:
    """``text`` cut to its last ``limit`` characters (a traceback's innermost
    frames are the ones that say what failed)."""
    return text if len(text) <= limit else "…" + text[len(text) - limit + 1 :]


def error_parts(exc: BaseException) -> tuple[str, str, str]:
    """``(type, message, traceback)`` of a tick's failure, as a letter keeps
    them: the remote type, message and traceback for an error that crossed
    silos as such, else the exception's own (a rebuilt one's traceback carries
    the remote one as a note)."""
    kind = getattr(exc, "remote_type", None) or type(exc).__qualname__
    message = getattr(exc, "remote_message", None)
    text = str(exc) if message is None else str(message)
    remote = getattr(exc, "remote_traceback", "")
    tb = remote or "".join(traceback.format_exception(exc))
    return str(kind), clip(text, MAX_MESSAGE_TEXT), clip_tail(tb, MAX_TRACEBACK_TEXT)


def failed_again(letter: DeadLetter, exc: BaseException, at: datetime, silo: str) -> DeadLetter:
    """``letter`` after a replay that raised ``exc`` at ``at`` on ``silo``: one
    attempt more, that error, dead-lettered again then."""
    kind, message, tb = error_parts(exc)
    return replace(
        letter,
        attempts=letter.attempts + 1,
        error_type=kind,
        message=message,
        traceback=tb,
        at=at,
        silo=silo,
    )
