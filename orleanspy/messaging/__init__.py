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
