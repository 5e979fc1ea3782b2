"""Benchmarks: each module prints its figures beside a baseline from the same run."""

import os

# grpc's C core logs every GOAWAY at INFO when servers stop; keep the reports readable.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# orleanspy's gRPC defaults (``GRPC_EXPERIMENTS``) apply only when it is imported
# before grpc; some benchmarks import grpc first for their raw echoes, which
# must run on the same gRPC stack as the silos they are compared with.
import orleanspy.messaging  # noqa: F401
