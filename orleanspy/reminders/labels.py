"""Reminder labels and label selectors.

A reminder may carry ``labels``: a small map of text keys to text values
(``{"tenant": "acme", "env": "prod"}``). Operators select reminders by them:
list, count, pause, resume, delete and export every reminder whose labels hold
each pair of a *selector* (``{"tenant": "acme"}``; ``--label tenant=acme`` in
the CLI). Tables answer a selector from an index (``stores.IndexedReminderTable``),
never by reading every row.

Bounds (``ReminderError`` beyond them): at most ``MAX_LABELS`` labels; a key
is 1..``MAX_LABEL_KEY`` characters of letters, digits and ``. _ / -``,
starting with a letter or digit; a value is 0..``MAX_LABEL_VALUE``
characters without control characters. The index stores each pair as a
*term* ``l:<key>=<value>`` (``label_term``); a calendar's users are indexed
the same way (``c:<name>``, ``calendar_term``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

from orleanspy.errors import ReminderError

__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_KEY",
    "MAX_LABEL_VALUE",
    "calendar_term",
    "check_labels",
    "label_term",
    "matches",
    "parse_selector",
    "selector_terms",
]

MAX_LABELS: Final = 16
MAX_LABEL_KEY: Final = 63
MAX_LABEL_VALUE: Final = 128

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key) or len(key) > MAX_LABEL_KEY:
        raise ReminderError(
            f"not a label key: {key!r}; use 1..{MAX_LABEL_KEY} letters, digits and '._/-', "
            "starting with a letter or digit"
        )
    return key


def _check_value(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ReminderError(f"label {key!r} must have a string value, got {type(value).__name__}")
    if len(value) > MAX_LABEL_VALUE or _CONTROL.search(value):
        raise ReminderError(
            f"label {key!r} has a value of {len(value)} characters; a value has at most "
            f"{MAX_LABEL_VALUE} characters and no control characters"
        )
    return value


def check_labels(labels: object) -> dict[str, str] | None:
    """A reminder's labels as stored (keys sorted; ``None`` for none, also for
    an empty map); ``ReminderError`` naming what is wrong."""
    if labels is None:
        return None
    if not isinstance(labels, Mapping):
        raise ReminderError(
            f"labels must be a mapping of strings to strings, got {type(labels).__name__}"
        )
    if len(labels) > MAX_LABELS:
        raise ReminderError(f"a reminder has at most {MAX_LABELS} labels, got {len(labels)}")
    out = {_check_key(k): _check_value(k, v) for k, v in labels.items()}
    return {k: out[k] for k in sorted(out)} or None


def parse_selector(selector: object) -> dict[str, str]:
    """A label selector as a map: a ``Mapping`` (checked), or text
    ``"key=value[,key=value...]"``, or a list of ``"key=value"`` texts (what
    ``--label`` gives). ``ReminderError`` for an item without ``=``, a bad key
    or value, a key given twice with two values, or an empty selector."""
    pairs: list[tuple[object, object]] = []
    if isinstance(selector, Mapping):
        pairs = list(selector.items())
    else:
        items: Iterable[object]
        if isinstance(selector, str):
            items = [part for part in selector.split(",") if part.strip()]
        elif isinstance(selector, Iterable):
            items = list(selector)
        else:
            raise ReminderError(
                f"a label selector is a mapping or 'key=value' text, got {type(selector).__name__}"
            )
        for item in items:
            if not isinstance(item, str) or "=" not in item:
                raise ReminderError(
                    f"not a label selector: {item!r}; write key=value (e.g. tenant=acme)"
                )
            key, _, value = item.partition("=")
            pairs.append((key.strip(), value))
    out: dict[str, str] = {}
    for k, v in pairs:
        key = _check_key(k)
        value = _check_value(key, v)
        if out.get(key, value) != value:
            raise ReminderError(f"label {key!r} is selected with two values; a row has one")
        out[key] = value
    if not out:
        raise ReminderError("an empty label selector selects nothing: give key=value")
    return out


def label_term(key: str, value: str) -> str:
    """The index term of one label pair."""
    return f"l:{key}={value}"


def calendar_term(name: str) -> str:
    """The index term of the rows that use calendar ``name``."""
    return f"c:{name}"


def selector_terms(selector: Mapping[str, str]) -> list[str]:
    """The index terms a row must all carry to match ``selector`` (sorted)."""
    return sorted(label_term(k, v) for k, v in selector.items())


def matches(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    """Whether a row with ``labels`` matches ``selector`` (every pair present)."""
    if not labels:
        return False
    return all(labels.get(k) == v for k, v in selector.items())
