"""``MpiCommSession`` (stand-in): the Triton ``llmapi`` model passes
``_mpi_session=MpiCommSession(comm=COMM_WORLD, n_workers=COMM_WORLD.Get_size())`` to ``LLM`` on rank 0 of a
multi-rank world (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @b35ac1b6). The stand-in only
records what it was given."""

from __future__ import annotations

from typing import Any


class MpiCommSession:
    """An MPI session over an existing communicator (records ``comm`` and ``n_workers``)."""

    def __init__(self, comm: Any = None, n_workers: int = 1) -> None:
        self.comm = comm
        self.n_workers = n_workers

    def shutdown(self) -> None:
        pass
