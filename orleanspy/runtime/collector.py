"""How a silo sets up Python's garbage collector once it has started.

Two things, both process-wide. Every silo does them by default, an embedded one
(``Silo.local()`` inside a web application) too; ``SiloOptions(tune_gc=False)``
skips them:

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

When the last silo that tuned the collector stops, the collector is put back
as it was before the first one started: the threshold (unless someone changed
it meanwhile) and, if nothing was frozen before, ``gc.unfreeze()``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Final

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

#: The youngest generation's threshold a silo sets (if it was lower).
YOUNG_THRESHOLD: Final = 10_000

# Silos that tuned the collector and have not stopped yet, and what the
# collector was before the first of them (threshold, whether nothing was frozen).
_holders = 0
_before: tuple[tuple[int, int, int], bool] = ((0, 0, 0), False)


def tune_collector() -> Callable[[], None]:
    """Freeze what exists and raise the young threshold (module docstring);
    returns the call that releases this silo's hold, restoring the collector
    when it was the last."""
    global _holders, _before
    if _holders == 0:
        _before = (gc.get_threshold(), gc.get_freeze_count() == 0)
    _holders += 1
    gc.freeze()
    young, middle, old = gc.get_threshold()
    tuned = young
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
        tuned = YOUNG_THRESHOLD
    released = False

    def restore() -> None:
        global _holders
        nonlocal released
        if released:
            return
        released = True
        _holders -= 1
        if _holders:
            return
        threshold, nothing_was_frozen = _before
        if gc.get_threshold()[0] == tuned:  # nobody retuned it meanwhile
            gc.set_threshold(*threshold)
        if nothing_was_frozen:
            gc.unfreeze()

    return restore
