"""A Hugging Face PEFT LoRA adapter -> TensorRT-LLM's ``lora_weights`` and ``lora_config`` request tensors.

The rules, as TensorRT-LLM applies them (``examples/hf_lora_convert.py`` and ``tensorrt_llm/lora_manager.py``
``LoraManager.load_from_hf``, NVIDIA/TensorRT-LLM; read, not copied):

* one row per (layer, module) that the adapter holds, ``lora_config`` row = [module id, layer, rank]
  (module ids: :data:`tensorrtllm_backend.lora.LORA_MODULE_IDS`; Hugging Face names mapped by
  ``get_default_trtllm_modules_to_hf_modules``: q_proj -> attn_q ... up_proj -> mlp_gate);
* the row of ``lora_weights`` is ``lora_A`` ([rank, in], "in" weights) flattened, then ``lora_B``
  ([out, rank], "out" weights) times the adapter's scale, flattened; rows shorter than the longest are
  padded with zeros (``[num_lora_modules_layers, D x Hi + Ho x D]``, the tensorrt_llm config.pbtxt);
* the scale is ``lora_alpha / rank``, or ``lora_alpha / sqrt(rank)`` with ``use_rslora`` (rank: the
  module's own, as load_from_hf's ``effective_rank``; that equals ``r`` unless ``rank_pattern`` says
  otherwise), so the backend applies ``x @ A.T @ (scale B).T`` with no scale of its own;
* the values have the model's dtype (runtime/loraUtils.cpp: "Expected lora weights to be the same data
  type as base model").

Before converting, the adapter is checked against what the engine serves (:class:`LoraSpec`), so that a
bad adapter fails here with what is wrong instead of in the executor (whose own checks,
loraUtils.cpp ``loraValidateRequestTensors``, are the same: layer in range, module enabled, rank at most
max_lora_rank) or, worse, silently: an adapter made for a model of other sizes, or one with a module the engine
lists but does not apply (one of the fused gated MLP's pair without the other: :attr:`LoraSpec.applied_modules`;
the executor takes such rows and the network ignores them).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from common.errors import LoraAdapterError
from cog_triton.streaming.client import LoraTensors
from tensorrtllm_backend.lora import (
    FUSED_MLP_PAIR,
    HF_TO_TRTLLM,
    LORA_MODULE_IDS,
    SUPPORTED_MODULES,
    TRTLLM_TO_HF,
    WIRE_DATATYPES,
    LoraSpec,
    fused_pair_problem,
)

log = logging.getLogger(__name__)

#: ``<anything>.layers.<i>.<self_attn|mlp|...>.<module>.lora_<A|B>[.<adapter name>].weight``: the keys
#: peft's save_pretrained writes (the same shape as lora_manager.py's HF_LORA_PATTERN for non-MoE modules).
_KEY_RE = re.compile(r"^(?:.*\.)?layers\.(\d+)\.(\w+)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")
#: PEFT's LoraConfig default lora_alpha (used when adapter_config.json has none).
PEFT_DEFAULT_ALPHA = 8
#: Most bytes of converted weights one request may carry (cog_triton.streaming.client.MAX_REQUEST_BYTES less headroom).
MAX_CONVERTED_BYTES = (1 << 30) - (16 << 20)


@dataclass(frozen=True, eq=False)
class ConvertedAdapter:
    """An adapter in TensorRT-LLM's form.

    Attributes:
        tensors: lora_weights / lora_config (rows sorted by layer, then module id).
        rank: the largest rank among its modules.
        modules: the TensorRT-LLM modules it touches. layers: how many layers it touches.
        scale: lora_alpha / r (or / sqrt(r)) of its config, folded into the "out" weights.
    """

    tensors: LoraTensors
    rank: int
    modules: tuple[str, ...]
    layers: int
    scale: float


def _fail(display: str, what: str) -> LoraAdapterError:
    return LoraAdapterError(f"lora_weights {display}: {what}")


def check_config(config: dict[str, Any], display: str) -> None:
    """Refuse adapter_config.json settings TensorRT-LLM's per-request LoRA cannot carry.

    Raises:
        LoraAdapterError: not a LoRA adapter (peft_type), DoRA, trained biases, fan_in_fan_out (Conv1D
            layers), modules_to_save (whole replaced layers such as lm_head), or alpha_pattern.
    """
    peft_type = str(config.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise _fail(display, f"adapter_config.json has peft_type {config.get('peft_type')!r}; only PEFT LoRA "
                    "adapters (peft_type LORA) are served")
    problems = []
    if config.get("use_dora"):
        problems.append("use_dora is true (DoRA needs a lora_config column the served tensorrt_llm model does not "
                        "take)")
    if config.get("bias", "none") not in ("none", None) or config.get("lora_bias"):
        problems.append(f"it trains biases (bias={config.get('bias')!r}, lora_bias={config.get('lora_bias')!r}); "
                        "TensorRT-LLM's LoRA has none")
    if config.get("fan_in_fan_out"):
        problems.append("fan_in_fan_out is true (Conv1D layers, as GPT-2's); only Linear projections are served")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save={config['modules_to_save']!r} replaces whole layers, which a per-request "
                        "adapter cannot; merge them into the base model instead")
    if config.get("alpha_pattern"):
        problems.append("alpha_pattern sets per-module scales, which this converter does not read")
    if problems:
        raise _fail(display, "this adapter cannot be served: " + "; ".join(problems))


def check_base_model(config: dict[str, Any], spec: LoraSpec, display: str) -> None:
    """Refuse an adapter made for another architecture: peft records the base model's class in
    ``auto_mapping.base_model_class`` (e.g. "MistralForCausalLM") when it knows it. A different
    ``base_model_name_or_path`` is only logged: it is often a local path or another copy of the same model,
    and the sizes, checked in :func:`convert`, catch a model of another shape.

    Raises:
        LoraAdapterError: naming both architectures.
    """
    mapping = config.get("auto_mapping") or {}
    made_for = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    if made_for and spec.architecture and made_for != spec.architecture:
        raise _fail(display, f"it was made for a {made_for} (adapter_config.json auto_mapping.base_model_class), but "
                    f"this model is a {spec.architecture}")
    name = str(config.get("base_model_name_or_path") or "")
    if name and spec.base_model and name != spec.base_model and "/" in name and not name.startswith(("/", ".")):
        log.warning("adapter %s was made from %s, this model from %s: serving it (its sizes match)", display, name,
                    spec.base_model)


def _ab_pairs(tensors: dict[str, Any], display: str) -> dict[tuple[int, str], dict[str, Any]]:
    pairs: dict[tuple[int, str], dict[str, Any]] = {}
    for key, value in tensors.items():
        match = _KEY_RE.match(key)
        if match is None:
            what = "a replaced layer (lm_head / embed_tokens)" if ("lm_head" in key or "embed_tokens" in key) else \
                "not a LoRA A/B weight of a decoder layer"
            raise _fail(display, f"adapter_model.safetensors holds {key!r}, {what}; it cannot be served")
        layer, _block, module, which = int(match.group(1)), match.group(2), match.group(3), match.group(4)
        pairs.setdefault((layer, module), {})[which] = value
    return pairs


def convert(config: dict[str, Any], weights: bytes, spec: LoraSpec, display: str) -> ConvertedAdapter:
    """Check the PEFT adapter (``config``: adapter_config.json; ``weights``: adapter_model.safetensors' bytes)
    against ``spec`` and convert it.

    Raises:
        LoraAdapterError: the engine serves no LoRA; not a LoRA adapter or unsupported settings
            (:func:`check_config`); unreadable safetensors; no LoRA weights; a module this image cannot convert
            or the engine does not apply (not built for it, or one of the fused gated MLP's pair built without the
            other); a layer beyond the model's; shapes of another model; a rank above max_lora_rank; converted
            weights over :data:`MAX_CONVERTED_BYTES`. Each names the value and the limit.
    """
    if not spec.enabled or spec.shape is None:
        raise _fail(display, f"this model cannot serve LoRA adapters: {spec.off_reason}")
    check_config(config, display)
    check_base_model(config, spec, display)
    from safetensors import SafetensorError  # noqa: PLC0415 - only when an adapter is converted
    from safetensors.torch import load  # noqa: PLC0415

    try:
        tensors = load(weights)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise _fail(display, f"adapter_model.safetensors is not a readable safetensors file ({exc})") from None
    pairs = _ab_pairs(tensors, display)
    if not pairs:
        raise _fail(display, "adapter_model.safetensors holds no LoRA weights")
    alpha = float(config.get("lora_alpha", PEFT_DEFAULT_ALPHA))
    rslora = bool(config.get("use_rslora", False))
    base = f" (base model {spec.base_model})" if spec.base_model else ""
    rows = [_row(layer, hf_module, ab, spec, alpha, rslora, base, display)
            for (layer, hf_module), ab in sorted(pairs.items())]
    return _pack(rows, spec, alpha, rslora, display)


def _row(layer: int, hf_module: str, ab: dict[str, Any], spec: LoraSpec, alpha: float, rslora: bool, base: str,
         display: str) -> tuple[int, int, int, Any]:
    """One adapted module of one layer, checked against ``spec``: (layer, module id, rank, its row: lora_A then
    lora_B times the adapter's scale, float32).

    Raises:
        LoraAdapterError: see :func:`convert`.
    """
    import torch  # noqa: PLC0415 - only when an adapter is converted

    shape = spec.shape
    assert shape is not None
    module = HF_TO_TRTLLM.get(hf_module)
    if module is None:
        supported = ", ".join(TRTLLM_TO_HF[m] for m in SUPPORTED_MODULES)
        raise _fail(display, f"it adapts {hf_module!r}, which this image cannot serve; supported modules: "
                    f"{supported}")
    if module not in spec.applied_modules:
        applied = ", ".join(f"{TRTLLM_TO_HF[m]} ({m})" for m in spec.applied_modules)
        if module in spec.unapplied_modules:
            raise _fail(display, f"it adapts {hf_module} ({module}), which the engine does not apply: its "
                        f"lora_target_modules have {fused_pair_problem(spec.target_modules)}. The engine applies "
                        f"LoRA to {applied} only; use an adapter of those modules, or rebuild the engine with "
                        f"both {' and '.join(FUSED_MLP_PAIR)} in lora.lora_target_modules")
        raise _fail(display, f"it adapts {hf_module} ({module}), but the engine applies LoRA to {applied} only "
                    "(its lora_target_modules); use an adapter of those modules, or rebuild the engine with "
                    f"{module} in lora.lora_target_modules")
    if set(ab) != {"A", "B"}:
        raise _fail(display, f"layer {layer} {hf_module} has lora_{''.join(sorted(ab))} without its partner")
    if layer >= shape.num_layers:
        raise _fail(display, f"it adapts layer {layer}, but the {spec.architecture or 'model'}{base} has "
                    f"{shape.num_layers} layers (0 to {shape.num_layers - 1}): it was made for another model")
    a, b = ab["A"], ab["B"]
    want_in, want_out = shape.module_dims(module)
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
        raise _fail(display, f"layer {layer} {hf_module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are "
                    "not a rank-r pair ([r, in] and [out, r])")
    rank = int(a.shape[0])
    if (a.shape[1], b.shape[0]) != (want_in, want_out):
        raise _fail(display, f"layer {layer} {hf_module} maps {a.shape[1]} -> {b.shape[0]} values, but this "
                    f"{spec.architecture or 'model'}{base} has {hf_module} {want_in} -> {want_out}: the adapter "
                    "was made for a model of other sizes")
    if rank > spec.max_rank:
        raise _fail(display, f"its rank r={rank} (layer {layer} {hf_module}) is above {spec.rank_limit} of "
                    f"{spec.max_rank}; use an adapter of rank <= {spec.max_rank}, or {spec.rank_fix}")
    if rank < 1:
        raise _fail(display, f"layer {layer} {hf_module} has rank 0")
    scale = alpha / (math.sqrt(rank) if rslora else rank)
    row = torch.cat([a.to(torch.float32).reshape(-1), (b.to(torch.float32) * scale).reshape(-1)])
    return layer, LORA_MODULE_IDS[module], rank, row


def _pack(rows: list[tuple[int, int, int, Any]], spec: LoraSpec, alpha: float, rslora: bool,
          display: str) -> ConvertedAdapter:
    """The rows as the C++ backend's ``lora_weights`` [rows, width] (the engine's dtype, zero-padded) and
    ``lora_config`` [rows, 3] (module id, layer, rank).

    Raises:
        LoraAdapterError: the converted weights are over :data:`MAX_CONVERTED_BYTES`.
    """
    import torch  # noqa: PLC0415 - only when an adapter is converted

    rows.sort(key=lambda r: (r[0], r[1]))
    width = max(int(r[3].numel()) for r in rows)
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[spec.dtype]
    matrix = torch.zeros((len(rows), width), dtype=torch.float32)
    for index, (_, _, _, row) in enumerate(rows):
        matrix[index, : row.numel()] = row
    weights_bytes = matrix.to(dtype).contiguous().view(torch.uint8).numpy().tobytes()
    if len(weights_bytes) > MAX_CONVERTED_BYTES:
        raise _fail(display, f"its converted weights take {len(weights_bytes)} bytes, more than one request may carry "
                    f"({MAX_CONVERTED_BYTES} bytes)")
    config_rows = torch.tensor([[module_id, layer, rank] for layer, module_id, rank, _ in rows], dtype=torch.int32)
    tensors_out = LoraTensors(
        datatype=WIRE_DATATYPES[spec.dtype], rows=len(rows), width=width, weights=weights_bytes,
        config=config_rows.contiguous().numpy().tobytes(),
    )
    modules = tuple(m for m in SUPPORTED_MODULES if LORA_MODULE_IDS[m] in {r[1] for r in rows})
    scales = {alpha / (math.sqrt(r[2]) if rslora else r[2]) for r in rows}
    return ConvertedAdapter(
        tensors=tensors_out, rank=max(r[2] for r in rows), modules=modules, layers=len({r[0] for r in rows}),
        scale=scales.pop() if len(scales) == 1 else float("nan"),
    )


__all__ = ("ConvertedAdapter", "MAX_CONVERTED_BYTES", "check_base_model", "check_config", "convert")
