"""Sharing a MiniCluster on rank 0: queues, banks, fair share, preemption and accounting (docs/scheduling.md)."""
