"""LoRA task ids and what a stream process knows about the backend's LoRA cache.

* **Task ids.** TensorRT-LLM caches an adapter's weights under the request's ``lora_task_id`` (UINT64) and
  serves later requests of that task from its cache (``triton_backend/.../tensorrt_llm/config.pbtxt``: "The
  LoRA will be cached, so that subsequent requests for the same task only require lora_task_id"). The id
  here is the adapter's content hash (:func:`task_id_of`): every stream process, and every restart, gives
  the same adapter the same id, and two adapters never share one (60 bits of sha256).
* **Which tasks the backend holds** is not visible to a client; each process remembers the tasks it has
  served (:class:`HeldTasks`) and sends the weights only for the others. When the backend evicted a task
  meanwhile (or another process's request filled it), it answers "LoRA task <id> not found in cache. Please
  send LoRA weights with request" (``batch_manager/peftCacheManager.cpp`` ``addRequestPeft``), and the
  request is sent once more with the weights (:func:`is_cache_miss`; ``cog_triton.streaming.generation``).
* **Cache full**: "PEFT Cache is full. Could not store taskId=<id>" (the same function) when every cached
  task is in use; it becomes :class:`common.errors.LoraCacheFullError` (retryable).

:class:`Adapters` turns a request's ``lora_weights`` into its task id and tensors: fetched through the disk
cache (:mod:`cog_triton.streaming.lora.store`), converted (:mod:`cog_triton.streaming.lora.convert`) and kept converted in memory
(LRU, ``memory_bytes``). It blocks (download, conversion): callers run it off the event loop.

For the PyTorch backend (``backend="pytorch"``) nothing is converted: the adapter is its folder in the disk
cache and the same task id (the content hash), which the LLM API loads and caches itself (``LoRARequest(name,
lora_int_id, lora_path)``; the id is its cache key, TensorRT-LLM ``executor/base_worker.py`` @7b437aaa
``_load_lora_adapter``, so one adapter must keep one id and two adapters must never share one: the content hash
gives both, whatever URL an adapter came from). A remembered folder that the disk cache evicted meanwhile is
fetched again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Optional

from common.errors import LoraAdapterError
from cog_triton.streaming.client import LoraTensors
from cog_triton.streaming.lora.convert import ConvertedAdapter, convert
from cog_triton.fetch.adapter_refs import AdapterRef
from cog_triton.streaming.lora.store import DEADLINE_SETTING, AdapterStore
from cog_triton.stream_config import StoreLimits
from tensorrtllm_backend.lora import LoraSpec

log = logging.getLogger(__name__)

#: Tasks a process remembers as held by the backend (the oldest are forgotten: a forgotten one is resent).
HELD_TASKS_LIMIT = 4096
#: Converted adapters kept in memory per process, bytes.
DEFAULT_MEMORY_BYTES = 1 << 30


def task_id_of(sha256_hex: str) -> int:
    """The ``lora_task_id`` of an adapter: the first 60 bits of its content sha256 (a positive UINT64)."""
    return int(sha256_hex[:15], 16)


def is_cache_miss(message: str, task_id: int) -> bool:
    """Whether Triton's error ``message`` is the executor's cache miss for ``task_id`` (peftCacheManager.cpp)."""
    return f"LoRA task {task_id} not found in cache" in message


def is_cache_full(message: str) -> bool:
    """Whether Triton's error ``message`` is the executor's "PEFT Cache is full" (peftCacheManager.cpp)."""
    return "PEFT Cache is full" in message


@dataclass(frozen=True, eq=False)
class Adapter:
    """A request's adapter: its ``lora_task_id``, tensors (the C++ backend's) or folder (the PyTorch backend's),
    and what it is (for logs and errors)."""

    task_id: int
    tensors: Optional[LoraTensors]
    display: str
    sha256: str
    converted: Optional[ConvertedAdapter]
    path: Optional[Path] = None

    @property
    def nbytes(self) -> int:
        """Bytes this process keeps in memory for it (the converted tensors; nothing for a folder)."""
        return self.tensors.nbytes if self.tensors is not None else 0


class HeldTasks:
    """The task ids this process has had served (bounded, least recently used forgotten first; thread-safe)."""

    def __init__(self, limit: int = HELD_TASKS_LIMIT) -> None:
        self.limit = limit
        self._ids: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, task_id: int) -> bool:
        with self._lock:
            if task_id in self._ids:
                self._ids.move_to_end(task_id)
                return True
            return False

    def add(self, task_id: int) -> None:
        with self._lock:
            self._ids[task_id] = None
            self._ids.move_to_end(task_id)
            while len(self._ids) > self.limit:
                self._ids.popitem(last=False)

    def discard(self, task_id: int) -> None:
        with self._lock:
            self._ids.pop(task_id, None)

    def clear(self) -> None:
        """Forget everything (Triton restarted: its LoRA cache is empty)."""
        with self._lock:
            self._ids.clear()


class Adapters:
    """Resolves ``lora_weights`` references to :class:`Adapter` (see the module docstring).

    Args:
        spec: what the served model accepts.
        limits: the disk cache and download bounds.
        memory_bytes: converted adapters kept in memory, bytes.
        backend: "engine" (the C++ backend and the CPU reference model: converted tensors) or "pytorch" (the
            adapter's folder).
    """

    def __init__(self, spec: LoraSpec, limits: StoreLimits, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 backend: Literal["engine", "pytorch"] = "engine") -> None:
        if backend not in ("engine", "pytorch"):
            raise ValueError(f"backend must be 'engine' or 'pytorch', got {backend!r}")
        self.backend = backend
        self.spec = spec
        self.store = AdapterStore(limits, spec)
        if spec.enabled:
            log.info("LoRA adapters: at most %d bytes each (%s), archives of at most %d members", self.store.cap_bytes,
                     self.store.cap_reason, limits.max_members)
        self.memory_bytes = memory_bytes
        self.held = HeldTasks()
        self._by_content: OrderedDict[str, Adapter] = OrderedDict()
        self._by_source: dict[str, str] = {}
        self._locks: dict[str, list] = {}  # source key -> [its lock, requests holding or waiting for it]
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()  # "memory_hits", "engine_misses" since the last take_counts()

    def count(self, name: str) -> None:
        """Count one ``name`` event (``engine_misses``: the backend no longer held a task; cog_triton.streaming.generation)."""
        with self._lock:
            self._counts[name] += 1

    def take_counts(self) -> dict[str, int]:
        """What happened since the last call, and start again: ``memory_hits`` (resolved from memory),
        ``disk_hits`` and ``fetches`` (the disk cache's, :meth:`AdapterStore.take_counts`), ``engine_misses``."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        counts.update(self.store.take_counts())
        return {name: n for name, n in counts.items() if n}

    def check_enabled(self, ref: AdapterRef) -> None:
        """Raise at once when the model serves no LoRA (before anything is downloaded).

        Raises:
            LoraAdapterError: naming why (e.g. the engine was built without the LoRA plugin).
        """
        if not self.spec.enabled:
            raise LoraAdapterError(f"lora_weights {ref.display} was given, but this model cannot serve LoRA "
                                   f"adapters: {self.spec.off_reason}")

    def resolve(self, ref: AdapterRef) -> Adapter:
        """The adapter ``ref`` names, from memory, the disk cache or its source (blocking).

        Raises:
            LoraAdapterError: see :meth:`check_enabled`, :meth:`cog_triton.streaming.lora.store.AdapterStore.get` and
                :func:`cog_triton.streaming.lora.convert.convert`.
        """
        self.check_enabled(ref)
        cached = self._cached(ref)  # from memory: never behind another request's fetch
        if cached is not None:
            self.count("memory_hits")
            return cached
        started = time.monotonic()
        deadline_at = started + self.store.limits.deadline_s  # the whole fetch's, the wait below included
        with self._source_lock(ref.key, deadline_at, ref):  # one fetch and conversion per source in this process
            cached = self._cached(ref)
            if cached is not None:
                self.count("memory_hits")
                return cached
            local = self.store.get(ref, deadline_at)
            with self._lock:
                known = self._by_content.get(local.sha256)
            if known is None and self.backend == "pytorch":
                known = Adapter(task_id_of(local.sha256), None, ref.display, local.sha256, None, path=local.folder)
                log.info("adapter %s: lora_task_id %d, folder %s (the LLM API loads it), ready in %.2f s",
                         ref.display, known.task_id, local.folder, time.monotonic() - started)
            elif known is not None and self.backend == "pytorch" and (known.path is None or not known.path.is_dir()):
                known = Adapter(known.task_id, None, known.display, known.sha256, None, path=local.folder)
            if known is None:
                try:
                    converted = convert(local.config, local.weights_path, self.spec, ref.display)
                except LoraAdapterError:
                    self.store.discard(ref)  # a refused adapter leaves nothing in the disk cache
                    raise
                known = Adapter(task_id_of(local.sha256), converted.tensors, ref.display, local.sha256, converted)
                log.info(
                    "adapter %s: lora_task_id %d, rank %d, %d layers x %s, %d rows (%.1f MB), ready in %.2f s",
                    ref.display, known.task_id, converted.rank, converted.layers, "/".join(converted.modules),
                    converted.tensors.rows, converted.tensors.nbytes / 1e6, time.monotonic() - started,
                )
            self._remember(ref, known)
            return known

    @contextlib.contextmanager
    def _source_lock(self, key: str, deadline_at: float, ref: AdapterRef) -> Iterator[None]:
        """Hold the lock of source ``key`` (one fetch per source in this process); wait for it until ``deadline_at``
        at most. The lock is forgotten when nobody holds or waits for it (sources are unbounded).

        Raises:
            LoraAdapterError: the deadline came first (another request's fetch of the same adapter still runs).
        """
        with self._lock:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            if not entry[0].acquire(timeout=max(0.0, deadline_at - time.monotonic())):
                raise LoraAdapterError(
                    f"lora_weights {ref.display} could not be fetched: another request's fetch of the same adapter "
                    f"did not finish within the deadline of {self.store.limits.deadline_s:g} s ({DEADLINE_SETTING})")
            try:
                yield
            finally:
                entry[0].release()
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    self._locks.pop(key, None)

    def _cached(self, ref: AdapterRef) -> Optional[Adapter]:
        with self._lock:
            sha = self._by_source.get(ref.key)
            adapter = self._by_content.get(sha) if sha else None
            if adapter is not None:
                self._by_content.move_to_end(sha)  # type: ignore[arg-type]
        if adapter is not None:
            try:
                self.store.touch(ref)
            except OSError:
                if self.backend == "pytorch":
                    return None  # its folder was evicted from the disk cache: fetch it again
            if self.backend == "pytorch" and (adapter.path is None or not adapter.path.is_dir()):
                return None  # the folder it was remembered with (another source's) was evicted
        return adapter

    def _remember(self, ref: AdapterRef, adapter: Adapter) -> None:
        with self._lock:
            self._by_source[ref.key] = adapter.sha256
            self._by_content[adapter.sha256] = adapter
            self._by_content.move_to_end(adapter.sha256)
            total = sum(a.nbytes for a in self._by_content.values())
            while total > self.memory_bytes and len(self._by_content) > 1:
                sha, old = self._by_content.popitem(last=False)
                total -= old.nbytes
                for key in [k for k, v in self._by_source.items() if v == sha]:
                    del self._by_source[key]


__all__ = ("Adapter", "Adapters", "HeldTasks", "is_cache_full", "is_cache_miss", "task_id_of")
