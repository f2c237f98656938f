"""The Triton glue both Python ``tensorrt_llm`` models share: the CPU reference model (``model.py`` beside this
file) and the PyTorch-backend model (``tensorrt_llm_pytorch/1/model.py``, whose version folder gets a copy of this
file when the repository is rendered: ``tensorrtllm_backend/templates.py`` ``SHARED_MODEL_CODE``), as they share
``parsing.py`` and ``lora.py``. It holds no state: a model loaded twice (under two names, as the tests and the
benchmark's stand-ins do) gets its own copy.

What it does with Triton (upstream sources, read, not copied):

* the names of ``triton_python_backend_utils`` (``pb_utils``) it uses: ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``
  (triton-inference-server/python_backend ``src/resources/triton_python_backend_utils.py``, r24.10: Triton 2.51,
  the one this project runs), ``Tensor`` (``name()``, ``as_numpy()``), ``InferenceResponse``, ``TritonError``
  (with its error codes), ``Logger``, and ``InferenceRequest.inputs`` and ``requested_output_names`` (bound by
  the stub into that module, ``src/pb_stub.cc``);
* every request error is ``TRITONSERVER_ERROR_INTERNAL``, as the C++ backend sends it (NVIDIA/TensorRT-LLM
  ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc`` ``fillTritonResponse`` /
  ``sendEnqueueResponse``, @c8c6df08), and a response's tensors are the backend's: ``output_ids`` [1, 1, n],
  ``sequence_length`` [[n]], and with log-probs ``cum_log_probs`` [[c]] and ``output_log_probs`` [1, 1, n];
* the client's list of outputs must hold ``output_ids`` and ``sequence_length`` (``fillTritonResponse``'s text,
  sent as the first response of such a request);
* model parameters are the config's ``parameters { key: "..." value: { string_value: "..." } }``; a ``${...}``
  placeholder the renderer left unfilled (``fill_template.py`` fills them with ``string.Template``, which leaves
  unknown ones as they are) counts as absent.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton (they set pb_utils to tests/fake_pb_utils.py)
    pb_utils = None

#: The outputs a client's list must name (``fillTritonResponse``).
REQUIRED_OUTPUTS = ("output_ids", "sequence_length")


# ------------------------------------------------------------------------------------------------
# Requests and parameters
# ------------------------------------------------------------------------------------------------


def input_arrays(request) -> Callable[[str], Optional[np.ndarray]]:
    """A getter of the request's input tensors by name: the tensor as a numpy array, or None when the request has
    none by that name.

    The request's inputs are read once (``InferenceRequest.inputs()``). ``pb_utils.get_input_tensor_by_name``
    reads them again at each call and compares their names one by one (python_backend r24.10
    ``src/resources/triton_python_backend_utils.py``): each ``inputs()`` makes a Python object for every input the
    request has, and the models ask for some 30 names, most of them absent, in the stub's main thread, where
    Triton's batches of new requests wait on one another (benchmarks/results/2026-11-28-h200-i32-si, call 9)."""
    tensors = {tensor.name(): tensor for tensor in request.inputs()}

    def get(name: str) -> Optional[np.ndarray]:
        tensor = tensors.get(name)
        return None if tensor is None else tensor.as_numpy()

    return get


def requested_outputs(request) -> Optional[set]:
    """The output names the client asked for (Triton lists all of them when the client named none)."""
    getter = getattr(request, "requested_output_names", None)
    if getter is None:
        return None
    try:
        names = getter()
    except Exception:  # noqa: BLE001
        return None
    return set(names) if names else None


def missing_output_error(request) -> Optional[str]:
    """The C++ backend's error text when the client's list of outputs lacks one of :data:`REQUIRED_OUTPUTS`, else
    None."""
    requested = requested_outputs(request)
    for name in REQUIRED_OUTPUTS:
        if requested is not None and name not in requested:
            return (f"Error encountered while populating response: {name} tensor must be present in list of output "
                    "tensors")
    return None


def param(params: dict, key: str, default, conv: Callable):
    """The model parameter ``key`` converted by ``conv`` (``bool``: true/false, 1/0, yes/no, y/n, t/f, any case);
    ``default`` when it is absent, empty or an unfilled ``${...}`` placeholder.

    Raises:
        ValueError: the value does not convert, naming the parameter and the value.
    """
    raw = params.get(key, {}).get("string_value", "") if isinstance(params.get(key), dict) else ""
    raw = raw.strip()
    if raw == "" or raw.startswith("${"):
        return default
    if conv is bool:
        low = raw.lower()
        if low in ("true", "1", "yes", "y", "t"):
            return True
        if low in ("false", "0", "no", "n", "f"):
            return False
        raise ValueError(f"parameter {key} must be true or false, got {raw!r}")
    try:
        return conv(raw)
    except ValueError:
        raise ValueError(f"parameter {key} must be {conv.__name__}, got {raw!r}") from None


# ------------------------------------------------------------------------------------------------
# Responses
# ------------------------------------------------------------------------------------------------


def triton_error(message: str):
    """A ``TritonError`` with the code INTERNAL (the C++ backend reports every request error so), or without a
    code where this pb_utils takes none."""
    code = getattr(pb_utils.TritonError, "INTERNAL", None)
    if code is not None:
        try:
            return pb_utils.TritonError(message, code)
        except TypeError:
            pass
    return pb_utils.TritonError(message)


def error_response(message: str):
    """A response carrying only the error ``message``."""
    return pb_utils.InferenceResponse(output_tensors=[], error=triton_error(message))


def token_response(tokens: List[int], log_probs: Optional[List[float]], cum_log_prob: Optional[float],
                   extra: Optional[list] = None):
    """A response with output_ids [1, 1, n] and sequence_length [[n]] (n may be 0), plus cum_log_probs [[c]] (0.0
    when None) and output_log_probs [1, 1, len(log_probs)] when ``log_probs`` is not None, and the tensors ``extra``
    (the PyTorch-backend model's prompt_tokens / image_tokens of an image request) when given."""
    outputs = [
        pb_utils.Tensor("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, 1, len(tokens))),
        pb_utils.Tensor("sequence_length", np.asarray([[len(tokens)]], dtype=np.int32)),
    ]
    if log_probs is not None:
        cum = 0.0 if cum_log_prob is None else cum_log_prob
        outputs.append(pb_utils.Tensor("cum_log_probs", np.asarray([[cum]], dtype=np.float32)))
        outputs.append(pb_utils.Tensor("output_log_probs",
                                       np.asarray(log_probs, dtype=np.float32).reshape(1, 1, len(log_probs))))
    if extra:
        outputs.extend(extra)
    return pb_utils.InferenceResponse(output_tensors=outputs)


def send_final(sender, response) -> None:
    """Send ``response`` on a decoupled sender with the FINAL flag."""
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def send_empty_final(sender) -> None:
    """A real response without output tensors, FINAL: what ``sendEnqueueResponse`` sends to a stop request. Through
    HTTP generate_stream it is one event with only id/model_name/model_version; a flags-only
    ``sender.send(flags=FINAL)`` would give no event at all."""
    send_final(sender, pb_utils.InferenceResponse(output_tensors=[]))


# ------------------------------------------------------------------------------------------------
# Logging
# ------------------------------------------------------------------------------------------------


def log(tag: str, level: str, message: str) -> None:
    """Log ``[tag] message`` through Triton's ``pb_utils.Logger`` at ``level`` (info, warn or error; another word
    logs as info), or print ``[tag] level: message`` where there is no Logger (outside Triton) or it fails."""
    logger = getattr(pb_utils, "Logger", None) if pb_utils is not None else None
    if logger is None:
        print(f"[{tag}] {level}: {message}", flush=True)
        return
    try:
        {"info": logger.log_info, "warn": logger.log_warn, "error": logger.log_error}.get(level, logger.log_info)(
            f"[{tag}] {message}")
    except Exception:  # noqa: BLE001
        print(f"[{tag}] {level}: {message}", flush=True)
