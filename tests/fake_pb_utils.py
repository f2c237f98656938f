"""A stand-in for Triton's ``triton_python_backend_utils`` (pb_utils), for unit tests of Python models outside
Triton: only the names the models use, and senders that record what was sent, with which flags and from which
thread. Tests that can run in a real Triton do so; this is for what a test must observe inside the model
(threads, MPI ranks, a failing LLM) or must provoke quickly."""

from __future__ import annotations

import threading
import types
from typing import Any, Optional

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonError:
    INTERNAL = "INTERNAL"
    CANCELLED = "CANCELLED"

    def __init__(self, message: str, code: Optional[str] = None) -> None:
        self._message = message
        self.code = code

    def message(self) -> str:
        return self._message


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=None, error: Optional[TritonError] = None) -> None:
        self.output_tensors = list(output_tensors or [])
        self.error = error

    def tensor(self, name: str) -> Optional[np.ndarray]:
        for t in self.output_tensors:
            if t.name() == name:
                return t.as_numpy()
        return None


class Logger:
    lines: list = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(("info", message))

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.lines.append(("warn", message))

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.lines.append(("error", message))


class MetricFamily:
    """python_backend's custom metrics (``pb_utils.MetricFamily(name, description, kind)``, ``.Metric(labels)`` with
    ``set`` / ``increment`` / ``value``; a counter only increments). Every family made is kept in :attr:`made`."""

    COUNTER = "COUNTER"
    GAUGE = "GAUGE"
    made: dict = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list = []
        MetricFamily.made[name] = self

    def Metric(self, labels: Optional[dict] = None) -> "_Metric":  # noqa: N802 - upstream's name
        metric = _Metric(self.kind, dict(labels or {}))
        self.metrics.append(metric)
        return metric


class _Metric:
    def __init__(self, kind: str, labels: dict) -> None:
        self.kind, self.labels, self._value = kind, labels, 0.0

    def set(self, value: float) -> None:
        if self.kind == MetricFamily.COUNTER:
            raise RuntimeError("a counter cannot be set")
        self._value = float(value)

    def increment(self, value: float) -> None:
        if self.kind == MetricFamily.COUNTER and value < 0:
            raise RuntimeError("a counter only increments")
        self._value += float(value)

    def value(self) -> float:
        return self._value


def get_input_tensor_by_name(request, name: str) -> Optional[Tensor]:
    """As upstream's (python_backend ``triton_python_backend_utils.py``): ``inputs()`` again, then the names in
    turn."""
    for tensor in request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def using_decoupled_model_transaction_policy(config: dict) -> bool:
    return bool(config.get("model_transaction_policy", {}).get("decoupled"))


class FakeSender:
    """Records (response, flags, thread name) for every send and the thread of every is_cancelled()."""

    def __init__(self, gate: Optional[threading.Event] = None) -> None:
        self.gate = gate  # when given, the first send waits for it (a round trip to Triton that takes long)
        self.sent: list = []
        self.cancelled = False
        self.cancel_threads: set = set()
        self.final = threading.Event()
        self.first = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        if self.final.is_set():
            raise RuntimeError("send after the final response")
        if self.gate is not None and not self.sent:
            assert self.gate.wait(60), "the test never released the first send"
        self.sent.append((response, flags, threading.current_thread().name))
        self.first.set()
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.final.set()

    def is_cancelled(self) -> bool:
        self.cancel_threads.add(threading.current_thread().name)
        return self.cancelled

    # views
    def tokens(self) -> list:
        return [int(t) for r, _, _ in self.sent if r is not None and r.tensor("output_ids") is not None
                for t in r.tensor("output_ids").reshape(-1)]

    def errors(self) -> list:
        return [r.error.message() for r, _, _ in self.sent if r is not None and r.error is not None]


class FakeRequest:
    """A request whose tensors come as Triton delivers them: each with a leading batch dimension of 1."""

    def __init__(self, request_id: str = "", requested: Optional[list] = None, **tensors: Any) -> None:
        self.tensors = {}
        for name, value in tensors.items():
            if value is None:
                continue
            arr = np.asarray(value, dtype=object) if isinstance(value, (str, bytes)) or (
                isinstance(value, list) and value and isinstance(value[0], (str, bytes))) else np.asarray(value)
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
            elif arr.dtype.kind in "iu" and name not in ("seed", "lora_task_id"):
                arr = arr.astype(np.int32)
            elif name in ("seed", "lora_task_id"):
                arr = arr.astype(np.uint64)
            self.tensors[name] = arr[None, ...] if arr.ndim else arr.reshape(1, 1)
        self._id = request_id
        self._requested = requested
        self.inputs_calls = 0
        self.sender = FakeSender()

    def inputs(self) -> list:
        """A new list of new :class:`Tensor` objects at each call, as the stub's ``InferenceRequest.inputs()``."""
        self.inputs_calls += 1
        return [Tensor(name, value) for name, value in self.tensors.items()]

    def get_response_sender(self) -> FakeSender:
        return self.sender

    def request_id(self) -> str:
        return self._id

    def requested_output_names(self) -> list:
        return list(self._requested or [])


def module() -> types.ModuleType:
    """This module as the ``pb_utils`` a model sees."""
    import sys  # noqa: PLC0415

    return sys.modules[__name__]
