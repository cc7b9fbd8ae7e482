"""The client API of rank 0 (protocol.md §3): the socket, and every operation a client request reaches.

`clientapi.py` listens and dispatches; `ops.py`, `flowops.py` and `shareops.py` are the operations, registered by
name; `access.py` says who may read what; `brokerview.py` is all of the broker the operations see. Above the core
and the workflow package, which never import it (docs/architecture.md#the-broker-in-packages).
"""
