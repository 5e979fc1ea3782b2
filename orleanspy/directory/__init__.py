"""The grain directory: the contract (``table``) and one module per backend.

``memory`` (one process), ``redis`` and ``postgres`` are the backends; ``cached``
is an LRU in front of any of them. This package imports none of them, so a
backend's dependency (redis, asyncpg) loads only when that backend is chosen;
``orleanspy.tables`` picks one by URL scheme.
"""
