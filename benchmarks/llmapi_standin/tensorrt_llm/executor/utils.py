"""``RequestError``: the per-request error of the LLM API (stand-in).

Upstream (NVIDIA/TensorRT-LLM ``tensorrt_llm/executor/base_worker.py`` @7b437aaa ``_enqueue_request``) wraps
whatever building or enqueueing the executor request raised in ``RequestError(str(e))``; the executor's
``_handle_background_error`` turns a string error of one request into a ``RequestError`` too, which the
awaiting ``async for`` over the request's result raises (``executor/executor.py``).
"""


class RequestError(RuntimeError):
    """One request failed; the others go on."""
