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
* **Host LoRA cache size**: ``peftCacheManager.cpp`` ``getPageManagerConfig``: one adapter of the maximum
  size takes ``max adapter size x sum over modules of (in + out) x layers`` values; the host cache
  (``lora_cache_host_memory_bytes``, default 1 GiB: ``PeftCacheManagerConfig``) holds that many bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

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
#: Bytes per value of each LoRA weights dtype, and the Triton / protocol names of the dtype.
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
TRITON_DATATYPES = {"float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float32": "TYPE_FP32"}
WIRE_DATATYPES = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32"}
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

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


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
    rank_limit: str = "the engine's max_lora_rank"
    rank_fix: str = "rebuild the engine with a larger lora.max_lora_rank"

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

    def host_cache_bytes(self) -> int:
        """Bytes for ``max_loras`` adapters of the maximum size (getPageManagerConfig's maxLoraSize x dtype size)."""
        return self.max_loras * self.adapter_values() * DTYPE_BYTES.get(self.dtype, 2)

    def describe(self) -> str:
        if not self.enabled:
            return f"LoRA off ({self.off_reason})"
        return (
            f"LoRA on: max_lora_rank {self.max_rank}, modules {', '.join(self.target_modules)}, weights "
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
    reads it). Never raises: an unreadable section gives a spec that is off, with the reason."""
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
    return LoraSpec(True, dtype=dtype, max_rank=max_rank, target_modules=modules, shape=shape, architecture=arch)


def checkpoint_lora_spec(hf_config: Mapping[str, Any], build_lora: Optional[Mapping[str, Any]],
                         peft_available: bool, base_model: str = "") -> LoraSpec:
    """The LoRA support of a Hugging Face checkpoint served by the CPU reference model.

    ``build_lora``: the ``lora`` section of the archive's build config (manifest.json), or None for the
    defaults (every supported module, max rank :data:`DEFAULT_MAX_LORA_RANK`); ``{"enabled": false}``-like
    sections are not used: a build config without ``lora`` uses the defaults. The reference model runs in
    float32, so its lora_weights are float32 (the model's dtype, as loraUtils.cpp requires).
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


__all__ = (
    "DEFAULT_MAX_LORA_RANK", "DEFAULT_MAX_LORAS", "HF_TO_TRTLLM", "LORA_MODULE_IDS", "LoraSpec", "ModelShape",
    "SUPPORTED_MODULES", "TRTLLM_TO_HF", "checkpoint_lora_spec", "engine_lora_spec", "shape_of",
)
