"""Messages and the transports that carry them between silos and clients.

Also what a silo and a client share as callers: ``pending`` (calls waiting for
their response, with the response timeout) and ``remote_errors`` (exceptions
across the wire).
"""
