"""The W3C trace context a call carries: parsed with limits, and whatever does not
parse is dropped, never an error."""

from __future__ import annotations

import pytest

from orleanspy.trace_context import (
    MAX_TRACESTATE,
    TRACEPARENT,
    TRACESTATE,
    TraceParent,
    clean_tracestate,
    parse_traceparent,
    trace_headers,
)

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_parses_and_prints_back() -> None:
    parent = parse_traceparent(GOOD)
    assert parent == TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    assert parent.header() == GOOD


def test_a_later_version_is_read_by_its_first_fields() -> None:
    later = "cc" + GOOD[2:] + "-what-a-later-version-adds"
    assert parse_traceparent(later) == parse_traceparent(GOOD)


@pytest.mark.parametrize(
    "text",
    [
        None,
        42,
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "",
        GOOD[:-1],
        GOOD + "-x",  # version 00 has nothing after the flags
        GOOD.upper(),  # hex is lower case
        "ff" + GOOD[2:],  # version ff is invalid
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "cc" + GOOD[2:] + "x" + "y" * 10,  # a later version, but no dash after the flags
        "cc" + GOOD[2:] + "-" + "x" * 10_000,  # oversized
        "\x00" * 55,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u0661",  # non-ASCII digit
    ],
)
def test_anything_else_is_no_traceparent(text: object) -> None:
    assert parse_traceparent(text) is None


def test_tracestate_is_kept_within_the_limits_and_dropped_whole_otherwise() -> None:
    assert clean_tracestate("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7") == (
        "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )
    assert clean_tracestate("tenant@vendor=x") == "tenant@vendor=x"
    too_many = ",".join(f"k{i}=v" for i in range(33))
    for bad in (
        None, "", "noequals", "UPPER=x", "a=b,a=c", "k=v=w", "k=a,b", too_many,
        "k=" + "v" * MAX_TRACESTATE, "k=\u00e9", 7,
    ):  # fmt: skip
        assert clean_tracestate(bad) is None, bad


def test_trace_headers_keeps_only_a_checked_trace_context() -> None:
    assert trace_headers(
        {TRACEPARENT: GOOD, TRACESTATE: "a=1", "chain": "x", "principal": "p"}
    ) == {
        TRACEPARENT: GOOD,
        TRACESTATE: "a=1",
    }
    assert trace_headers({TRACEPARENT: GOOD, TRACESTATE: "A=1"}) == {TRACEPARENT: GOOD}
    assert trace_headers({TRACEPARENT: "garbage", TRACESTATE: "a=1"}) == {}
    assert trace_headers({TRACESTATE: "a=1"}) == {}
