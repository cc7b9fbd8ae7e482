"""The MiniCluster Kubernetes operator (kopf).

Entry point: `run(namespace=None)` — see docs/operator.md.
"""
from minicluster.operator.runner import operate, run

__all__ = ["operate", "run"]
