"""The log side of observability: the silo-name filter and JSON records."""

from __future__ import annotations

import asyncio
import json
import logging

from orleanspy import observability as obs
from orleanspy.observability import (
    JsonFormatter,
    SiloNameFilter,
    reset_current_silo,
    set_current_silo,
)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(silo)s %(message)s"))
        self.addFilter(SiloNameFilter("silo-1"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_silo_name_filter_stamps_records() -> None:
    logger = logging.getLogger("orleanspy.test.silo_filter")
    capture = _Capture()
    logger.addHandler(capture)
    try:
        logger.warning("plain")
        logger.warning("given", extra={"silo": "explicit"})
        token = set_current_silo("silo-2")
        try:
            logger.warning("context")
        finally:
            reset_current_silo(token)
        logger.warning("again")
    finally:
        logger.removeHandler(capture)
    assert capture.lines == ["silo-1 plain", "explicit given", "silo-2 context", "silo-1 again"]


async def test_current_silo_is_inherited_by_tasks_started_in_its_context() -> None:
    seen: dict[str, str | None] = {}

    async def silo(name: str) -> None:
        set_current_silo(name)
        await asyncio.create_task(child(name))

    async def child(name: str) -> None:
        await asyncio.sleep(0)
        seen[name] = obs.current_silo()

    await asyncio.gather(silo("a"), silo("b"))
    assert seen == {"a": "a", "b": "b"}
    assert obs.current_silo() is None


def test_json_formatter_writes_one_object_per_record_with_the_silo() -> None:
    record = logging.LogRecord(
        "orleanspy.x", logging.ERROR, __file__, 1, "bad %s", ("thing",), None
    )
    SiloNameFilter("silo-7").filter(record)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "bad thing"
    assert doc["level"] == "ERROR"
    assert doc["silo"] == "silo-7"
    assert doc["logger"] == "orleanspy.x"
    assert doc["ts"].endswith("+00:00")


def test_json_formatter_puts_message_fields_in_keys() -> None:
    record = logging.LogRecord(
        "orleanspy.reminders._delivery", logging.WARNING, __file__, 1,
        "reminder tick failed in grain name=%s key=%s slot=%s error=%r",
        ("s1", "Stats/s:a|tick", "2026-01-01", ValueError("a b=c")), None,
    )  # fmt: skip
    SiloNameFilter("s1").filter(record)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["grain"] == "Stats/s:a" and doc["reminder"] == "tick"
    assert doc["silo"] == "s1" and doc["name"] == "s1"
    assert doc["msg"].startswith("reminder tick failed in grain name=s1")
    # A repr with spaces and '=' inside stays whole.
    assert doc["error"] == "ValueError('a b=c')" and "b" not in doc
    peer = logging.LogRecord("orleanspy.x", logging.INFO, __file__, 1, "probe failed peer=%s",
                             ("10.0.0.2:1@5",), None)  # fmt: skip
    assert json.loads(JsonFormatter().format(peer))["peer"] == "10.0.0.2:1@5"
    try:
        raise KeyError("gone")
    except KeyError:
        import sys

        failed = logging.LogRecord("orleanspy.x", logging.ERROR, __file__, 1, "oops msg=%s",
                                   ("x",), sys.exc_info())  # fmt: skip
    doc = json.loads(JsonFormatter().format(failed))
    assert doc["error"] == "KeyError: 'gone'" and "Traceback" in doc["traceback"]
    assert doc["msg"] == "oops msg=x" and doc["field_msg"] == "x"
    # Text logs are unchanged: the same record through the text format.
    text = logging.Formatter("%(levelname)s %(silo)s %(name)s %(message)s").format(record)
    assert text.startswith("WARNING s1 orleanspy.reminders._delivery reminder tick failed")
