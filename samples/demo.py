"""The orleanspy demo (its code is ``orleanspy/demo.py``, so that the installed
``orleanspy demo`` command can run it too).

Run: ``make demo`` (or ``python -m samples.demo``, or ``orleanspy demo``).
"""

from __future__ import annotations

import contextlib

from orleanspy import run
from orleanspy.demo import main

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run(main())
