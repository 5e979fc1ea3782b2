"""How a silo sets up Python's garbage collector once it has started.

Two things, both process-wide, both skipped with ``SiloOptions(tune_gc=False)``:

- ``gc.freeze()``: everything start-up allocated (modules, options, the reminder
  window, grain classes) lives as long as the silo; frozen, a full collection no
  longer walks it.
- The youngest generation's threshold is raised to at least
  ``YOUNG_THRESHOLD`` allocations (never lowered). Under a tick stream many
  objects live a few tens of milliseconds (a schedule update waiting for its
  batch, a fire record waiting for the history write). With the default 700
  they outlived two young collections and reached the oldest generation, which
  then filled fast enough for a full collection every few seconds, each walking
  every activation (35-110 ms with 18,000 of them). With 10,000 they die young:
  a young collection costs what survives it, not the threshold, so this costs
  next to nothing else.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

#: The youngest generation's threshold a silo sets (if it was lower).
YOUNG_THRESHOLD: Final = 10_000


def tune_collector() -> None:
    """Freeze what exists and raise the young threshold (module docstring)."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
