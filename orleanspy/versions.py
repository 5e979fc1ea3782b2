"""The versions a silo, a client and a store can be asked for, and how they compare.

Three numbers, each with its own job::

    __version__       the release, "0.2.0": the package metadata reads it from here
                      (pyproject.toml: dynamic version), ``orleanspy --version``
                      prints it, every membership row records it
    PROTOCOL          what this release speaks on the wire (silo to silo, client
                      to gateway) and the cluster feature level it can take part
                      in; OLDEST_PROTOCOL is the oldest it still speaks, so the
                      window [OLDEST_PROTOCOL, PROTOCOL] is the releases it runs
                      beside in one cluster
    schema versions   per store and component (reminders, membership, grain
                      state, ...), declared by each provider next to its
                      migration steps (``orleanspy.schema``)

**The supported window** is the previous minor release and this one: 0.2.x speaks
protocols 1 (0.1.x) and 2. Two parties whose windows overlap talk (a gRPC
connection says each side's window in its metadata; a membership row records
its silo's); a joining silo whose window does not overlap a live member's is
refused before it writes anything, with both versions and the window named
(``IncompatibleVersionError``). A row or a connection that says nothing was
written by 0.1.x, which speaks protocol 1 only.

**Features that need every silo** (a new message, a new stored field) are each
tied to the protocol level that brings them (``Feature``). A cluster's level is
the lowest protocol among its live members' rows (``membership.agreement``);
a feature is used only while that level reaches it, so a mixed cluster keeps
to what its oldest member understands, and switches the feature on when the
last older silo leaves. Nothing is switched on by a release's default alone.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import Final

from orleanspy.errors import ConfigurationError

__all__ = [
    "OLDEST_PROTOCOL",
    "PROTOCOL",
    "Feature",
    "FeatureUnavailableError",
    "IncompatibleVersionError",
    "ProtocolWindow",
    "__version__",
    "incompatibility",
    "release_of",
]

__version__: Final = "0.2.0"

PROTOCOL: Final = 2
"""The wire protocol and cluster feature level this release speaks (at most)."""

OLDEST_PROTOCOL: Final = 1
"""The oldest protocol this release still speaks: the previous minor release's."""

#: The releases that introduced each protocol (for messages).
_RELEASES: Final = {1: "0.1", 2: "0.2"}


def release_of(protocol: int) -> str:
    """The release line that speaks ``protocol`` at most, for messages ("0.1.x");
    one this release cannot name is "the release of protocol N"."""
    known = _RELEASES.get(protocol)
    return f"{known}.x" if known is not None else f"the release of protocol {protocol}"


_ordinal = itertools.count()


class Feature(int, enum.Enum):
    """A capability every live silo must have before any silo uses it. A member
    *is* the protocol level that brings it (an ``int``: ``level >=
    Feature.TICK_COMMIT``, ``int(Feature.OUTBOX)``), and each member is its own
    (features of one level are not aliases of each other: ``.name`` names the
    feature; ``Feature["OUTBOX"]`` finds it by name)."""

    def __new__(cls, level: int) -> Feature:
        member = int.__new__(cls, level)
        # A value of its own per member (the level and an ordinal), so that two
        # features of one level stay two members.
        member._value_ = (level, next(_ordinal))
        return member

    @property
    def level(self) -> int:
        """The protocol level that brings the feature."""
        return int(self)

    # The value is no int (enum's own forms would print it as one): said by name.
    def __repr__(self) -> str:
        return f"<Feature.{self.name}: protocol {int(self)}>"

    def __str__(self) -> str:
        return f"Feature.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    #: A silo without ``MembershipOptions.balanced_ring`` set builds the ring the
    #: cluster builds (balanced unless a live silo insists on the hashed one)
    #: instead of refusing to join.
    RING_FOLLOWS_CLUSTER = 2
    #: Grain state stored in format 2: the value and the reminder ticks it
    #: committed (``PersistentState.write(tick=...)``). 0.1.x cannot read it.
    TICK_COMMIT = 2
    #: Outbox messages queued in a grain state's record (``write(after=...)``),
    #: sent by the activation once the write commits.
    OUTBOX = 2
    #: A reminder row keeps the ``traceparent`` of the span that registered or
    #: last changed it (``ReminderEntry.trace_context``, the extras key ``tc``),
    #: and each tick's span links to it. Below: no row keeps one; ticks are
    #: traced without the link.
    TRACE_LINKS = 2
    #: Management actions are recorded in the operator audit log (a key family
    #: per reminder shard on Redis, a table on PostgreSQL) together with their
    #: write. Below: they run unaudited, as 0.1 runs them.
    AUDIT_LOG = 2
    #: Reminder rows with ``overlap=`` (what a slot that falls due while the
    #: previous tick of the reminder runs becomes). 0.1.x ignores the field.
    OVERLAP_POLICY = 2
    #: Reminder rows with ``catchup_window=`` (how far back a missed slot may
    #: still get its catch-up tick). 0.1.x ignores the field.
    CATCHUP_WINDOW = 2
    #: Reminder ticks cut at a deadline where they run (``deadline=``,
    #: ``ReminderOptions.tick_deadline``, ``OverlapPolicy.CANCEL_OTHER``): the
    #: deadline travels in ``TickStatus``, which 0.1.x reads without it.
    TICK_DEADLINE = 2
    #: Failed ticks kept as dead letters (a key family and a table 0.1.x does not know).
    DEAD_LETTERS = 2
    #: Per-reminder counters (delivered, failed, skipped by reason, ...), kept
    #: beside the rows (a key family and a table 0.1.x does not know).
    REMINDER_COUNTERS = 2
    #: Reminder rows with ``labels`` (and the tables' label index). A 0.1.x silo
    #: rewriting such a row would drop them.
    REMINDER_LABELS = 2
    #: Named calendars and rows that use one (``calendar=``, ``on_excluded=``).
    #: A 0.1.x silo owning such a row would fire on excluded days.
    REMINDER_CALENDARS = 2
    #: Backfill jobs and ticks with ``TickStatus.backfill``. A 0.1.x grain would
    #: take a backfilled tick for a live one.
    REMINDER_BACKFILL = 2


class IncompatibleVersionError(ConfigurationError):
    """Two parties whose protocol windows do not overlap: they cannot share a cluster."""


class FeatureUnavailableError(ConfigurationError):
    """A call needs a ``Feature`` that some live silo of the cluster lacks (the
    cluster's feature level is below it). Nothing was written. ``feature`` names
    it and ``lacking`` the silos that lack it (address and release), as the
    message does; finish the roll (every silo on a release that brings it)."""

    def __init__(self, message: str, feature: str | None = None, lacking: tuple[str, ...] = ()):
        super().__init__(message)
        self.feature = feature
        self.lacking = lacking


@dataclass(frozen=True, slots=True)
class ProtocolWindow:
    """The protocols a party speaks, ``oldest`` to ``newest`` inclusive."""

    oldest: int
    newest: int

    @classmethod
    def mine(cls) -> ProtocolWindow:
        return cls(OLDEST_PROTOCOL, PROTOCOL)

    @classmethod
    def parse(cls, text: str | None) -> ProtocolWindow:
        """A window as a header carries it (``"1-2"``, or ``"2"``); ``None`` (no
        header: a 0.1.x party) is protocol 1 alone. ``IncompatibleVersionError``
        for text that is not a window (a hostile or broken peer)."""
        if text is None:
            return cls(1, 1)
        oldest, sep, newest = text.strip().partition("-")
        if not sep:
            newest = oldest
        if not (oldest.isdigit() and newest.isdigit()) or len(text) > 24:
            raise IncompatibleVersionError(f"malformed protocol window {text[:40]!r}")
        window = cls(int(oldest), int(newest))
        if window.oldest > window.newest or window.oldest < 1:
            raise IncompatibleVersionError(f"malformed protocol window {text[:40]!r}")
        return window

    def text(self) -> str:
        """The header form (``parse``'s inverse)."""
        return f"{self.oldest}-{self.newest}"

    def overlaps(self, other: ProtocolWindow) -> bool:
        return self.oldest <= other.newest and other.oldest <= self.newest

    def common(self, other: ProtocolWindow) -> int:
        """The newest protocol both speak (the two must overlap)."""
        return min(self.newest, other.newest)

    def describe(self) -> str:
        """For messages: "protocols 1-2 (0.1.x to 0.2.x)"; windows newer than this
        release can name are said as numbers only."""
        if self.oldest in _RELEASES and self.newest in _RELEASES:
            if self.oldest == self.newest:
                return f"protocol {self.oldest} ({release_of(self.oldest)})"
            return (
                f"protocols {self.oldest}-{self.newest} "
                f"({release_of(self.oldest)} to {release_of(self.newest)})"
            )
        if self.oldest == self.newest:
            return f"protocol {self.oldest}"
        return f"protocols {self.oldest}-{self.newest}"


def incompatibility(mine: ProtocolWindow, theirs: ProtocolWindow, who: str) -> str | None:
    """Why a party speaking ``mine`` cannot talk with ``who`` speaking ``theirs``
    (``None``: they can). The sentence names both windows and the way out."""
    if mine.overlaps(theirs):
        return None
    if theirs.newest < mine.oldest:
        way = (
            f"it is too old for this release: upgrade it to {release_of(mine.oldest)} "
            "or newer first (a cluster upgrades one minor release at a time)"
        )
    else:
        way = (
            "this release is too old for it: run a release that speaks protocol "
            f"{theirs.oldest} or newer here"
        )
    return (
        f"this side runs orleanspy {__version__}, which speaks {mine.describe()}; "
        f"{who} speaks {theirs.describe()}: {way}"
    )
