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
    assert doc["message"] == "bad thing"
    assert doc["level"] == "ERROR"
    assert doc["silo"] == "silo-7"
    assert doc["logger"] == "orleanspy.x"
    assert doc["time"].endswith("+00:00")
