"""``python -m orleanspy``: the ``orleanspy`` command (``orleanspy.cli``)."""

from __future__ import annotations

import sys

from orleanspy.cli import main

if __name__ == "__main__":
    sys.exit(main())
