"""Messages and the transports that carry them between silos and clients.

Also what a silo and a client share as callers: ``pending`` (calls waiting for
their response, with the response timeout) and ``remote_errors`` (exceptions
across the wire).
"""

import os

# gRPC's C core logs to stderr on its own and reads this once, when grpc is
# first imported (by ``messaging.grpc``, after this package): quiet unless the
# environment asks for it. Errors that matter reach orleanspy's own log.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

#: What ``GRPC_EXPERIMENTS`` is set to unless the environment sets it (to any
#: value, an empty one included): gRPC's classic TCP client and listener instead
#: of its EventEngine ones. Those hand each read and write between more threads;
#: on a 2-core host a 1-caller call between two silos took 485 us on them and
#: 297 us on the classic ones, and gateway calls with 64 callers went from
#: 55,540/s to 72,949/s. Read when grpc is first imported, like the verbosity:
#: import orleanspy before grpc (or set the variable) for it to apply.
GRPC_EXPERIMENTS_DEFAULT = "-event_engine_client,-event_engine_listener"
os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS_DEFAULT)
