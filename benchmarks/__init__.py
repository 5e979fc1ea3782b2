"""Benchmarks: each module prints its figures beside a baseline from the same run."""

import os

# grpc's C core logs every GOAWAY at INFO when servers stop; keep the reports readable.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
