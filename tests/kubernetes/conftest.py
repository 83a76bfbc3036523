"""Every module here gets its own test cluster (tests/kubernetes/cluster.py)."""

from tests.kubernetes.cluster import client, cluster

__all__ = ["client", "cluster"]
