"""PMI-1 (Flux RFC 13) and PMIx servers that workers offer to the MPI tasks they run, and the agent's glue to them
(jobs.py, pmix_jobs.py)."""

from worker.pmi.barrier import PMIExchange
from worker.pmi.engine import process_mapping
from worker.pmi.mpienv import mpi_env_defaults
from worker.pmi.server import PMIJobServer

__all__ = ["PMIExchange", "PMIJobServer", "mpi_env_defaults", "process_mapping"]
