"""What a tick's delivery came to (``Done``), shared by delivery and ``concurrent``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orleanspy.reminders.model import TickStatus

__all__ = ["Done"]


@dataclass(slots=True)
class Done:
    """A delivery that reached the grain: when it was delivered (``at``) and
    returned (``end``), and how it went: ``error`` is ``None`` when the grain
    returned, else what ``receive_reminder`` raised; ``cut``: it was cancelled
    because its next slot fell due (``CANCEL_OTHER``), which is no failure."""

    at: datetime
    end: datetime
    status: TickStatus
    error: BaseException | None = None
    cut: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None
