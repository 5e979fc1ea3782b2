"""Cluster membership: the table contract, its backends, and the membership service.

``model`` holds the rows, suspicion votes, versions and their storage encoding;
``table`` the ``MembershipTable`` protocol alone; ``memory``, ``redis`` and
``postgres`` are the backends (import the one you use, so its dependency loads
only when picked); ``service`` is the ``MembershipService`` a silo runs (join,
I-am-alive, snapshots, graceful stop) and ``health`` its failure detector
(probes, suspicion, votes). ``credentials`` and ``agreement`` are what a silo
checks against the live members before it joins: the cluster's credentials,
and the ring every silo must build.
"""
