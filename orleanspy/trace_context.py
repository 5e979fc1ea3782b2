"""Trace context on the wire: the W3C Trace Context headers, parsed with limits.

A grain call carries its caller's trace context in its message's header map
as ``traceparent`` and ``tracestate`` (``orleanspy.tracing`` says when). A
header from the network is never trusted: one that is malformed or oversized
is dropped (the call goes on without a parent), never an error, so a hostile
peer or client cannot fail a call or a silo with it. Pure Python: the gateway
checks a client's headers with it whether or not the process traces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, NamedTuple

__all__ = [
    "MAX_TRACEPARENT",
    "MAX_TRACESTATE",
    "MAX_TRACESTATE_MEMBERS",
    "TRACEPARENT",
    "TRACESTATE",
    "TraceParent",
    "clean_tracestate",
    "parse_traceparent",
    "trace_headers",
]

#: The message header names (W3C Trace Context, lower case as on HTTP).
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

#: The longest ``traceparent`` accepted: 55 characters for version 00; a later
#: version may append fields, up to this.
MAX_TRACEPARENT: Final = 256
#: The longest ``tracestate`` kept (W3C: propagate at least 512 characters).
MAX_TRACESTATE: Final = 512
#: The most list members of a ``tracestate`` (W3C's limit).
MAX_TRACESTATE_MEMBERS: Final = 32

_HEX32 = re.compile(r"[0-9a-f]{32}\Z")
_HEX16 = re.compile(r"[0-9a-f]{16}\Z")
_HEX2 = re.compile(r"[0-9a-f]{2}\Z")
# W3C tracestate: a simple key, or tenant@system; a value of printable ASCII
# without "," and "=", not ending in a space.
_TS_KEY = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})\Z"
)
_TS_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]\Z")


class TraceParent(NamedTuple):
    """A parsed ``traceparent``: ids as ints, ``flags`` the trace flags byte."""

    trace_id: int
    span_id: int
    flags: int

    def header(self) -> str:
        """The version-00 header text."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse_traceparent(text: object) -> TraceParent | None:
    """The trace parent a ``traceparent`` header names, or ``None`` for anything
    that is not one (W3C Trace Context level 1): not a string, longer than
    ``MAX_TRACEPARENT``, version ``ff`` or not hex, ids not lower-case hex or all
    zero, version 00 with anything after the flags. A later version is read by
    its first four fields, as the specification asks."""
    if not isinstance(text, str) or not 55 <= len(text) <= MAX_TRACEPARENT:
        return None
    version, trace_id, span_id, flags = text[0:2], text[3:35], text[36:52], text[53:55]
    if text[2] != "-" or text[35] != "-" or text[52] != "-":
        return None
    if not _HEX2.match(version) or version == "ff":
        return None
    if version == "00" and len(text) != 55:
        return None
    if len(text) > 55 and text[55] != "-":
        return None
    if not (_HEX32.match(trace_id) and _HEX16.match(span_id) and _HEX2.match(flags)):
        return None
    trace, span = int(trace_id, 16), int(span_id, 16)
    if not trace or not span:
        return None
    return TraceParent(trace, span, int(flags, 16))


def clean_tracestate(text: object) -> str | None:
    """``text`` if it is a well-formed ``tracestate`` within the limits (at most
    ``MAX_TRACESTATE`` characters, ``MAX_TRACESTATE_MEMBERS`` members, each
    ``key=value`` as W3C defines them, no key twice), else ``None``: a bad
    ``tracestate`` is dropped whole, the ``traceparent`` beside it kept."""
    if not isinstance(text, str) or not text or len(text) > MAX_TRACESTATE:
        return None
    members = [m.strip(" \t") for m in text.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > MAX_TRACESTATE_MEMBERS:
        return None
    seen: set[str] = set()
    for member in members:
        key, sep, value = member.partition("=")
        if not sep or key in seen or not _TS_KEY.match(key) or not _TS_VALUE.match(value):
            return None
        seen.add(key)
    return ",".join(members)


def trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Only the trace context of ``headers``, checked: a valid ``traceparent``
    (normalised to version 00) and, beside it, a valid ``tracestate``; empty
    otherwise. What a gateway keeps of a client's headers."""
    parent = parse_traceparent(headers.get(TRACEPARENT))
    if parent is None:
        return {}
    kept = {TRACEPARENT: parent.header()}
    state = clean_tracestate(headers.get(TRACESTATE))
    if state is not None:
        kept[TRACESTATE] = state
    return kept
