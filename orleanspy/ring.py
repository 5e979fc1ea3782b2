"""The consistent-hash ring: ranges of the 32-bit uniform hash space.

Every Active silo puts ``buckets_per_silo`` points on a circle of ``2**32``
hashes (``uniform_hash(f"{silo}#{i}")``). A hash belongs to the first point at
or after it, wrapping past the top, so the point ``p`` owns ``(previous, p]``.

The ring is a pure function of the silo set and the ``balanced`` setting:
every process that sees the same Active silos builds the same ring, which is
what lets silos agree on owners without talking to each other. Silos that
differ in the setting would not agree, so a silo records its setting in the
membership table and one that differs from the live members' refuses to join
(``orleanspy.membership.agreement``).

Balanced (``balanced=True``, the default, and ``MembershipOptions.balanced_ring``'s):
the hashed points are then moved, deterministically and in integer
arithmetic, until every silo owns its fair share (``_balance``): each boundary
between two silos' arcs shifts by a part of their difference, never past half
of either neighbouring arc, so the order of the points and the number of arcs
stay as hashed. Thirty random points per silo leave the busiest silo of a
3-silo ring 1.29x its fair share at p90 (1.45x at 10 silos); balanced, within
1.01x at 2-10 silos. The price: a join or leave moves a median 1.1-1.4x the
minimal 1/N, as boundaries between other silos shift too.

Hashed (``balanced=False``): the points stay where they hash. Many small arcs
per silo keep the shares roughly even, and a silo joining or leaving moves
only about ``1/N`` of the space, all of it to or from that silo.

Sets of ranges (what a silo owns, what it gained or lost) are handled by the
free functions ``merge_ranges``, ``subtract_ranges``, ``intersect_ranges`` and
``ranges_contain``; they all return the same canonical form: disjoint,
non-adjacent ranges ordered by ``begin``, with ``RingRange(0, 0)`` standing for
the whole ring.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

from orleanspy.identity import SiloAddress, uniform_hash

__all__ = [
    "DEFAULT_BUCKETS_PER_SILO",
    "HASH_SPACE",
    "ConsistentRing",
    "RangeDiff",
    "RingRange",
    "diff_ranges",
    "intersect_ranges",
    "merge_ranges",
    "ranges_contain",
    "ranges_size",
    "subtract_ranges",
    "taken_from_live",
]

HASH_SPACE = 1 << 32
_TOP = HASH_SPACE - 1

DEFAULT_BUCKETS_PER_SILO = 30


@dataclass(frozen=True, slots=True)
class RingRange:
    """Hashes in ``(begin, end]``; wraps when ``begin >= end``; ``(0, 0)`` is everything."""

    begin: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.begin < HASH_SPACE and 0 <= self.end < HASH_SPACE):
            raise ValueError(f"ring range bounds must be in [0, 2**32): {self}")

    def __contains__(self, h: object) -> bool:
        if not isinstance(h, int):
            return False
        if self.begin < self.end:
            return self.begin < h <= self.end
        return h > self.begin or h <= self.end

    @property
    def size(self) -> int:
        """How many hash values the range holds."""
        return (self.end - self.begin) % HASH_SPACE or HASH_SPACE

    @classmethod
    def full(cls) -> RingRange:
        return cls(0, 0)

    def intervals(self) -> list[tuple[int, int]]:
        """The range as closed intervals ``[lo, hi]`` of hashes, in ring order from
        ``begin``: one, or two when it wraps past ``2**32 - 1`` (the part up to the
        top first). What a store's hash index scans."""
        if self.size == HASH_SPACE:
            return [(0, _TOP)]
        lo = (self.begin + 1) % HASH_SPACE
        if lo <= self.end:
            return [(lo, self.end)]
        return [(lo, _TOP), (0, self.end)]


# --- sets of ranges -------------------------------------------------------------
#
# Set algebra on arcs is done on closed linear intervals ``[lo, hi]`` of
# ``[0, 2**32)``: a wrapping arc is two intervals, so union, difference and
# intersection become ordinary sorted-interval sweeps.

_Interval = tuple[int, int]


def _intervals(ranges: Iterable[RingRange]) -> list[_Interval]:
    """Sorted, disjoint, non-adjacent closed intervals covering exactly ``ranges``."""
    raw: list[_Interval] = []
    for r in ranges:
        if r.size == HASH_SPACE:
            return [(0, _TOP)]
        lo = (r.begin + 1) % HASH_SPACE
        if lo <= r.end:
            raw.append((lo, r.end))
        else:
            raw.append((lo, _TOP))
            raw.append((0, r.end))
    raw.sort()
    merged: list[_Interval] = []
    for lo, hi in raw:
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


def _ranges(intervals: list[_Interval]) -> tuple[RingRange, ...]:
    """The canonical ranges for sorted, disjoint, non-adjacent ``intervals``."""
    if not intervals:
        return ()
    if intervals == [(0, _TOP)]:
        return (RingRange.full(),)
    # An interval starting at 0 and one ending at the top are one arc across the wrap.
    if len(intervals) > 1 and intervals[0][0] == 0 and intervals[-1][1] == _TOP:
        head = intervals[0]
        intervals = [*intervals[1:-1], (intervals[-1][0], head[1])]
    return tuple(RingRange((lo - 1) % HASH_SPACE, hi) for lo, hi in intervals)


def merge_ranges(ranges: Iterable[RingRange]) -> tuple[RingRange, ...]:
    """The union of ``ranges`` in canonical form (overlapping and adjacent arcs joined)."""
    return _ranges(_intervals(ranges))


def _subtract(a: list[_Interval], b: list[_Interval]) -> list[_Interval]:
    out: list[_Interval] = []
    j = 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] < cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] <= hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0] - 1))
            cur = max(cur, b[k][1] + 1)
            k += 1
        if cur <= hi:
            out.append((cur, hi))
    return out


def subtract_ranges(
    ranges: Iterable[RingRange], minus: Iterable[RingRange]
) -> tuple[RingRange, ...]:
    """Hashes in ``ranges`` but not in ``minus``, in canonical form."""
    return _ranges(_subtract(_intervals(ranges), _intervals(minus)))


def intersect_ranges(a: Iterable[RingRange], b: Iterable[RingRange]) -> tuple[RingRange, ...]:
    """Hashes in both ``a`` and ``b``, in canonical form."""
    left = _intervals(a)
    return _ranges(_subtract(left, _subtract(left, _intervals(b))))


def ranges_contain(ranges: Iterable[RingRange], h: int) -> bool:
    """Whether any of ``ranges`` holds the hash ``h``."""
    return any(h in r for r in ranges)


def ranges_size(ranges: Iterable[RingRange]) -> int:
    """How many distinct hash values ``ranges`` cover together (overlaps counted once)."""
    return sum(hi - lo + 1 for lo, hi in _intervals(ranges))


# --- the ring ----------------------------------------------------------------------


class ConsistentRing:
    """An immutable ring of silos with virtual buckets.

    ``build(silos)`` is deterministic: the same silo set gives the same ring in
    every process. Two silos' points may collide (32-bit hashes); the point then
    goes to the smaller ``SiloAddress``, which every process picks alike.
    ``len(ring)`` is the number of silos; two rings are equal when they have the
    same silos, buckets per silo and ``balanced`` setting.
    """

    __slots__ = ("_balanced", "_buckets", "_owners", "_points", "_ranges", "_silos")

    def __init__(
        self,
        silos: Iterable[SiloAddress] = (),
        buckets_per_silo: int = DEFAULT_BUCKETS_PER_SILO,
        *,
        balanced: bool = True,
    ) -> None:
        if buckets_per_silo < 1:
            raise ValueError(f"buckets_per_silo must be at least 1, got {buckets_per_silo}")
        self._buckets = buckets_per_silo
        self._silos: tuple[SiloAddress, ...] = tuple(sorted(set(silos)))
        placed = sorted(
            (uniform_hash(f"{silo}#{i}"), silo)
            for silo in self._silos
            for i in range(buckets_per_silo)
        )
        points: list[int] = []
        owners: list[SiloAddress] = []
        for point, silo in placed:
            if points and points[-1] == point:
                continue  # a collision: the smaller address, sorted first, keeps it
            points.append(point)
            owners.append(silo)
        self._balanced = balanced
        if balanced and len(self._silos) > 1:
            _balance(points, owners, self._silos, buckets_per_silo)
        self._points = tuple(points)
        self._owners = tuple(owners)
        self._ranges = self._compute_ranges()

    @classmethod
    def build(
        cls,
        silos: Iterable[SiloAddress],
        buckets_per_silo: int = DEFAULT_BUCKETS_PER_SILO,
        *,
        balanced: bool = True,
    ) -> ConsistentRing:
        """The ring of ``silos`` (duplicates ignored), ``buckets_per_silo`` points
        each; ``balanced`` (default): points moved until every share is fair,
        ``False``: points where they hash (module doc)."""
        return cls(silos, buckets_per_silo, balanced=balanced)

    def _compute_ranges(self) -> dict[SiloAddress, tuple[RingRange, ...]]:
        n = len(self._points)
        if n == 0:
            return {}
        owners = self._owners
        # Start the sweep at a point whose predecessor has another owner, so no
        # run of one silo's consecutive points is split across the wrap.
        start = next((i for i in range(n) if owners[i - 1] != owners[i]), None)
        if start is None:
            return {owners[0]: (RingRange.full(),)}
        runs: dict[SiloAddress, list[RingRange]] = {}
        k = 0
        while k < n:
            first = (start + k) % n
            owner = owners[first]
            last = first
            k += 1
            while k < n and owners[(start + k) % n] == owner:
                last = (start + k) % n
                k += 1
            runs.setdefault(owner, []).append(
                RingRange(self._points[first - 1], self._points[last])
            )
        return {silo: tuple(sorted(rs, key=lambda r: r.begin)) for silo, rs in runs.items()}

    @property
    def silos(self) -> tuple[SiloAddress, ...]:
        """The silos on the ring, sorted."""
        return self._silos

    @property
    def buckets_per_silo(self) -> int:
        return self._buckets

    def owner(self, h: int) -> SiloAddress | None:
        """The silo owning hash ``h`` (the first point ``>= h``, wrapping); ``None`` if empty."""
        points = self._points
        if not points:
            return None
        i = bisect_left(points, h)
        return self._owners[i if i < len(points) else 0]

    def ranges_of(self, silo: SiloAddress) -> tuple[RingRange, ...]:
        """What ``silo`` owns, merged and ordered by ``begin``; ``()`` if it is not on
        the ring; ``(RingRange(0, 0),)`` when it is the only silo."""
        return self._ranges.get(silo, ())

    def __len__(self) -> int:
        return len(self._silos)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConsistentRing):
            return NotImplemented
        return (
            self._buckets == other._buckets
            and self._silos == other._silos
            and self._balanced == other._balanced
        )

    def __hash__(self) -> int:
        return hash((self._buckets, self._silos, self._balanced))

    def __repr__(self) -> str:
        silos = ", ".join(str(s) for s in self._silos)
        return (
            f"ConsistentRing([{silos}], buckets_per_silo={self._buckets}, "
            f"balanced={self._balanced})"
        )


#: Passes of ``_balance`` over every boundary; 10 leave the busiest of 10 silos
#: within 1.001x fair at p90 (30 points each).
_BALANCE_SWEEPS = 10


def _balance(
    points: list[int], owners: list[SiloAddress], silos: tuple[SiloAddress, ...], k: int
) -> None:
    """Move ``points`` (sorted, owned by ``owners``) in place towards equal shares.

    A boundary ``points[i]`` between silo ``a``'s arc (ending there) and silo
    ``b``'s (the next) moves by ``(share[b] - share[a]) / 2k``, giving ``a`` more
    when it has less, clamped to half of either arc, so points keep their order;
    the last point never moves past the top of the space (nor the first below 0),
    so the list stays sorted. Integer arithmetic: every process gets the same ring.
    """
    m = len(points)
    index = {silo: j for j, silo in enumerate(silos)}
    own = [index[o] for o in owners]
    share = [0] * len(silos)
    for i in range(m):
        share[own[i]] += (points[i] - points[i - 1]) % HASH_SPACE or HASH_SPACE
    for _ in range(_BALANCE_SWEEPS):
        for i in range(m):
            a, b = own[i], own[(i + 1) % m]
            if a == b:
                continue
            down = (points[i] - points[i - 1]) % HASH_SPACE // 2  # half of a's arc
            up = (points[(i + 1) % m] - points[i]) % HASH_SPACE // 2  # half of b's arc
            d = max(-down, min(up, (share[b] - share[a]) // (2 * k)))
            moved = points[i] + d
            if d == 0 or not 0 <= moved < HASH_SPACE:
                continue
            points[i] = moved
            share[a] += d
            share[b] -= d


@dataclass(frozen=True, slots=True)
class RangeDiff:
    """What one silo gains and loses between two rings, as canonical range sets."""

    gained: tuple[RingRange, ...]
    lost: tuple[RingRange, ...]

    @property
    def changed(self) -> bool:
        return bool(self.gained or self.lost)


def taken_from_live(
    old: ConsistentRing, new: ConsistentRing, silo: SiloAddress
) -> tuple[RingRange, ...]:
    """The hashes ``silo`` owns in ``new`` that another silo of ``new`` owned in
    ``old``: taken over from a silo that is still alive (and may still be
    finishing its work on them), as a canonical range set."""
    gained = subtract_ranges(new.ranges_of(silo), old.ranges_of(silo))
    if not gained:
        return ()
    alive = set(old.silos) & set(new.silos) - {silo}
    held = merge_ranges(r for other in alive for r in old.ranges_of(other))
    return intersect_ranges(gained, held)


def diff_ranges(old: ConsistentRing, new: ConsistentRing, silo: SiloAddress) -> RangeDiff:
    """The hashes ``silo`` owns in ``new`` but not in ``old`` (gained) and the reverse (lost)."""
    before = old.ranges_of(silo)
    after = new.ranges_of(silo)
    if before == after:
        return RangeDiff((), ())
    return RangeDiff(gained=subtract_ranges(after, before), lost=subtract_ranges(before, after))
