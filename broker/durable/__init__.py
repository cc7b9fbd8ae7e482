"""The broker's durable record (docs/architecture.md#where-state-lives): the sqlite journal and what it holds.

`journal.py` writes (one thread, group commit), `schema.py` is every table's DDL, `store.py` every statement on
the job tables, `statelock.py` the one-broker-per-state-dir lock. The bottom of the broker: nothing here imports
the rest of it (docs/architecture.md#the-broker-in-packages).
"""
