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

Reading ``adapter_model.safetensors`` costs what the adapter can be, never what its file claims: the file is no
larger than the largest adapter the model serves (:meth:`LoraSpec.largest_adapter_file_bytes`, checked from its
size on disk before it is opened), its header no longer than such an adapter's (checked from its first 8 bytes),
and every tensor's name, dtype and shape are checked against the model from the header alone
(``safetensors.safe_open``, which maps the file and validates its header: offsets contiguous and covering the file,
sizes matching shapes; huggingface/safetensors ``safetensors/src/tensor.rs`` ``Metadata::validate``) before any of
its data is read. The data is then read a module at a time into the converted rows, which are written straight
into the request's bytes (:class:`io.BytesIO`, whose ``getvalue`` hands over its buffer without a copy), and the
file is mapped again every :data:`REMAP_BYTES` so that the pages read do not pile up in the process's memory. A
stream process's peak while converting is about the converted tensors plus :data:`REMAP_BYTES` (measured in
tests/test_lora_limits_integration.py), where reading the file whole and ``safetensors.torch.load`` held about
2.3 times the file and then the converted copies.
"""

from __future__ import annotations

import io
import logging
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from common.errors import LoraAdapterError
from cog_triton.streaming.client import LoraTensors
from cog_triton.streaming.lora.peft_config import check_values, cut, shown
from tensorrtllm_backend.lora import (
    DTYPE_BYTES,
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
#: The adapter file is mapped again after this many bytes of its tensors were read (the module docstring).
REMAP_BYTES = 16 << 20
#: safetensors dtypes (their names in the header) an adapter's weights may have: the floats, converted to float32 with
#: no loss before the scale is applied (TensorRT-LLM's load_from_hf takes any dtype torch can multiply, then casts
#: to the model's: lora_manager.py @ 007e181b).
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


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


@dataclass(frozen=True)
class _Module:
    """One adapted module of one layer, as the file's header describes it (nothing read yet).

    Attributes:
        layer / hf_module / module: where it applies (the Hugging Face and TensorRT-LLM names of the module).
        a_key / b_key: its lora_A [rank, in] and lora_B [out, rank] tensors' names in the file.
        rank / in_dim / out_dim: its sizes (values); nbytes: its two tensors' bytes in the file.
    """

    layer: int
    hf_module: str
    module: str
    a_key: str
    b_key: str
    rank: int
    in_dim: int
    out_dim: int
    nbytes: int

    @property
    def values(self) -> int:
        """Values of its row: lora_A's then lora_B's."""
        return self.rank * (self.in_dim + self.out_dim)


def _fail(display: str, what: str) -> LoraAdapterError:
    return LoraAdapterError(f"lora_weights {display}: {what}")


def check_config(config: dict[str, Any], display: str) -> None:
    """Refuse adapter_config.json settings TensorRT-LLM's per-request LoRA cannot carry, after checking its values as
    data (:func:`cog_triton.streaming.lora.peft_config.check_values`).

    Raises:
        LoraAdapterError: a field of the wrong type or out of range; not a LoRA adapter (peft_type), DoRA, trained
            biases, fan_in_fan_out (Conv1D layers), modules_to_save (whole replaced layers such as lm_head),
            alpha_pattern, layer_replication (layers repeated by index) or alora_invocation_tokens (an adapter
            applied only after given tokens).
    """
    check_values(config, display)
    peft_type = str(config.get("peft_type") or "").upper()
    if peft_type != "LORA":
        raise _fail(display, f"adapter_config.json has peft_type {shown(config.get('peft_type'))}; only PEFT LoRA "
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
        problems.append(f"modules_to_save={shown(config['modules_to_save'])} replaces whole layers, which a "
                        "per-request adapter cannot; merge them into the base model instead")
    if config.get("alpha_pattern"):
        problems.append("alpha_pattern sets per-module scales, which this converter does not read")
    if config.get("layer_replication"):
        problems.append("layer_replication repeats layers of the base model, which the served model does not")
    if config.get("alora_invocation_tokens"):
        problems.append("alora_invocation_tokens makes it an activated LoRA, applied only after those tokens, which "
                        "TensorRT-LLM's LoRA cannot do (it would apply it to every token)")
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
        raise _fail(display, f"it was made for a {cut(str(made_for))} (adapter_config.json "
                    f"auto_mapping.base_model_class), but this model is a {spec.architecture}")
    name = str(config.get("base_model_name_or_path") or "")
    if name and spec.base_model and name != spec.base_model and "/" in name and not name.startswith(("/", ".")):
        log.warning("adapter %s was made from %s, this model from %s: serving it (its sizes match)", display,
                    cut(name), spec.base_model)


def _unreadable(display: str, detail: object) -> LoraAdapterError:
    return _fail(display, f"adapter_model.safetensors is not a readable safetensors file ({detail})")


def read_header(path: Path, spec: LoraSpec, display: str) -> list[_Module]:
    """The adapted modules of the adapter file ``path``, checked against ``spec`` from the file's size and header
    alone, sorted by layer then module id (the rows' order); no tensor data is read.

    Raises:
        LoraAdapterError: the file is larger than the largest adapter the model serves, its header longer than such
            an adapter's, it is not a readable safetensors file, it holds no LoRA weights, or a tensor is not one the
            model serves (see :func:`convert`); each names the value and the limit.
    """
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 - only when an adapter is converted

    size = path.stat().st_size
    largest = spec.largest_adapter_file_bytes()
    if size > largest:
        raise _fail(display, f"adapter_model.safetensors has {size} bytes, more than the largest adapter this "
                    f"model serves ({spec.describe_largest_adapter()}); it was made for a larger model, a larger rank "
                    f"than {spec.max_rank}, or holds more than LoRA weights")
    with open(path, "rb") as fh:
        head = fh.read(8)
    if len(head) < 8:
        raise _unreadable(display, f"{len(head)} bytes, shorter than its 8-byte header length")
    (header_bytes,) = struct.unpack("<Q", head)
    if header_bytes > size - 8:
        raise _unreadable(display, f"its first 8 bytes give a header of {header_bytes} bytes, longer than the file")
    if header_bytes > spec.largest_header_bytes():
        raise _fail(display, f"adapter_model.safetensors has a header of {header_bytes} bytes, more than the "
                    f"{spec.largest_header_bytes()} bytes an adapter of this model needs (at most "
                    f"{spec.largest_adapter_tensors()} tensors)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            infos = {key: (handle.get_slice(key).get_dtype(), list(handle.get_slice(key).get_shape()))
                     for key in handle.keys()}
    except (SafetensorError, ValueError, RuntimeError, OSError) as exc:
        raise _unreadable(display, cut(str(exc))) from None
    pairs: dict[tuple[int, str], dict[str, str]] = {}
    for key in sorted(infos):
        match = _KEY_RE.match(key)
        if match is None:
            what = "a replaced layer (lm_head / embed_tokens)" if ("lm_head" in key or "embed_tokens" in key) else \
                "not a LoRA A/B weight of a decoder layer"
            raise _fail(display, f"adapter_model.safetensors holds {shown(key)}, {what}; it cannot be served")
        layer, module, which = int(match.group(1)), match.group(3), match.group(4)
        pair = pairs.setdefault((layer, module), {})
        if which in pair:
            raise _fail(display, f"adapter_model.safetensors holds two lora_{which} weights for layer {layer} "
                        f"{module} ({shown(pair[which])} and {shown(key)}); an adapter has one of each")
        pair[which] = key
    if not pairs:
        raise _fail(display, "adapter_model.safetensors holds no LoRA weights")
    modules = [_checked_module(layer, hf_module, keys, infos, spec, display)
               for (layer, hf_module), keys in sorted(pairs.items())]
    modules.sort(key=lambda m: (m.layer, LORA_MODULE_IDS[m.module]))
    return modules


def _checked_module(layer: int, hf_module: str, keys: dict[str, str], infos: dict[str, tuple[str, list[int]]],
                    spec: LoraSpec, display: str) -> _Module:
    """One adapted module of one layer, checked against ``spec`` from its tensors' dtypes and shapes.

    Raises:
        LoraAdapterError: see :func:`convert`.
    """
    shape = spec.shape
    assert shape is not None
    base = f" (base model {spec.base_model})" if spec.base_model else ""
    module = HF_TO_TRTLLM.get(hf_module)
    if module is None:
        supported = ", ".join(TRTLLM_TO_HF[m] for m in SUPPORTED_MODULES)
        raise _fail(display, f"it adapts {shown(hf_module)}, which this image cannot serve; supported modules: "
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
    if set(keys) != {"A", "B"}:
        raise _fail(display, f"layer {layer} {hf_module} has lora_{''.join(sorted(keys))} without its partner")
    if layer >= shape.num_layers:
        raise _fail(display, f"it adapts layer {layer}, but the {spec.architecture or 'model'}{base} has "
                    f"{shape.num_layers} layers (0 to {shape.num_layers - 1}): it was made for another model")
    (a_dtype, a_shape), (b_dtype, b_shape) = infos[keys["A"]], infos[keys["B"]]
    want_in, want_out = shape.module_dims(module)
    if len(a_shape) != 2 or len(b_shape) != 2 or a_shape[0] != b_shape[1]:
        raise _fail(display, f"layer {layer} {hf_module}: lora_A {a_shape} and lora_B {b_shape} are "
                    "not a rank-r pair ([r, in] and [out, r])")
    rank = int(a_shape[0])
    if (a_shape[1], b_shape[0]) != (want_in, want_out):
        raise _fail(display, f"layer {layer} {hf_module} maps {a_shape[1]} -> {b_shape[0]} values, but this "
                    f"{spec.architecture or 'model'}{base} has {hf_module} {want_in} -> {want_out}: the adapter "
                    "was made for a model of other sizes")
    if rank > spec.max_rank:
        raise _fail(display, f"its rank r={rank} (layer {layer} {hf_module}) is above {spec.rank_limit} of "
                    f"{spec.max_rank}; use an adapter of rank <= {spec.max_rank}, or {spec.rank_fix}")
    if rank < 1:
        raise _fail(display, f"layer {layer} {hf_module} has rank 0")
    for which, dtype in (("A", a_dtype), ("B", b_dtype)):
        if dtype not in FLOAT_DTYPES:
            raise _fail(display, f"layer {layer} {hf_module} lora_{which} is stored as {cut(str(dtype))}; LoRA "
                        f"weights are floats ({', '.join(FLOAT_DTYPES)})")
    item = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
    nbytes = rank * want_in * item[a_dtype] + want_out * rank * item[b_dtype]
    return _Module(layer, hf_module, module, keys["A"], keys["B"], rank, want_in, want_out, nbytes)


def convert(config: dict[str, Any], weights: Path, spec: LoraSpec, display: str) -> ConvertedAdapter:
    """Check the PEFT adapter (``config``: adapter_config.json as parsed; ``weights``: the path of its
    adapter_model.safetensors) against ``spec`` and convert it, reading the file's header before any of its data
    (the module docstring).

    Raises:
        LoraAdapterError: the engine serves no LoRA; a config value of the wrong type or out of range, not a LoRA
            adapter or unsupported settings (:func:`check_config`); the file larger than the largest adapter the
            model serves or its header longer than such an adapter's; unreadable safetensors; no LoRA weights; a
            tensor twice; a module this image cannot convert or the engine does not apply (not built for it, or one
            of the fused gated MLP's pair built without the other); a layer beyond the model's; shapes of another
            model; a rank above max_lora_rank; weights that are not floats; converted weights over
            :data:`MAX_CONVERTED_BYTES`; values that are not finite once scaled in the model's dtype. Each names the
            value and the limit.
    """
    if not spec.enabled or spec.shape is None:
        raise _fail(display, f"this model cannot serve LoRA adapters: {spec.off_reason}")
    check_config(config, display)
    check_base_model(config, spec, display)
    modules = read_header(weights, spec, display)
    alpha = float(config["lora_alpha"]) if config.get("lora_alpha") is not None else float(PEFT_DEFAULT_ALPHA)
    rslora = bool(config.get("use_rslora") or False)
    width = max(m.values for m in modules)
    converted_bytes = len(modules) * width * DTYPE_BYTES[spec.dtype]
    if converted_bytes > MAX_CONVERTED_BYTES:
        raise _fail(display, f"its converted weights take {converted_bytes} bytes, more than one request may carry "
                    f"({MAX_CONVERTED_BYTES} bytes)")
    weights_bytes = _rows(weights, modules, width, spec.dtype, alpha, rslora, display)
    import torch  # noqa: PLC0415 - only when an adapter is converted

    config_rows = torch.tensor([[LORA_MODULE_IDS[m.module], m.layer, m.rank] for m in modules], dtype=torch.int32)
    tensors_out = LoraTensors(
        datatype=WIRE_DATATYPES[spec.dtype], rows=len(modules), width=width, weights=weights_bytes,
        config=config_rows.contiguous().numpy().tobytes(),
    )
    used = {m.module for m in modules}
    scales = {_scale(alpha, m.rank, rslora) for m in modules}
    return ConvertedAdapter(
        tensors=tensors_out, rank=max(m.rank for m in modules),
        modules=tuple(m for m in SUPPORTED_MODULES if m in used), layers=len({m.layer for m in modules}),
        scale=scales.pop() if len(scales) == 1 else float("nan"),
    )


def _scale(alpha: float, rank: int, rslora: bool) -> float:
    """lora_alpha / r, or / sqrt(r) with rsLoRA (the module's own rank: load_from_hf's effective_rank)."""
    return alpha / (math.sqrt(rank) if rslora else rank)


def _batches(modules: list[_Module]) -> Iterator[list[_Module]]:
    """``modules`` in order, in runs of at most :data:`REMAP_BYTES` of file data (at least one module each)."""
    batch: list[_Module] = []
    held = 0
    for module in modules:
        if batch and held + module.nbytes > REMAP_BYTES:
            yield batch
            batch, held = [], 0
        batch.append(module)
        held += module.nbytes
    if batch:
        yield batch


def _rows(path: Path, modules: list[_Module], width: int, dtype: str, alpha: float, rslora: bool,
          display: str) -> bytes:
    """The ``lora_weights`` tensor's bytes, [rows, width] in ``dtype`` (zero-padded rows: lora_A flattened, then
    lora_B times the module's scale, flattened), read a module at a time from ``path`` (header checked by
    :func:`read_header`) and written straight into the result.

    The arithmetic and checks are numpy's on float32 rows (torch only reads the file and casts to float16 or
    bfloat16): torch's reductions and concatenation on a 135k-value row took 19 and 8 ms each with two intra-op
    threads on a busy 2-core machine (8 s for a rank-64 SmolLM2 adapter), numpy's well under 1 ms.

    Raises:
        LoraAdapterError: the file changed since its header was read, or a row holds a value that is not finite in
            ``dtype`` (NaN or infinity in the file, or beyond ``dtype``'s range once scaled).
    """
    import numpy as np  # noqa: PLC0415 - only when an adapter is converted
    import torch  # noqa: PLC0415
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415

    wire = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    largest = float(torch.finfo(wire).max)
    item = DTYPE_BYTES[dtype]
    zeros = memoryview(bytes((width - min(m.values for m in modules)) * item))
    out = io.BytesIO()
    try:
        for batch in _batches(modules):
            with safe_open(str(path), framework="pt") as handle:
                for module in batch:
                    a = handle.get_tensor(module.a_key).to(torch.float32).numpy()
                    b = handle.get_tensor(module.b_key).to(torch.float32).numpy()
                    if a.shape != (module.rank, module.in_dim) or b.shape != (module.out_dim, module.rank):
                        raise _unreadable(display, "it changed while it was read")
                    scale = _scale(alpha, module.rank, rslora)
                    row = np.empty(module.values, dtype=np.float32)
                    row[: a.size] = a.reshape(-1)
                    np.multiply(b.reshape(-1), np.float32(scale), out=row[a.size:])
                    del a, b
                    if not (np.isfinite(row).all() and float(np.abs(row).max()) <= largest):
                        raise _fail(display, f"layer {module.layer} {module.hf_module} holds values that are not "
                                    f"finite in {dtype} once lora_B is scaled by {scale:g} (lora_alpha {alpha:g} / "
                                    f"{'sqrt(r)' if rslora else 'r'}, r={module.rank}): NaN or infinity in "
                                    "adapter_model.safetensors, or too large a lora_alpha")
                    out.write(row if wire == torch.float32 else
                              torch.from_numpy(row).to(wire).view(torch.uint8).numpy())
                    out.write(zeros[: (width - module.values) * item])
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise _unreadable(display, cut(str(exc))) from None
    return out.getvalue()  # the buffer itself, not a copy (CPython's BytesIO hands it over when no view holds it)


__all__ = ("ConvertedAdapter", "FLOAT_DTYPES", "MAX_CONVERTED_BYTES", "REMAP_BYTES", "check_base_model",
           "check_config", "convert", "read_header")
