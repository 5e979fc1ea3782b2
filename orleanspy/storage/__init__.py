"""Grain state storage: the ``GrainStorage`` contract (``contract``) and its backends.

One module per backend (``memory``, ``redis``, ``postgres``). This package imports
none of them, so an optional dependency (asyncpg) loads only when someone picks
that backend; ``factory.grain_storage_from_url`` picks one by URL scheme.
"""
