"""Cluster membership: the table contract, its backends, and the membership service.

``table`` holds the types and the ``MembershipTable`` protocol; ``memory`` and
``redis`` are the backends (import the one you use, so Redis loads only when
picked); ``oracle`` is the service a silo runs (join, I-am-alive, snapshots,
graceful stop) and ``health`` its failure detector (probes, suspicion, votes).
"""
