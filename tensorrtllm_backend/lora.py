"""TensorRT-LLM's LoRA contract (1.1.0): module ids, Hugging Face module names, module sizes, and what a
served model supports (:class:`LoraSpec`).

Interface facts, each read in NVIDIA/TensorRT-LLM (not copied):

* **Module ids** (the first column of a request's ``lora_config`` tensor): ``tensorrt_llm/lora_manager.py``
  ``LoraManager.LORA_MODULE_IDS``, the same numbers as C++ ``LoraModule::ModuleType`` that
  ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`` lists in its comment.
* **Hugging Face names**: ``tensorrt_llm/lora_helper.py`` ``get_default_trtllm_modules_to_hf_modules``
  (q_proj -> attn_q, k_proj -> attn_k, v_proj -> attn_v, o_proj -> attn_dense, gate_proj -> mlp_h_to_4h,
  up_proj -> mlp_gate, down_proj -> mlp_4h_to_h), also ``examples/hf_lora_convert.py``'s table.
* **Module sizes** (in, out): ``cpp/tensorrt_llm/runtime/loraModule.cpp`` ``LoraModule::createLoraModules``:
  attn_q hidden -> heads x head_size; attn_k/attn_v hidden -> kv_heads x head_size; attn_dense hidden -> hidden;
  mlp_h_to_4h/mlp_gate hidden -> mlp_hidden; mlp_4h_to_h mlp_hidden -> hidden.
* **What an engine serves**: ``config.json`` ``build_config.lora_config.max_lora_rank`` and
  ``lora_target_modules``, and ``build_config.plugin_config.lora_plugin`` (null: no LoRA), read by
  ``cpp/tensorrt_llm/runtime/gptJsonConfig.cpp`` ``parseLora`` (the plugin is turned off when no module is
  enabled or the max rank is 0). ``trtllm-build`` writes them from ``--lora_plugin``, ``--max_lora_rank``
  (default 64) and ``--lora_target_modules`` (``tensorrt_llm/commands/build.py``).
* **An engine without the LoRA plugin ignores the LoRA tensors**: its executor's
  ``NoOpPeftCacheManager::addRequestPeft`` does nothing (``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp``),
  so a request with an adapter would silently get the base model: the predictor refuses it instead.
* **Weights dtype** must be the model's (``cpp/tensorrt_llm/runtime/loraUtils.cpp``
  ``loraValidateRequestTensors``: "Expected lora weights to be the same data type as base model").
* **A fused gated MLP applies gate_proj and up_proj LoRA together or not at all.** ``trtllm-build`` fuses a
  gated MLP's two input projections into one GEMM when ``plugin_config.use_fused_mlp`` is on (its default;
  ``tensorrt_llm/builder.py`` ``optimize_model_with_config`` @ 008b2b8d; ``tensorrt_llm/models/modeling_utils.py``
  ``fuse_gate_mlp`` @ 01ea6d79 replaces ``GatedMLP`` by ``FusedGatedMLP``), and the fused layer adds LoRA only
  when both ``mlp_h_to_4h`` and ``mlp_gate`` are LoRA modules of the engine (``tensorrt_llm/layers/mlp.py``
  ``fc_gate_lora`` @ 04a2cacb, unchanged from b57221b7's ``FusedGatedMLP.forward``): an engine built with one of
  them ignores adapters' weights for it, while the executor, which knows only ``lora_target_modules``, takes
  them. A module an adapter leaves out of an applied pair gets rank 0, whose output the LoRA kernel zeroes
  (``cpp/tensorrt_llm/kernels/lora/lora.cpp`` ``LoraImpl::run`` @ 0f4dc1d0), so an adapter of only gate_proj or
  only up_proj is served right by an engine that applies both. :attr:`LoraSpec.applied_modules`.
* **Host LoRA cache size** (:meth:`LoraSpec.host_cache_bytes`): the cache is made of pages
  (``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp`` ``getPageManagerConfig`` @ 9df6d722, the same
  arithmetic @ 0cedd9a0). Per rank, with each module's local ``in + out`` (``loraModule.cpp``
  ``createLoraModules`` @ 2a9abd95 and ``loraModule.h`` @ 0ccc36f7: attn_dense and mlp_4h_to_h split "in" by the
  tensor-parallel size, the other modules split "out"): a slot is ``page width = the smallest in + out`` values;
  a page has ``max(optimal adapter size x sum over modules of ceil((in + out) / page width) x local layers,
  ceil(max adapter size x largest in + out / page width))`` slots; the cache has ``ceil(floor(bytes / (page
  width x dtype size)) / slots per page)`` pages, and start-up fails with "Not enough space allocated to host
  LoRA cache to hold 1 max sized LoRA" below ``ceil(max adapter size x sum of in + out x local layers / page
  width)`` slots. An adapter takes ``ceil(rank x (in + out) / page width)`` slots per row, rows placed in order
  and a row that does not fit the rest of a page starting the next one (``runtime/loraCache.cpp``
  ``LoraCache::determineNumPages`` @ c85e8726). The optimal and maximum adapter sizes are capped at the
  engine's max_lora_rank (``PeftCacheManager``'s constructor); their defaults are 8 and 64
  (``executor.h`` ``PeftCacheConfig``), the host cache's 1 GiB (``peftCacheManagerConfig.h``).

**The largest adapter a model serves** (:meth:`LoraSpec.largest_adapter_file_bytes`) follows from these limits: a
rank of at most max_lora_rank (``loraUtils.cpp`` ``loraValidateRequestTensors``), on the modules the engine applies,
at the model's module sizes, in every layer; an adapter of more values cannot be served, so a request's adapter is
never allowed more bytes than that (the stream process refuses a larger download or file before reading it).
Its file is counted at :data:`ADAPTER_FILE_VALUE_BYTES` per value (float32; see there) plus a safetensors header of
at most :data:`SAFETENSORS_HEADER_BYTES_PER_TENSOR` per tensor and :data:`SAFETENSORS_HEADER_BASE_BYTES`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

#: LoraManager.LORA_MODULE_IDS (tensorrt_llm/lora_manager.py).
LORA_MODULE_IDS: dict[str, int] = {
    "attn_qkv": 0,
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
    "cross_attn_qkv": 8,
    "cross_attn_q": 9,
    "cross_attn_k": 10,
    "cross_attn_v": 11,
    "cross_attn_dense": 12,
    "moe_h_to_4h": 13,
    "moe_4h_to_h": 14,
    "moe_gate": 15,
    "moe_router": 16,
    "mlp_router": 17,
    "mlp_gate_up": 18,
}
MODULE_NAMES: dict[int, str] = {value: name for name, value in LORA_MODULE_IDS.items()}

#: The modules this project converts and serves: the decoder layers' separate projections
#: (lora_helper.py get_default_trtllm_modules_to_hf_modules). Fused or MoE modules are refused.
TRTLLM_TO_HF: dict[str, str] = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_dense": "o_proj",
    "mlp_h_to_4h": "gate_proj",
    "mlp_gate": "up_proj",
    "mlp_4h_to_h": "down_proj",
}
HF_TO_TRTLLM: dict[str, str] = {hf: trt for trt, hf in TRTLLM_TO_HF.items()}
SUPPORTED_MODULES: tuple[str, ...] = tuple(TRTLLM_TO_HF)
#: trtllm-build's --max_lora_rank default (tensorrt_llm/commands/build.py).
DEFAULT_MAX_LORA_RANK = 64
#: How many adapters of the maximum size the LoRA cache is sized to hold by default.
DEFAULT_MAX_LORAS = 8
#: The C++ backend's lora_cache_host_memory_bytes default (PeftCacheManagerConfig::kDefaultHostCacheSize).
UPSTREAM_HOST_CACHE_BYTES = 1 << 30
#: The backend's lora_cache_optimal_adapter_size and lora_cache_max_adapter_size defaults
#: (executor.h PeftCacheConfig::kDefaultOptimalAdapterSize / kDefaultMaxAdapterSize).
UPSTREAM_OPTIMAL_ADAPTER_SIZE = 8
UPSTREAM_MAX_ADAPTER_SIZE = 64
#: The two input projections of a gated MLP, which a fused gated MLP applies LoRA to only together
#: (tensorrt_llm/layers/mlp.py fc_gate_lora): gate_proj and up_proj.
FUSED_MLP_PAIR: tuple[str, str] = ("mlp_h_to_4h", "mlp_gate")
#: Modules whose "in" dimension is split across tensor-parallel ranks (RowLinear); the others split "out"
#: (loraModule.cpp createLoraModules: inTpSplitDim 1 for attn_dense and mlp_4h_to_h, outTpSplitDim 0 otherwise).
_IN_SPLIT_MODULES = ("attn_dense", "mlp_4h_to_h")
#: Bytes per value of each LoRA weights dtype, and the Triton / protocol names of the dtype.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
TRITON_DATATYPES = {"float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float32": "TYPE_FP32"}
WIRE_DATATYPES = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32"}
#: Bytes per value an adapter file is counted at when bounding its size: float32's. PEFT saves LoRA weights in the
#: dtype they were trained in (``save_pretrained`` writes the adapter's state dict as it is), which is float32 even on
#: a float16 or bfloat16 model: peft upcasts an adapter's float16 and bfloat16 parameters to float32 unless told not
#: to (``peft/tuners/tuners_utils.py`` ``cast_adapter_dtype``, ``autocast_adapter_dtype=True`` by default, peft
#: 0.21.2); float16 and bfloat16 files take half of it.
ADAPTER_FILE_VALUE_BYTES = 4
#: A safetensors file starts with 8 bytes (the header's length, a little-endian u64), then its JSON header
#: (huggingface/safetensors ``safetensors/src/tensor.rs`` ``SafeTensors::read_metadata``). A PEFT LoRA tensor's entry
#: (its key, dtype, shape and data offsets) takes about 130-160 bytes (132 for SmolLM2-135M's keys, as peft 0.21
#: writes them); an adapter's header may take this many bytes per tensor ...
SAFETENSORS_HEADER_BYTES_PER_TENSOR = 512
#: ... and this many more (``__metadata__`` and padding).
SAFETENSORS_HEADER_BASE_BYTES = 64 << 10
#: Columns of a lora_config row: [module_id, layer_idx, adapter_size] (the tensorrt_llm config.pbtxt's
#: ``dims: [ -1, 3 ]``; loraUtils.cpp also accepts a fourth, is_dora, column that the template does not declare).
LORA_CONFIG_COLUMNS = 3


@dataclass(frozen=True)
class ModelShape:
    """The sizes LoRA modules are built from (full model, before tensor parallelism), in values.

    Attributes:
        num_layers: decoder layers (layer_idx in [0, num_layers)).
        hidden_size / mlp_hidden_size: model and MLP widths.
        num_heads / num_kv_heads / head_size: attention heads, key-value heads, values per head.
    """

    num_layers: int
    hidden_size: int
    mlp_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int

    def module_dims(self, module: str) -> tuple[int, int]:
        """(in, out) of ``module`` as LoraModule::createLoraModules sizes it.

        Raises:
            KeyError: a module this project does not serve (see :data:`SUPPORTED_MODULES`).
        """
        hidden, mlp = self.hidden_size, self.mlp_hidden_size
        dims = {
            "attn_q": (hidden, self.num_heads * self.head_size),
            "attn_k": (hidden, self.num_kv_heads * self.head_size),
            "attn_v": (hidden, self.num_kv_heads * self.head_size),
            "attn_dense": (hidden, hidden),
            "mlp_h_to_4h": (hidden, mlp),
            "mlp_gate": (hidden, mlp),
            "mlp_4h_to_h": (mlp, hidden),
        }
        return dims[module]

    def local_module_dims(self, module: str, tp_size: int = 1) -> tuple[int, int]:
        """(in, out) of ``module`` on one tensor-parallel rank, as LoraModule::localInDim / localOutDim give them:
        attn_dense and mlp_4h_to_h split "in", the other modules "out". attn_k / attn_v have num_kv_heads / tp_size
        heads per rank; fewer key-value heads than ranks is taken as one per rank (replicated heads; not checked
        against upstream's gptJsonConfig.cpp, which we could not read at 1.x).

        Raises:
            KeyError: a module this project does not serve.
        """
        if module in ("attn_k", "attn_v"):
            return self.hidden_size, max(self.num_kv_heads // tp_size, 1) * self.head_size
        in_dim, out_dim = self.module_dims(module)
        if module in _IN_SPLIT_MODULES:
            return in_dim // tp_size, out_dim
        return in_dim, out_dim // tp_size

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def pages_for_rows(row_slots: Iterable[int], slots_per_page: int) -> int:
    """Pages one adapter takes in the LoRA cache: its rows' slots placed in order, a row that does not fit in the
    rest of the current page starting the next page (runtime/loraCache.cpp LoraCache::determineNumPages).

    Args:
        row_slots: slots of each row, ``ceil(rank x (local in + local out) / page width)``, in request order.
        slots_per_page: the cache's slots per page.
    """
    page, used = 0, 0
    for slots in row_slots:
        if used + slots > slots_per_page:
            page, used = page + 1, 0
        used += slots
    return page + 1


@dataclass(frozen=True)
class LoraCachePages:
    """The geometry of one rank's LoRA cache (peftCacheManager.cpp getPageManagerConfig), in values and slots.

    Attributes:
        page_width: values per slot (the smallest local in + out of the engine's modules).
        slots_per_page: slots per page.
        min_slots: fewest slots the backend accepts ("Not enough space allocated to host LoRA cache to hold 1 max
            sized LoRA").
        adapter_pages: pages one adapter of the engine's max_lora_rank on every module and layer takes.
        slot_bytes: bytes per slot (page width x the weights dtype's size).
    """

    page_width: int
    slots_per_page: int
    min_slots: int
    adapter_pages: int
    slot_bytes: int

    def pages_of(self, cache_bytes: int) -> int:
        """Pages a cache of ``cache_bytes`` has: ceil(floor(bytes / slot bytes) / slots per page)."""
        return -(-(cache_bytes // self.slot_bytes) // self.slots_per_page)

    def accepts(self, cache_bytes: int) -> bool:
        """Whether the backend starts with a cache of ``cache_bytes`` (its one-max-sized-LoRA check)."""
        return cache_bytes // self.slot_bytes >= self.min_slots


@dataclass(frozen=True)
class LoraSpec:
    """What the served model accepts as a LoRA adapter (picklable: it travels to the stream processes).

    Attributes:
        enabled: adapters can be served.
        off_reason: why not, for the error a request with ``lora_weights`` gets (when not enabled).
        dtype: the dtype the ``lora_weights`` tensor must have (the model's: loraUtils.cpp).
        max_rank: the largest adapter rank (r) the engine takes (``max_lora_rank``).
        target_modules: the TensorRT-LLM modules the engine was built with (``lora_target_modules``).
        shape: the model's sizes (module shapes and layer count).
        max_loras: how many adapters of ``max_rank`` on every module the LoRA cache is sized for.
        architecture: e.g. "LlamaForCausalLM", for messages.
        base_model: what the model was made from (Hub id or checkpoint name; "" when unknown), for messages.
        fused_mlp: the engine's gated MLP is fused (``plugin_config.use_fused_mlp``): it applies mlp_h_to_4h and
            mlp_gate LoRA only together (:attr:`applied_modules`). False for the CPU reference model, whose
            transformers MLP keeps gate_proj and up_proj apart.
        paged_cache: served by the C++ backend, whose LoRA cache is paged (:meth:`host_cache_bytes`); False for
            the CPU reference model, whose cache counts the values it holds.
        tp_size / pp_size: the engine's tensor and pipeline parallelism (each rank has its own LoRA cache).
        rank_limit / rank_fix: what the rank limit is called and how to raise it, for the message refusing an
            adapter above ``max_rank`` (an engine's build value, or a setting of the PyTorch backend).
    """

    enabled: bool
    off_reason: str = ""
    dtype: str = "float16"
    max_rank: int = 0
    target_modules: tuple[str, ...] = ()
    shape: Optional[ModelShape] = None
    max_loras: int = DEFAULT_MAX_LORAS
    architecture: str = ""
    base_model: str = ""
    fused_mlp: bool = False
    paged_cache: bool = False
    tp_size: int = 1
    pp_size: int = 1
    rank_limit: str = "the engine's max_lora_rank"
    rank_fix: str = "rebuild the engine with a larger lora.max_lora_rank"

    @property
    def unapplied_modules(self) -> tuple[str, ...]:
        """Target modules whose adapter weights the engine ignores: the one of :data:`FUSED_MLP_PAIR` an engine
        with a fused gated MLP was built with without the other (tensorrt_llm/layers/mlp.py fc_gate_lora)."""
        if not self.fused_mlp:
            return ()
        present = [m for m in FUSED_MLP_PAIR if m in self.target_modules]
        return tuple(present) if len(present) == 1 else ()

    @property
    def applied_modules(self) -> tuple[str, ...]:
        """The target modules the engine applies adapters to (an adapter with another module is refused)."""
        return tuple(m for m in self.target_modules if m not in self.unapplied_modules)

    @property
    def triton_datatype(self) -> str:
        """``TYPE_FP16`` / ``TYPE_BF16`` / ``TYPE_FP32``: the lora_weights data_type of the model configs."""
        return TRITON_DATATYPES.get(self.dtype, "TYPE_FP16")

    def adapter_values(self, rank: Optional[int] = None) -> int:
        """Values in an adapter of ``rank`` (default ``max_rank``) on every target module of every layer."""
        if self.shape is None:
            return 0
        rank = self.max_rank if rank is None else rank
        per_layer = sum(sum(self.shape.module_dims(m)) for m in self.target_modules if m in SUPPORTED_MODULES)
        return rank * per_layer * self.shape.num_layers

    def largest_adapter_tensors(self) -> int:
        """Tensors in the largest adapter served: lora_A and lora_B of every applied module in every layer (0 when LoRA
        is off)."""
        if not self.enabled or self.shape is None:
            return 0
        return 2 * len([m for m in self.applied_modules if m in SUPPORTED_MODULES]) * self.shape.num_layers

    def largest_adapter_values(self) -> int:
        """Values in the largest adapter served: rank ``max_rank`` on every applied module of every layer (0 when LoRA
        is off). An adapter with more cannot be served (each of its modules has at most that rank and those sizes)."""
        if not self.enabled or self.shape is None:
            return 0
        per_layer = sum(sum(self.shape.module_dims(m)) for m in self.applied_modules if m in SUPPORTED_MODULES)
        return self.max_rank * per_layer * self.shape.num_layers

    def largest_header_bytes(self) -> int:
        """Most bytes of safetensors header (its JSON, without the 8-byte length) an adapter of this model may have."""
        return SAFETENSORS_HEADER_BASE_BYTES + SAFETENSORS_HEADER_BYTES_PER_TENSOR * self.largest_adapter_tensors()

    def largest_adapter_file_bytes(self) -> int:
        """Bytes of the largest ``adapter_model.safetensors`` this model serves (0 when LoRA is off): the 8-byte length,
        :meth:`largest_header_bytes` and :meth:`largest_adapter_values` at :data:`ADAPTER_FILE_VALUE_BYTES` each."""
        if not self.enabled or self.shape is None:
            return 0
        return 8 + self.largest_header_bytes() + ADAPTER_FILE_VALUE_BYTES * self.largest_adapter_values()

    def describe_largest_adapter(self) -> str:
        """The largest adapter served, in words, for messages ("rank 64 on q_proj, ... of 30 layers: 78,207,144 bytes
        ...")."""
        modules = ", ".join(TRTLLM_TO_HF[m] for m in self.applied_modules if m in SUPPORTED_MODULES)
        layers = self.shape.num_layers if self.shape is not None else 0
        return (f"rank {self.max_rank} on {modules} of {layers} layers: {self.largest_adapter_file_bytes()} bytes as a "
                f"float32 adapter_model.safetensors")

    def cache_pages(self, optimal_adapter_size: Optional[int] = None,
                    max_adapter_size: Optional[int] = None) -> LoraCachePages:
        """The C++ backend's LoRA cache geometry for this engine (see the module docstring for the arithmetic),
        for the rank with the most layers.

        Args:
            optimal_adapter_size / max_adapter_size: lora_cache_optimal_adapter_size / lora_cache_max_adapter_size
                (None: the backend's defaults, 8 and 64), both capped at max_lora_rank as the backend caps them.

        Raises:
            ValueError: LoRA is off (no modules or sizes to compute with).
        """
        if not self.enabled or self.shape is None or not self.target_modules:
            raise ValueError("no LoRA cache: LoRA is off for this model")
        optimal = min(optimal_adapter_size or UPSTREAM_OPTIMAL_ADAPTER_SIZE, self.max_rank)
        largest = min(max_adapter_size or UPSTREAM_MAX_ADAPTER_SIZE, self.max_rank)
        layers = -(-self.shape.num_layers // self.pp_size)
        in_out = {m: sum(self.shape.local_module_dims(m, self.tp_size)) for m in self.target_modules}
        width = min(in_out.values())
        slots_per_page = max(optimal * sum(-(-d // width) for d in in_out.values()) * layers,
                             -(-largest * max(in_out.values()) // width))
        min_slots = -(-largest * sum(in_out.values()) * layers // width)
        order = sorted(self.target_modules, key=LORA_MODULE_IDS.__getitem__)  # rows as the converter sorts them
        rows = (-(-self.max_rank * in_out[m] // width) for _ in range(layers) for m in order)
        return LoraCachePages(width, slots_per_page, min_slots, pages_for_rows(rows, slots_per_page),
                              width * DTYPE_BYTES.get(self.dtype, 2))

    def host_cache_bytes(self, optimal_adapter_size: Optional[int] = None,
                         max_adapter_size: Optional[int] = None) -> int:
        """Bytes of host LoRA cache that hold ``max_loras`` adapters of max_lora_rank on every module at once.

        For the C++ backend (``paged_cache``): whole pages, ``max_loras`` x the pages one such adapter takes (the
        page arithmetic of :meth:`cache_pages`, with the same optimal and maximum adapter sizes as the backend's
        parameters); never below the backend's one-adapter minimum. For the CPU reference model, whose cache
        counts the values it holds: ``max_loras`` x the adapter's values x the dtype's size.
        """
        if not self.paged_cache:
            return self.max_loras * self.adapter_values() * DTYPE_BYTES.get(self.dtype, 2)
        pages = self.cache_pages(optimal_adapter_size, max_adapter_size)
        slots = max(self.max_loras * pages.adapter_pages * pages.slots_per_page, pages.min_slots)
        return slots * pages.slot_bytes

    def describe(self) -> str:
        if not self.enabled:
            return f"LoRA off ({self.off_reason})"
        ignored = ""
        if self.unapplied_modules:
            ignored = (f" ({', '.join(self.unapplied_modules)} not applied: the engine's fused gated MLP needs "
                       f"{' and '.join(FUSED_MLP_PAIR)} together; adapters with it are refused)")
        return (
            f"LoRA on: max_lora_rank {self.max_rank}, modules {', '.join(self.target_modules)}{ignored}, weights "
            f"{self.dtype}, cache sized for {self.max_loras} adapters of the maximum size"
        )


def _int(section: Mapping[str, Any], key: str, default: Optional[int] = None) -> int:
    value = section.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
    return value


def shape_of(config: Mapping[str, Any]) -> ModelShape:
    """The :class:`ModelShape` of a TensorRT-LLM ``pretrained_config`` or a Hugging Face ``config.json``.

    Keys: num_hidden_layers, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads
    (default: num_attention_heads), head_size (TensorRT-LLM ``PretrainedConfig``) or head_dim (Hugging
    Face), default hidden_size // num_attention_heads (tensorrt_llm/models/modeling_utils.py).

    Raises:
        ValueError: a size is missing or not a positive integer.
    """
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    if not heads or not hidden:
        raise ValueError("hidden_size and num_attention_heads must be positive")
    head_size = config.get("head_size") or config.get("head_dim") or hidden // heads
    return ModelShape(
        num_layers=_int(config, "num_hidden_layers"),
        hidden_size=hidden,
        mlp_hidden_size=_int(config, "intermediate_size"),
        num_heads=heads,
        num_kv_heads=_int(config, "num_key_value_heads", heads) or heads,
        head_size=int(head_size),
    )


def engine_lora_spec(config: Mapping[str, Any], where: str = "config.json") -> LoraSpec:
    """The LoRA support of a ``trtllm-build`` engine, from its ``config.json`` (as gptJsonConfig.cpp parseLora
    reads it), with whether its gated MLP is fused (``build_config.plugin_config.use_fused_mlp``, on when absent)
    and its tensor / pipeline parallelism (``pretrained_config.mapping``), which the LoRA cache is sized by.
    Never raises: an unreadable section gives a spec that is off, with the reason."""
    pretrained = config.get("pretrained_config") or {}
    build = config.get("build_config") or {}
    plugin = (build.get("plugin_config") or {}).get("lora_plugin")
    lora = build.get("lora_config") or {}
    dtype = str(pretrained.get("dtype", "float16"))
    arch = str(pretrained.get("architecture", ""))
    if plugin in (None, "", "disable"):
        return LoraSpec(False, "the engine was built without the LoRA plugin (its config.json has "
                        "build_config.plugin_config.lora_plugin null); rebuild it with a lora: section in its "
                        "build config (scripts/build_engine) to serve adapters", dtype=dtype, architecture=arch)
    try:
        modules = tuple(str(m) for m in (lora.get("lora_target_modules") or ()))
        max_rank = _int(lora, "max_lora_rank", 0)
        shape = shape_of(pretrained)
    except (ValueError, TypeError) as exc:
        return LoraSpec(False, f"{where}: unreadable LoRA settings ({exc})", dtype=dtype, architecture=arch)
    if not modules or max_rank == 0:
        return LoraSpec(False, "the engine has the LoRA plugin but no LoRA module or max_lora_rank 0, so "
                        "TensorRT-LLM turns LoRA off (gptJsonConfig.cpp parseLora)", dtype=dtype, architecture=arch)
    unsupported = [m for m in modules if m not in SUPPORTED_MODULES]
    if unsupported:
        return LoraSpec(False, f"the engine's lora_target_modules include {', '.join(unsupported)}, which this "
                        f"image cannot convert adapters for (supported: {', '.join(SUPPORTED_MODULES)})",
                        dtype=dtype, architecture=arch)
    mapping = pretrained.get("mapping") or {}
    plugins = build.get("plugin_config") or {}
    # plugin_config.use_fused_mlp (1.x, default on: tensorrt_llm/plugin/plugin.py); build_config.use_fused_mlp before
    fused = plugins.get("use_fused_mlp", build.get("use_fused_mlp", True))
    try:
        tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    except (TypeError, ValueError, AttributeError):
        tp = pp = 1  # _engine_info refuses such a mapping with its own error
    return LoraSpec(True, dtype=dtype, max_rank=max_rank, target_modules=modules, shape=shape, architecture=arch,
                    fused_mlp=fused not in (False, "disable"), paged_cache=True, tp_size=max(tp, 1),
                    pp_size=max(pp, 1))


def checkpoint_lora_spec(hf_config: Mapping[str, Any], build_lora: Optional[Mapping[str, Any]],
                         peft_available: bool, base_model: str = "") -> LoraSpec:
    """The LoRA support of a Hugging Face checkpoint served by the CPU reference model.

    ``build_lora``: the ``lora`` section of the archive's build config (manifest.json), or None for the
    defaults (every supported module, max rank :data:`DEFAULT_MAX_LORA_RANK`); ``{"enabled": false}``-like
    sections are not used: a build config without ``lora`` uses the defaults. The reference model runs in
    float32, so its lora_weights are float32 (the model's dtype, as loraUtils.cpp requires). It has no fused
    gated MLP (transformers' MLP keeps gate_proj and up_proj as separate layers, each adapted by peft on its own)
    and no paged cache, so ``fused_mlp`` and ``paged_cache`` stay off.
    """
    arch = str((hf_config.get("architectures") or [hf_config.get("model_type", "")])[0])
    if not peft_available:
        return LoraSpec(False, "the peft package is not installed, which the CPU reference model applies "
                        "adapters with", dtype="float32", architecture=arch)
    try:
        shape = shape_of(hf_config)
    except (ValueError, TypeError) as exc:
        return LoraSpec(False, f"the checkpoint's config.json lacks model sizes ({exc})", dtype="float32",
                        architecture=arch)
    section = dict(build_lora or {})
    modules = tuple(section.get("lora_target_modules") or SUPPORTED_MODULES)
    return LoraSpec(
        True,
        dtype="float32",
        max_rank=int(section.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK),
        target_modules=modules,
        shape=shape,
        max_loras=int(section.get("max_loras") or DEFAULT_MAX_LORAS),
        architecture=arch,
        base_model=base_model,
    )


def spec_to_parameters(spec: LoraSpec) -> dict[str, str]:
    """The reference model's LoRA parameters (its config.pbtxt): lora_target_modules (JSON list),
    max_lora_rank, lora_num_layers and the module sizes (JSON), or empty strings when LoRA is off."""
    if not spec.enabled or spec.shape is None:
        return {"lora_target_modules": "", "max_lora_rank": "", "lora_model_shape": ""}
    return {
        "lora_target_modules": json.dumps(list(spec.target_modules)),
        "max_lora_rank": str(spec.max_rank),
        "lora_model_shape": json.dumps(spec.shape.to_json(), sort_keys=True),
    }


def fused_pair_problem(modules: Iterable[str]) -> str:
    """Why ``modules`` cannot be an engine's LoRA modules when its gated MLP is fused, or "" when they can: one
    of :data:`FUSED_MLP_PAIR` without the other (tensorrt_llm/layers/mlp.py fc_gate_lora adds LoRA to the fused
    layer only when both are LoRA modules, so the engine would ignore adapters' weights for the one listed)."""
    present = [m for m in FUSED_MLP_PAIR if m in set(modules)]
    if len(present) != 1:
        return ""
    (have,) = present
    (lack,) = [m for m in FUSED_MLP_PAIR if m != have]
    return (f"{have} ({TRTLLM_TO_HF[have]}) without {lack} ({TRTLLM_TO_HF[lack]}): the fused gated MLP applies LoRA "
            f"to {TRTLLM_TO_HF['mlp_h_to_4h']} and {TRTLLM_TO_HF['mlp_gate']} together or not at all "
            "(tensorrt_llm/layers/mlp.py fc_gate_lora), so the engine would silently ignore adapters' "
            f"{TRTLLM_TO_HF[have]} weights")


__all__ = (
    "ADAPTER_FILE_VALUE_BYTES", "DEFAULT_MAX_LORA_RANK", "DEFAULT_MAX_LORAS", "FUSED_MLP_PAIR", "HF_TO_TRTLLM",
    "LORA_MODULE_IDS", "LoraCachePages", "LoraSpec", "ModelShape", "SAFETENSORS_HEADER_BASE_BYTES",
    "SAFETENSORS_HEADER_BYTES_PER_TENSOR", "SUPPORTED_MODULES", "TRTLLM_TO_HF", "checkpoint_lora_spec",
    "engine_lora_spec", "fused_pair_problem", "pages_for_rows", "shape_of",
)
