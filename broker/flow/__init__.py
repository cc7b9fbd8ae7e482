"""Workflows in the broker (protocol.md §3.9, docs/workflows.md): dependencies, attempts and retries, holds, requeues.

`depgraph.py` and `retry.py` decide, pure; `state.py` is one job's workflow state; `workflow.py` and `attempts.py`
turn the decisions into events and queue changes; `recovery.py` rebuilds it all after a restart. Above the core,
below the client API (docs/architecture.md#the-broker-in-packages).
"""
