"""MPI rank and size as ``tensorrt_llm._utils`` reports them (the Triton ``llmapi`` model imports
``global_mpi_rank`` and ``global_mpi_size`` from here: triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
@b35ac1b6). Upstream asks mpi4py's COMM_WORLD; the stand-in reads what ``mpirun`` (Open MPI) puts in each
rank's environment, so a test can pose as a rank without MPI."""

from __future__ import annotations

import os


def global_mpi_rank() -> int:
    """This process's rank in the MPI world (0 outside ``mpirun``)."""
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def global_mpi_size() -> int:
    """The number of ranks in the MPI world (1 outside ``mpirun``)."""
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
