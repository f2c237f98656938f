"""LoRA for the CPU reference ``tensorrt_llm`` model: TensorRT-LLM's request tensors and executor semantics,
the adapters applied with ``peft`` on the transformers model.

What a client can observe, as TensorRT-LLM 1.1 does it (NVIDIA/TensorRT-LLM; read, not copied):

* **Tensors** (``triton_backend/inflight_batcher_llm/src/utils.cc`` ``getLoraConfigFromTensors``):
  ``lora_weights`` and ``lora_config`` are read only when ``lora_task_id`` is present (without it they are
  ignored). ``lora_config`` rows are [module id, layer, rank]; a ``lora_weights`` row is the module's "in"
  matrix [rank, in] flattened, then its "out" matrix [out, rank] flattened, zero-padded to the row width.
* **Constructor checks** (``cpp/tensorrt_llm/executor/loraConfig.cpp``): weights without config fail
  ("Request for LoRA inference with lora weights must also have lora config"), and their first dimensions
  must match.
* **An engine without the LoRA plugin** ignores the three (``NoOpPeftCacheManager::addRequestPeft``,
  ``batch_manager/peftCacheManager.cpp``): here, a model whose ``lora_plugin`` parameter is empty.
* **Executor checks** (``cpp/tensorrt_llm/runtime/loraUtils.cpp`` ``loraValidateRequestTensors``, called
  by ``PeftCacheManager::addRequestPeft`` in ``fetchNewRequests``; reported as "Encountered an error when
  fetching new request: [TensorRT-LLM][ERROR] Assertion failed: ..."): config without weights, row counts,
  layer in [0, layers), rank > 0, module enabled ("lora module <name> not enabled for this model"), enough
  values per row, rank at most max_lora_rank ("Invalid low_rank (r). low_rank must be smaller than
  mMaxLowRank (max)").
* **The cache** (``peftCacheManager.cpp`` ``addRequestPeft``, ``runtime/loraCache.cpp``): a request with
  weights stores its task (an already cached task is only marked used); a request with only a task id
  needs it cached, else it fails with "LoRA task <id> not found in cache. Please send LoRA weights with
  request" (a ``LoraExpectedException``: the executor sends its text without the "Encountered ..." prefix,
  ``executorImpl.cpp`` ``fetchNewRequests``). The cache is bounded (``lora_cache_host_memory_bytes``; here
  the values held, float32): to store a task, the least recently used tasks that no running request uses
  are evicted; when that does not free enough, "PEFT Cache is full. Could not store taskId=<id>".
* Requests with different adapters, and without one, run in the same in-flight batch: here the scheduler
  steps its requests in turn, and each step runs with its request's adapter active (:meth:`PeftApplier.use`).

Application: each cached task is a peft LoRA adapter ``task_<id>_<n>`` injected into the model
(``peft.inject_adapter_in_model``) with ``r = lora_alpha =`` the task's largest rank (scaling 1: the
adapter's own scale is folded into its "out" weights), smaller ranks zero-padded; evicting a task deletes
it from the model.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

#: LoraManager.LORA_MODULE_IDS (tensorrt_llm/lora_manager.py) for the modules this model serves, and their
#: Hugging Face names (lora_helper.py get_default_trtllm_modules_to_hf_modules).
MODULE_IDS = {"attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5, "mlp_4h_to_h": 6,
              "mlp_gate": 7}
ALL_MODULE_NAMES = {0: "attn_qkv", 1: "attn_q", 2: "attn_k", 3: "attn_v", 4: "attn_dense", 5: "mlp_h_to_4h",
                    6: "mlp_4h_to_h", 7: "mlp_gate", 8: "cross_attn_qkv", 9: "cross_attn_q", 10: "cross_attn_k",
                    11: "cross_attn_v", 12: "cross_attn_dense", 13: "moe_h_to_4h", 14: "moe_4h_to_h", 15: "moe_gate",
                    16: "moe_router", 17: "mlp_router", 18: "mlp_gate_up"}
HF_NAMES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_dense": "o_proj",
            "mlp_h_to_4h": "gate_proj", "mlp_gate": "up_proj", "mlp_4h_to_h": "down_proj"}
#: loraUtils.cpp accepts 3 (pre-DoRA) or 4 columns; the model config declares 3.
CONFIG_COLUMNS = (3, 4)


#: Where a LoRA error arises, which decides its text: "backend" (the backend's request parsing: sent as it
#: is), "executor" (after "Encountered an error when fetching new request: ", then the backend's "Executor
#: failed process requestId N ..." prefix), "expected" (a LoraExpectedException: only the backend's prefix).
STAGES = ("backend", "executor", "expected")


class LoraRequestError(ValueError):
    """A request's LoRA tensors are refused: the message is upstream's text; ``stage`` (:data:`STAGES`) says
    which prefixes the client sees before it."""

    def __init__(self, message: str, stage: str = "executor") -> None:
        super().__init__(message)
        self.stage = stage


def _check(condition: bool, info: str, where: str = "loraUtils.cpp", stage: str = "executor") -> None:
    """TLLM_CHECK_WITH_INFO: "[TensorRT-LLM][ERROR] Assertion failed: <info> (<file>)"."""
    if not condition:
        raise LoraRequestError(f"[TensorRT-LLM][ERROR] Assertion failed: {info} ({where})", stage)


@dataclass(frozen=True)
class LoraModel:
    """The model's LoRA build (the parameters that stand for an engine's): module sizes per loraModule.cpp."""

    target_modules: Tuple[str, ...]
    max_rank: int
    num_layers: int
    dims: Dict[str, Tuple[int, int]]

    @classmethod
    def from_parameters(cls, modules_json: str, max_rank: str, shape_json: str) -> Optional["LoraModel"]:
        """From the model parameters lora_target_modules (JSON list), max_lora_rank and lora_model_shape (JSON)."""
        if not modules_json or not max_rank or not shape_json:
            return None
        shape = json.loads(shape_json)
        hidden, mlp = int(shape["hidden_size"]), int(shape["mlp_hidden_size"])
        q_out = int(shape["num_heads"]) * int(shape["head_size"])
        kv_out = int(shape["num_kv_heads"]) * int(shape["head_size"])
        sizes = {"attn_q": (hidden, q_out), "attn_k": (hidden, kv_out), "attn_v": (hidden, kv_out),
                 "attn_dense": (hidden, hidden), "mlp_h_to_4h": (hidden, mlp), "mlp_gate": (hidden, mlp),
                 "mlp_4h_to_h": (mlp, hidden)}
        modules = tuple(json.loads(modules_json))
        unknown = [m for m in modules if m not in sizes]
        if unknown:
            raise ValueError(f"lora_target_modules has modules this model cannot serve: {unknown}")
        return cls(modules, int(max_rank), int(shape["num_layers"]), {m: sizes[m] for m in modules})


@dataclass
class LoraRequest:
    """A request's LoRA: its task id, and its weights [rows, width] and config [rows, 3] when sent."""

    task_id: int
    weights: Optional[np.ndarray] = None
    config: Optional[np.ndarray] = None


def _strip_batch(arr: np.ndarray) -> np.ndarray:
    return arr[0] if arr.ndim == 3 and arr.shape[0] == 1 else arr


def parse_lora(get: Callable[[str], Optional[np.ndarray]], model: Optional[LoraModel]) -> Optional[LoraRequest]:
    """A request's LoRA tensors, checked as the backend, LoraConfig and loraValidateRequestTensors check them.

    Returns None without ``lora_task_id``, or when the model has no LoRA (``model`` None: ignored, as the
    NoOp cache manager ignores them).

    Raises:
        LoraRequestError: upstream's check text, with the stage that decides its prefixes.
    """
    task = get("lora_task_id")
    if task is None:
        return None
    flat = np.asarray(task).reshape(-1)
    if flat.size != 1:
        raise LoraRequestError("failed to extract lora task id", "backend")  # utils.cc getLoraConfigFromTensors
    weights, config = get("lora_weights"), get("lora_config")
    weights = None if weights is None else _strip_batch(np.asarray(weights))
    config = None if config is None else _strip_batch(np.asarray(config))
    # executor::LoraConfig's constructor (loraConfig.cpp), run by the backend for every request
    if config is not None:
        _check(config.ndim == 2, "Expected config tensor to have 2 dimensions", "loraConfig.cpp", "backend")
    if weights is not None:
        _check(config is not None, "Request for LoRA inference with lora weights must also have lora config",
               "loraConfig.cpp", "backend")
        _check(weights.ndim == 2, "Expected weights tensor to have 2 dimensions", "loraConfig.cpp", "backend")
        _check(config.shape[0] == weights.shape[0],  # type: ignore[union-attr]
               "Expected dim 0 of lora weights and lora config to have the same size", "loraConfig.cpp", "backend")
    if model is None:
        return None
    request = LoraRequest(int(flat[0]), weights, config)
    if weights is None and config is None:
        return request
    # loraValidateRequestTensors (loraUtils.cpp)
    _check(weights is not None and config is not None,
           "Request for LoRA inference must have both lora_weights and lora_keys")
    _check(config.shape[1] in CONFIG_COLUMNS,  # type: ignore[union-attr]
           f"Expected dim2 of lora_keys to have a size in [{CONFIG_COLUMNS[0]}, {CONFIG_COLUMNS[1]}]")
    for row in np.asarray(config, dtype=np.int64):
        module_id, layer, rank = int(row[0]), int(row[1]), int(row[2])
        _check(0 <= layer < model.num_layers, "Expected layerId to be in the range [0, numModelLayers)")
        _check(rank > 0, "Expected adapterSize to be > 0")
        name = ALL_MODULE_NAMES.get(module_id, "INVALID")
        _check(name in model.dims, f"lora module {name} not enabled for this model")
        in_dim, out_dim = model.dims[name]
        _check(rank * (in_dim + out_dim) <= weights.shape[1],  # type: ignore[union-attr]
               f"lora_weights has to few values for {name}")
        _check(rank <= model.max_rank, f"Invalid low_rank ({rank}). low_rank must be smaller than mMaxLowRank "
               f"({model.max_rank})")
    return request


def unpack(request: LoraRequest, model: LoraModel) -> List[Tuple[int, str, np.ndarray, np.ndarray]]:
    """(layer, module, A [rank, in], B [out, rank]) of every row of a validated request, float32."""
    assert request.weights is not None and request.config is not None
    out = []
    weights = np.asarray(request.weights, dtype=np.float32)
    for index, row in enumerate(np.asarray(request.config, dtype=np.int64)):
        name = ALL_MODULE_NAMES[int(row[0])]
        rank, (in_dim, out_dim) = int(row[2]), model.dims[name]
        values = weights[index]
        a = values[: rank * in_dim].reshape(rank, in_dim)
        b = values[rank * in_dim: rank * in_dim + out_dim * rank].reshape(out_dim, rank)
        out.append((int(row[1]), name, a, b))
    return out


@dataclass
class _Task:
    rows: List[Tuple[int, str, np.ndarray, np.ndarray]]
    nbytes: int
    users: set = field(default_factory=set)
    handle: Optional[str] = None  # the applier's adapter name


class LoraCache:
    """The executor's host LoRA cache, by task id: bounded by ``budget_bytes`` of weights held (float32 values
    of every row, unpadded), least recently used tasks that no request uses evicted first. Thread-safe.

    ``on_store(task_id, rows) -> handle`` and ``on_evict(handle)`` apply and remove a task (peft), or do
    nothing (the token-rate stand-in).
    """

    def __init__(self, model: LoraModel, budget_bytes: int,
                 on_store: Callable[[int, list], Optional[str]] = lambda task, rows: None,
                 on_evict: Callable[[Optional[str]], None] = lambda handle: None) -> None:
        self.model = model
        self.budget_bytes = budget_bytes
        self._tasks: "OrderedDict[int, _Task]" = OrderedDict()
        self._on_store, self._on_evict = on_store, on_evict
        self._lock = threading.Lock()
        self.evictions = 0

    def __contains__(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._tasks

    def held_bytes(self) -> int:
        with self._lock:
            return sum(t.nbytes for t in self._tasks.values())

    def admit(self, request: LoraRequest, user: object) -> Optional[str]:
        """Store or bump the request's task and mark it used by ``user``; return the task's handle.

        Raises:
            LoraRequestError: not cached and no weights (the cache miss), or no room ("PEFT Cache is full").
        """
        task_id = request.task_id
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None:
                self._tasks.move_to_end(task_id)
                task.users.add(user)
                return task.handle
            if request.weights is None:
                raise LoraRequestError(
                    f"LoRA task {task_id} not found in cache. Please send LoRA weights with request", "expected")
            rows = unpack(request, self.model)
            nbytes = sum(a.nbytes + b.nbytes for _, _, a, b in rows)
            held = sum(t.nbytes for t in self._tasks.values())
            victims = []
            for other_id, other in self._tasks.items():  # least recently used first
                if held + nbytes <= self.budget_bytes:
                    break
                if not other.users:
                    victims.append(other_id)
                    held -= other.nbytes
            if held + nbytes > self.budget_bytes:
                raise LoraRequestError(f"PEFT Cache is full. Could not store taskId={task_id}", "expected")
            for other_id in victims:
                self._on_evict(self._tasks.pop(other_id).handle)
                self.evictions += 1
            task = _Task(rows, nbytes, {user})
            task.handle = self._on_store(task_id, rows)
            self._tasks[task_id] = task
            return task.handle

    def release(self, task_id: int, user: object) -> None:
        """``user`` (a finished request) no longer uses the task: it may be evicted from now on."""
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None:
                task.users.discard(user)


class PeftApplier:
    """Applies cached tasks to a transformers model with peft (one adapter per task; see the module docstring).

    ``lock`` is held while the model's adapters change and by every forward pass (:meth:`use`), so that
    requests entering or leaving the cache never change the model under a running step.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.lock = threading.RLock()
        self._counter = itertools.count(1)
        self._active: Optional[str] = "?"  # unknown at first: the first use sets it
        self._layers: list = []

    def _lora_layers(self) -> list:
        from peft.tuners.lora import LoraLayer  # noqa: PLC0415

        return [module for module in self.model.modules() if isinstance(module, LoraLayer)]

    def store(self, task_id: int, rows: list) -> str:
        """Inject the task's adapter; return its name."""
        import torch  # noqa: PLC0415
        from peft import LoraConfig, inject_adapter_in_model  # noqa: PLC0415

        name = f"task_{task_id}_{next(self._counter)}"
        rank = max(a.shape[0] for _, _, a, _ in rows)
        targets = sorted({HF_NAMES[module] for _, module, _, _ in rows})
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, lora_dropout=0.0, bias="none")
        by_position = {(layer, HF_NAMES[module]): (a, b) for layer, module, a, b in rows}
        with self.lock, torch.no_grad():
            inject_adapter_in_model(config, self.model, adapter_name=name)
            for module_name, module in self.model.named_modules():
                lora_a = getattr(module, "lora_A", None)
                if lora_a is None or name not in lora_a:
                    continue
                parts = module_name.split(".")
                layer = int(parts[parts.index("layers") + 1])
                a, b = by_position.get((layer, parts[-1]), (None, None))
                weight_a, weight_b = lora_a[name].weight, module.lora_B[name].weight
                weight_a.zero_()
                weight_b.zero_()
                if a is not None:
                    weight_a[: a.shape[0], :] = torch.from_numpy(np.ascontiguousarray(a))
                    weight_b[:, : b.shape[1]] = torch.from_numpy(np.ascontiguousarray(b))
            self._layers = self._lora_layers()
            self._active = "?"
        return name

    def evict(self, name: Optional[str]) -> None:
        """Delete the adapter ``name`` from the model."""
        if name is None:
            return
        with self.lock:
            for layer in self._lora_layers():
                if name in layer.lora_A:
                    layer.delete_adapter(name)
            configs = getattr(self.model, "peft_config", None)
            if isinstance(configs, dict):
                configs.pop(name, None)
            self._layers = self._lora_layers()
            self._active = "?"

    def use(self, name: Optional[str]) -> None:
        """Make ``name`` the active adapter (None: the base model) for the next forward pass; call with
        ``lock`` held."""
        if name == self._active:
            return
        for layer in self._layers:
            if name is None:
                layer.enable_adapters(False)
            else:
                layer.enable_adapters(True)
                layer.set_adapter(name)
        self._active = name
