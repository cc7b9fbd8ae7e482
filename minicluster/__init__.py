"""minicluster: a batch system that lives inside Kubernetes.

`Client` talks to a running instance's broker (docs/protocol.md §3).
"""
from minicluster.client import Client, ClientError

__all__ = ["Client", "ClientError"]
