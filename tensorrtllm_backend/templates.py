"""Filling the model-repository templates and validating them as Triton ``ModelConfig`` protobufs.

Our tested replacement for tensorrtllm_backend's ``tools/fill_template.py``: placeholders are
Python ``string.Template`` ``${name}`` fields; every filled ``config.pbtxt`` is parsed into
``inference.ModelConfig`` (``tritonclient.grpc.model_config_pb2``), so a config Triton would reject
("Expected integer, got: $") fails here first, naming the file and line. Parameters whose value is
empty are removed from the rendered config, so the backend applies its own default rather than
failing to parse an empty string, except :data:`REQUIRED_TENSORRT_LLM_PARAMETERS`, which the C++
backend reads without a default: those stay, empty meaning "off".

Template folders -> live model names:
    ensemble_ids, preprocessing                                -> same name
    ensemble (text in, text out; RenderOptions.text_ensemble)  -> same name, its inputs cut to what tensorrt_llm takes
    tensorrt_llm            (C++ backend, engine weights)      -> tensorrt_llm
    tensorrt_llm_reference  (CPU reference, HF checkpoint)     -> tensorrt_llm
    tensorrt_llm_pytorch    (PyTorch backend over the LLM API, HF checkpoint with ``RenderOptions.llm_args``)
                                                               -> tensorrt_llm, the LLM's arguments in 1/llm_args.json

Why one module: one concern, turning settings and the weights' facts into the rendered
model repository. The three ``tensorrt_llm`` implementations share the ensemble, the placeholders, the
guided-decoding and LoRA parameters and the validation; splitting them would spread one renderer's rules.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import string
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Optional

from google.protobuf import text_format

from common.errors import TemplateError
from tensorrtllm_backend.engine import XGRAMMAR_TOKENIZER_INFO_NAME, WeightsInfo
from tensorrtllm_backend.lora import TRITON_DATATYPES, spec_to_parameters

log = logging.getLogger(__name__)

MODEL_CONFIG_PB2 = "tritonclient.grpc.model_config_pb2"


def _model_config_pb2() -> ModuleType:
    """tritonclient's generated ``inference.ModelConfig`` protobuf module (it imports only google.protobuf), loaded
    from its file without running ``tritonclient.grpc``'s ``__init__``, which imports grpc and the whole gRPC client:
    the Cog worker renders the model repository and never talks gRPC, so it does not load them (the stream processes
    do). Under its own name in ``sys.modules``, so a later ``import tritonclient.grpc`` finds and keeps this one (the
    protobuf descriptors are registered once)."""
    module = sys.modules.get(MODEL_CONFIG_PB2)
    if module is not None:
        return module
    package = importlib.util.find_spec("tritonclient")
    if package is None or not package.submodule_search_locations:
        raise ImportError("tritonclient is not installed (requirements.txt): the model repository's configs are its "
                          "ModelConfig protobuf")
    path = Path(list(package.submodule_search_locations)[0]) / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location(MODEL_CONFIG_PB2, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODEL_CONFIG_PB2] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODEL_CONFIG_PB2]
        raise
    return module


model_config_pb2 = _model_config_pb2()

# Parameters the TensorRT-LLM C++ backend reads with ModelState::GetParameter and no try/catch or
# default, so a config without the key fails to load with "unexpected error when creating
# modelInstanceState: Cannot find parameter with name: <key>" (triton_backend/inflight_batcher_llm/src/
# model_state.cc GetParameter; model_instance_state.cc, the functions named below: 1.1 @c8c6df08, the
# same four in 1.2.0rc8 @0c8de69a, the nearest stored version to 1.2.1; tensorrtllm_backend r25.05 too).
# They are rendered even when empty; for the guided-decoding ones an empty value means "off"
# (getGuidedDecodingConfigFromParams returns no config when guided_decoding_backend or
# xgrammar_tokenizer_info_path is empty).
REQUIRED_TENSORRT_LLM_PARAMETERS: dict[str, str] = {
    "gpt_model_type": "ModelInstanceState::getBatchingTypeFromParams",
    "tokenizer_dir": "ModelInstanceState::getGuidedDecodingConfigFromParams",
    "xgrammar_tokenizer_info_path": "ModelInstanceState::getGuidedDecodingConfigFromParams",
    "guided_decoding_backend": "ModelInstanceState::getGuidedDecodingConfigFromParams",
}
# The only guided_decoding_backend the C++ backend accepts (1.1, and 1.2.0rc8 @0c8de69a); any other value
# throws at load ("Guided decoding is currently supported with 'xgrammar' backend ...", the same function).
GUIDED_DECODING_BACKENDS = ("xgrammar",)
# Keys getGuidedDecodingConfigFromParams reads from the tokenizer info file, all unconditionally (a file
# without one fails the model load); TensorRT-LLM's _xgrammar_tokenizer_info writes them for fast tokenizers.
XGRAMMAR_TOKENIZER_INFO_KEYS = ("encoded_vocab", "tokenizer_str", "stop_token_ids")

# Parameters of the C++ tensorrt_llm model (TensorRT-LLM 1.2.1) that we do not set by default:
# empty means "not set" and the rendered config omits them. COG_TRITON_TENSORRT_LLM_PARAMETERS
# may set any of them. enable_trt_overlap is new in 1.2: 1.1 read it only to warn that it is ignored
# (model_instance_state.cc @c8c6df08); 1.2 reads it as a bool, default false, into
# ExecutorConfig::setEnableTrtOverlap (@0c8de69a, 1.2.0rc8; NVIDIA/TensorRT-LLM PR #10018).
OPTIONAL_TENSORRT_LLM_PARAMETERS = (
    "encoder_engine_dir",
    "max_attention_window_size",
    "sink_token_length",
    "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "cancellation_check_period_ms",
    "stats_check_period_ms",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "normalize_log_probs",
    "participant_ids",
    "num_nodes",
    "lora_cache_optimal_adapter_size",
    "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
    "lora_prefetch_dir",
    "decoding_mode",
    "lookahead_window_size",
    "lookahead_ngram_size",
    "lookahead_verification_set_size",
    "medusa_choices",
    "eagle_choices",
    "gpu_weights_percent",
    "enable_context_fmha_fp32_acc",
    "multi_block_mode",
    "cuda_graph_mode",
    "cuda_graph_cache_size",
    "speculative_decoding_fast_logits",
    "enable_trt_overlap",
)

PYTHON_MODELS = ("preprocessing", "ensemble", "tensorrt_llm_reference", "tensorrt_llm_pytorch")
#: The code a Python model shares with another, kept in one place and copied into its version folder beside the
#: folder's own ``1/*.py`` when the repository is rendered (:func:`copy_model_code`): template folder -> files
#: relative to the template directory (the CPU reference model's, which the PyTorch-backend model reuses).
SHARED_MODEL_CODE: dict[str, tuple[str, ...]] = {
    "tensorrt_llm_pytorch": ("tensorrt_llm_reference/1/lora.py", "tensorrt_llm_reference/1/parsing.py",
                             "tensorrt_llm_reference/1/triton_glue.py"),
}
#: Modules of this package a Python model imports too, copied the same way: template folder -> file names here
#: (``samplers.py``: what each sampler applies, which the predictor checks before a request reaches the model).
PACKAGE_MODEL_CODE: dict[str, tuple[str, ...]] = {"tensorrt_llm_pytorch": ("samplers.py",)}


def placeholders(text: str) -> set[str]:
    """Names of the ``${name}`` / ``$name`` placeholders in ``text``."""
    names = set()
    for match in string.Template.pattern.finditer(text):
        name = match.group("named") or match.group("braced")
        if name:
            names.add(name)
    return names


def format_value(value: object) -> str:
    """Render a typed value for a template: bools as true/false, None as "", enums by value."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    return str(value)


def fill_template(
    text: str,
    values: Mapping[str, object],
    *,
    source: str,
    allow_unfilled: bool = False,
    allow_unknown: bool = False,
) -> str:
    """Substitute ``values`` into the template ``text``.

    Args:
        text: template contents.
        values: placeholder name -> value (formatted with :func:`format_value`).
        source: file name used in error messages.
        allow_unfilled: leave placeholders without a value in place (upstream fill_template
            behaviour) instead of failing.
        allow_unknown: accept values for names the template does not contain.

    Raises:
        TemplateError: a placeholder has no value, a value names no placeholder, or the
            template has a malformed ``$`` (message names ``source``, the line and the key).
    """
    names = placeholders(text)
    unknown = sorted(set(values) - names)
    if unknown and not allow_unknown:
        raise TemplateError(f"{source}: no placeholder named {', '.join(unknown)} (placeholders: {', '.join(sorted(names))})")
    missing = sorted(names - set(values))
    if missing and not allow_unfilled:
        raise TemplateError(f"{source}: placeholder(s) left unfilled: {', '.join('${' + m + '}' for m in missing)}")
    template = string.Template(text)
    # Values land inside pbtxt string literals or numeric fields: escape what would end or
    # change a string literal (a Windows-style path or a quote in a path).
    mapping = {k: format_value(v).replace("\\", "\\\\").replace('"', '\\"') for k, v in values.items()}
    try:
        return template.safe_substitute(mapping) if allow_unfilled else template.substitute(mapping)
    except ValueError as exc:  # "Invalid placeholder in string: line N, col M"
        raise TemplateError(f"{source}: {exc}") from None


def parse_model_config(text: str, *, source: str) -> model_config_pb2.ModelConfig:
    """Parse pbtxt ``text`` into Triton's ``inference.ModelConfig``.

    Raises:
        TemplateError: not a valid ModelConfig; carries the protobuf parse error (line:column).
    """
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise TemplateError(f"{source}: invalid Triton model config: {exc}") from None
    if not config.name:
        raise TemplateError(f"{source}: model config has no name")
    if not config.backend and not config.platform:
        raise TemplateError(f"{source}: model config sets neither backend nor platform")
    return config


def drop_empty_parameters(config: model_config_pb2.ModelConfig, keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove parameters whose string_value is empty, except those in ``keep``; return their keys (sorted)."""
    empty = sorted(k for k, v in config.parameters.items() if v.string_value == "" and k not in keep)
    for key in empty:
        del config.parameters[key]
    return empty


def parse_key_values(spec: str, *, what: str) -> dict[str, str]:
    """Parse ``key:value,key:value`` (``\\,`` for a literal comma) into a dict.

    Raises:
        TemplateError: an item without ``:`` or an empty key (names ``what`` and the item).
    """
    result: dict[str, str] = {}
    if not spec.strip():
        return result
    items, current, escaped = [], "", False
    for char in spec:
        if escaped:
            current += char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    for item in items:
        if not item.strip():
            continue
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise TemplateError(f"{what}: {item!r} is not key:value")
        result[key.strip()] = value
    return result


@dataclass(frozen=True)
class RenderOptions:
    """Typed values that, with the weights' metadata, determine every placeholder.

    All fields mirror :class:`cog_triton.settings.Settings`; see README.md "Settings".
    """

    template_dir: Path
    model_repo_dir: Path
    triton_max_batch_size: Optional[int] = None
    decoupled: bool = True
    max_queue_delay_microseconds: int = 0
    batching_strategy: str = "inflight_fused_batching"
    batch_scheduler_policy: str = "guaranteed_no_evict"
    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_tokens_in_paged_kv_cache: Optional[int] = None
    enable_kv_cache_reuse: bool = True
    enable_chunked_context: bool = False
    gpu_device_ids: Optional[str] = None
    preprocessing_instance_count: int = 1
    #: Render ``ensemble``, the text model of TensorRT-LLM's ensemble contract (triton_model_repo/ensemble).
    text_ensemble: bool = True
    add_special_tokens: bool = True
    reference_torch_threads: int = 0
    tensorrt_llm_parameters: str = ""
    guided_decoding: bool = True
    lora_cache_optimal_adapter_size: Optional[int] = None
    lora_cache_max_adapter_size: Optional[int] = None
    lora_cache_gpu_memory_fraction: Optional[float] = None
    lora_cache_host_memory_bytes: Optional[int] = None
    #: The PyTorch backend's LLM arguments (``tensorrt_llm.LLM`` keywords, JSON values): with a Hugging Face
    #: checkpoint, ``tensorrt_llm`` is then the PyTorch-backend model (``tensorrt_llm_pytorch``) and this dict its
    #: ``1/llm_args.json`` (:func:`write_llm_args`). None: the CPU reference model serves a checkpoint.
    llm_args: Optional[Mapping[str, Any]] = None
    #: The PyTorch-backend model's bound on the distinct LoRA adapters one LLM is given (0 or None: none), and the
    #: folder of its adapter snapshots (None: a temporary folder of the model's); see its ``adapters.py``.
    max_adapters_per_llm: Optional[int] = None
    adapter_snapshot_dir: Optional[str] = None
    #: The PyTorch-backend model serves images (its ``images`` parameter): the checkpoint's architecture takes them
    #: in TensorRT-LLM 1.2.1 and they are on (cog_triton.worker.planning decides).
    images: bool = False


def lora_cache_values(options: RenderOptions, info: WeightsInfo) -> dict[str, object]:
    """The C++ backend's ``lora_cache_*`` parameters (model_instance_state.cc getPeftCacheConfigFromParams;
    its defaults: optimal adapter size 8, max adapter size 64, GPU fraction 0.05, host 1 GiB).

    Each setting that is set wins. For an engine with LoRA, the defaults are: max adapter size = the
    engine's max_lora_rank (pages fit any adapter it takes), and host bytes = room for ``max_loras`` adapters of
    the maximum size in whole pages of the backend's cache, with the optimal and maximum adapter sizes rendered
    here (:meth:`tensorrtllm_backend.lora.LoraSpec.host_cache_bytes`). Without LoRA nothing is set.

    Raises:
        TemplateError: COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES below the backend's minimum for the engine (it
            would stop at start-up with "Not enough space allocated to host LoRA cache to hold 1 max sized LoRA",
            peftCacheManager.cpp getPageManagerConfig), naming the minimum.
    """
    lora = info.lora
    values: dict[str, object] = {
        "lora_cache_optimal_adapter_size": options.lora_cache_optimal_adapter_size,
        "lora_cache_max_adapter_size": options.lora_cache_max_adapter_size,
        "lora_cache_gpu_memory_fraction": options.lora_cache_gpu_memory_fraction,
        "lora_cache_host_memory_bytes": options.lora_cache_host_memory_bytes,
    }
    if lora.enabled:
        max_adapter_size = options.lora_cache_max_adapter_size or lora.max_rank
        values["lora_cache_max_adapter_size"] = max_adapter_size
        sizes = (options.lora_cache_optimal_adapter_size, max_adapter_size)
        host = options.lora_cache_host_memory_bytes
        if host is None:
            values["lora_cache_host_memory_bytes"] = lora.host_cache_bytes(*sizes)
        elif lora.paged_cache and not lora.cache_pages(*sizes).accepts(host):
            pages = lora.cache_pages(*sizes)
            raise TemplateError(
                f"COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES={host} is below the {pages.min_slots * pages.slot_bytes} "
                "bytes the TensorRT-LLM backend needs for one adapter of the engine's maximum size (it would stop at "
                "start-up: \"Not enough space allocated to host LoRA cache to hold 1 max sized LoRA\"); set at least "
                f"that, or leave it unset for room for {lora.max_loras} adapters "
                f"({lora.host_cache_bytes(*sizes)} bytes)"
            )
    return values


def lora_weights_datatype(info: WeightsInfo) -> str:
    """The ``lora_weights`` data_type: the served model's dtype (float32 for the CPU reference model)."""
    if info.kind != "engine":
        return "TYPE_FP32"
    return TRITON_DATATYPES.get(info.lora.dtype if info.lora.enabled else info.dtype, "TYPE_FP16")


def template_values(options: RenderOptions, info: WeightsInfo) -> dict[str, dict[str, object]]:
    """Placeholder values for each template folder (see module docstring for the folders).

    Raises:
        TemplateError: COG_TRITON_TENSORRT_LLM_PARAMETERS names an unknown parameter, or sets
            guided decoding in a way the backend would ignore or refuse (:func:`check_guided_decoding`).
    """
    batch = options.triton_max_batch_size or info.limits.max_batch_size
    tokenizer = str(info.tokenizer_dir)
    common = {"triton_max_batch_size": batch}
    lora_dtype = lora_weights_datatype(info)
    lora_cache = lora_cache_values(options, info)
    trtllm: dict[str, object] = {
        **common,
        "decoupled_mode": options.decoupled,
        "max_queue_delay_microseconds": options.max_queue_delay_microseconds,
        "logits_datatype": "TYPE_FP32",
        "max_beam_width": info.limits.max_beam_width,
        "batching_strategy": options.batching_strategy,
        "engine_dir": str(info.weights_dir),
        "max_tokens_in_paged_kv_cache": options.max_tokens_in_paged_kv_cache,
        "batch_scheduler_policy": options.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": options.kv_cache_free_gpu_mem_fraction,
        "exclude_input_in_output": True,
        "enable_kv_cache_reuse": options.enable_kv_cache_reuse,
        "enable_chunked_context": options.enable_chunked_context,
        "gpu_device_ids": options.gpu_device_ids,
        "tokenizer_dir": tokenizer,
        "guided_decoding_backend": None,
        "xgrammar_tokenizer_info_path": None,
        **{name: None for name in OPTIONAL_TENSORRT_LLM_PARAMETERS},
        **lora_cache,
        "lora_weights_datatype": lora_dtype,
    }
    tokenizer_info = (
        usable_tokenizer_info(info.tokenizer_dir / XGRAMMAR_TOKENIZER_INFO_NAME) if options.guided_decoding else None
    )
    if tokenizer_info is not None:
        trtllm["guided_decoding_backend"] = GUIDED_DECODING_BACKENDS[0]
        trtllm["xgrammar_tokenizer_info_path"] = str(tokenizer_info)
    overrides = parse_key_values(options.tensorrt_llm_parameters, what="COG_TRITON_TENSORRT_LLM_PARAMETERS")
    structural = set(common) | {"decoupled_mode", "max_queue_delay_microseconds", "logits_datatype",
                                "lora_weights_datatype"}
    unknown = sorted(k for k in overrides if k not in trtllm or k in structural)
    if unknown:
        allowed = sorted(k for k in trtllm if k not in structural)
        raise TemplateError(
            f"COG_TRITON_TENSORRT_LLM_PARAMETERS: unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    trtllm.update(overrides)
    check_guided_decoding(trtllm)
    reference_lora = {
        "lora_plugin": "float32" if info.lora.enabled else "",
        **spec_to_parameters(info.lora),
        "lora_cache_host_memory_bytes": lora_cache["lora_cache_host_memory_bytes"] if info.lora.enabled else None,
        "lora_weights_datatype": lora_dtype,
    }
    return {
        "tensorrt_llm_pytorch": pytorch_values(options, common, lora_dtype),
        "ensemble_ids": {**common, "lora_weights_datatype": lora_dtype},
        "ensemble": {**common, "lora_weights_datatype": lora_dtype, "tokenizer_dir": tokenizer},
        "preprocessing": {
            **common,
            "max_queue_delay_microseconds": options.max_queue_delay_microseconds,
            "preprocessing_instance_count": options.preprocessing_instance_count,
            "tokenizer_dir": tokenizer,
            "add_special_tokens": options.add_special_tokens,
        },
        "tensorrt_llm": trtllm,
        "tensorrt_llm_reference": {
            **common,
            "decoupled_mode": options.decoupled,
            "max_queue_delay_microseconds": options.max_queue_delay_microseconds,
            "hf_model_dir": str(info.weights_dir),
            "max_input_len": info.limits.max_input_len,
            "max_seq_len": info.limits.max_seq_len,
            "exclude_input_in_output": True,
            "torch_threads": options.reference_torch_threads,
            # As upstream's Python tensorrt_llm model: xgrammar built from tokenizer_dir (docs/model_config.md).
            "guided_decoding_backend": GUIDED_DECODING_BACKENDS[0] if options.guided_decoding else None,
            "tokenizer_dir": tokenizer,
            **reference_lora,
        },
    }


def usable_tokenizer_info(path: Path) -> Optional[Path]:
    """``path`` when it is a tokenizer info file the C++ backend can load, else None (with a warning
    when it exists but lacks a key the backend reads: loading the model would fail)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s): guided decoding stays off", path, exc)
        return None
    missing = [key for key in XGRAMMAR_TOKENIZER_INFO_KEYS if not isinstance(data, dict) or key not in data]
    if missing:
        log.warning(
            "%s lacks %s, which TensorRT-LLM's C++ backend reads unconditionally: guided decoding stays off",
            path,
            ", ".join(missing),
        )
        return None
    return path


def guided_decoding_of(config: model_config_pb2.ModelConfig) -> bool:
    """Whether a rendered ``tensorrt_llm`` config turns guided decoding on: the C++ backend needs both
    guided_decoding_backend and xgrammar_tokenizer_info_path (getGuidedDecodingConfigFromParams); the
    CPU reference model, like upstream's Python model, guided_decoding_backend (with tokenizer_dir)."""
    params = config.parameters
    backend = params["guided_decoding_backend"].string_value if "guided_decoding_backend" in params else ""
    if backend not in GUIDED_DECODING_BACKENDS:
        return False
    if config.backend == "python":
        return True
    path = params["xgrammar_tokenizer_info_path"].string_value if "xgrammar_tokenizer_info_path" in params else ""
    return bool(path)


def check_guided_decoding(values: Mapping[str, object]) -> None:
    """Refuse guided-decoding parameters the C++ backend would ignore or fail on.

    The backend (1.1, and 1.2.0rc8 @0c8de69a) turns guided decoding on only when both
    ``guided_decoding_backend`` and ``xgrammar_tokenizer_info_path`` are set: with one of them empty it is
    silently off, and a request's guide is then ignored (model_instance_state.cc getGuidedDecodingConfigFromParams).

    Raises:
        TemplateError: only one of the two is set, the backend is not "xgrammar", or the tokenizer
            info file does not exist.
    """
    backend = format_value(values.get("guided_decoding_backend"))
    info = format_value(values.get("xgrammar_tokenizer_info_path"))
    if not backend and not info:
        return
    where = "COG_TRITON_TENSORRT_LLM_PARAMETERS"
    if backend and backend not in GUIDED_DECODING_BACKENDS:
        raise TemplateError(
            f"{where}: guided_decoding_backend={backend!r}; TensorRT-LLM 1.2.1's C++ backend only accepts "
            f"{', '.join(GUIDED_DECODING_BACKENDS)} and would fail to load"
        )
    if backend and not info:
        raise TemplateError(
            f"{where}: guided_decoding_backend={backend} needs xgrammar_tokenizer_info_path too (the tokenizer "
            "info JSON made by TensorRT-LLM's examples/generate_xgrammar_tokenizer_info.py); without it the "
            "backend leaves guided decoding off and ignores every request's guide"
        )
    if info and not backend:
        raise TemplateError(
            f"{where}: xgrammar_tokenizer_info_path is set but guided_decoding_backend is not; set "
            "guided_decoding_backend:xgrammar, or the backend leaves guided decoding off"
        )
    if not Path(info).is_file():
        raise TemplateError(f"{where}: xgrammar_tokenizer_info_path={info} does not exist")


def render_config(
    template: Path, values: Mapping[str, object], keep: frozenset[str] = frozenset()
) -> model_config_pb2.ModelConfig:
    """Fill one ``config.pbtxt`` template strictly, parse it, and drop empty parameters (except ``keep``).

    Raises:
        TemplateError: see :func:`fill_template` and :func:`parse_model_config`.
    """
    try:
        text = template.read_text()
    except OSError as exc:
        raise TemplateError(f"cannot read template {template}: {exc}") from None
    filled = fill_template(text, values, source=str(template))
    config = parse_model_config(filled, source=str(template))
    drop_empty_parameters(config, keep)
    return config


def copy_model_code(template_dir: Path, folder: str, version_dir: Path) -> list[str]:
    """Copy the Python code of the template folder ``folder`` into ``version_dir``: its ``1/*.py`` (``model.py`` and
    the modules it imports), then what it shares (:data:`SHARED_MODEL_CODE`, :data:`PACKAGE_MODEL_CODE`), as plain
    files. Triton's Python backend imports ``model.py`` as ``1.model`` with the model's folder on ``sys.path``
    (triton-inference-server/python_backend ``src/pb_stub.cc`` ``ModelContext::StubSetup``, r24.10), so the model
    imports these relatively.

    Returns:
        the names of the files written, sorted.

    Raises:
        TemplateError: ``1/model.py`` or a shared file is missing.
    """
    source = template_dir / folder / "1"
    model_py = source / "model.py"
    if not model_py.is_file():
        raise TemplateError(f"{model_py} is missing (Python backend model)")
    files = sorted(source.glob("*.py"))
    files += [template_dir / name for name in SHARED_MODEL_CODE.get(folder, ())]
    files += [Path(__file__).resolve().parent / name for name in PACKAGE_MODEL_CODE.get(folder, ())]
    for path in files:
        if not path.is_file():
            raise TemplateError(f"{path} is missing (code the {folder} model shares)")
        shutil.copy2(path, version_dir / path.name)
    return sorted(path.name for path in files)


def render_model_repository(options: RenderOptions, info: WeightsInfo) -> dict[str, model_config_pb2.ModelConfig]:
    """Write the live model repository for ``info`` into ``options.model_repo_dir``.

    The three models (ensemble, preprocessing, tensorrt_llm) are rendered into a fresh folder which then replaces the old one; a failure leaves the
    previous repository untouched. ``tensorrt_llm`` comes from the ``tensorrt_llm`` template for
    engines, and from ``tensorrt_llm_reference`` for Hugging Face checkpoints.

    Returns:
        live model name -> the validated ModelConfig written to ``<name>/config.pbtxt``.

    Raises:
        TemplateError: a template is missing, unfilled, or invalid.
    """
    values = template_values(options, info)
    llm_folder = llm_template_folder(options, info)
    folders = {  # tensorrt_llm first: the ensemble forwards the optional inputs it declares (forward_model_inputs)
        "tensorrt_llm": llm_folder,
        "preprocessing": "preprocessing",
        "ensemble_ids": "ensemble_ids",
    }
    if options.text_ensemble:
        folders["ensemble"] = "ensemble"
    target = options.model_repo_dir
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    rendered: dict[str, model_config_pb2.ModelConfig] = {}
    try:
        for name, folder in folders.items():
            source = options.template_dir / folder
            keep = frozenset(REQUIRED_TENSORRT_LLM_PARAMETERS) if folder == "tensorrt_llm" else frozenset()
            config = render_config(source / "config.pbtxt", values[folder], keep)
            if name == "ensemble_ids":
                forward_model_inputs(config, rendered["tensorrt_llm"])
            if name == "ensemble":
                cut_text_ensemble_inputs(config, rendered["tensorrt_llm"])
            if config.name != name:
                raise TemplateError(f"{source / 'config.pbtxt'}: model name is {config.name!r}, expected {name!r}")
            model_dir = staging / name
            (model_dir / "1").mkdir(parents=True)
            if folder in PYTHON_MODELS:
                copy_model_code(options.template_dir, folder, model_dir / "1")
            if folder == PYTORCH_FOLDER:
                write_llm_args(model_dir / "1", options.llm_args or {})
            (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
            rendered[name] = config
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
    backend = {"tensorrt_llm": "TensorRT-LLM", PYTORCH_FOLDER: "TensorRT-LLM PyTorch (LLM API)"}.get(llm_folder,
                                                                                             "CPU reference")
    log.info("rendered model repository %s (%s backend)", target, backend)
    return rendered


# ------------------------------------------------------------------------------------------------
# The PyTorch backend (tensorrt_llm_pytorch: a Python model over tensorrt_llm.LLM)
# ------------------------------------------------------------------------------------------------

PYTORCH_FOLDER = "tensorrt_llm_pytorch"
#: Where the PyTorch-backend model reads the LLM's arguments (beside its model.py).
LLM_ARGS_FILE = "llm_args.json"


def llm_template_folder(options: RenderOptions, info: WeightsInfo) -> str:
    """The template folder rendered as ``tensorrt_llm``: the C++ backend's for an engine; for a Hugging Face
    checkpoint the PyTorch backend's when ``options.llm_args`` is given, else the CPU reference model's.

    Raises:
        TemplateError: ``llm_args`` given for an engine (the PyTorch backend serves checkpoints, not engines).
    """
    if info.kind == "engine":
        if options.llm_args is not None:
            raise TemplateError(f"the PyTorch backend's LLM arguments were given, but {info.weights_dir} holds a "
                                "TensorRT-LLM engine, which the C++ backend serves; the PyTorch backend serves a "
                                "Hugging Face checkpoint")
        return "tensorrt_llm"
    return PYTORCH_FOLDER if options.llm_args is not None else "tensorrt_llm_reference"


def pytorch_values(options: RenderOptions, common: Mapping[str, object], lora_dtype: str) -> dict[str, object]:
    """Placeholder values of ``tensorrt_llm_pytorch/config.pbtxt``. ``lora_weights`` has the ensemble's dtype (the
    ensemble maps it; the model refuses it). ``guided_decoding_backend`` mirrors the LLM arguments', so that
    :func:`guided_decoding_of` reads the rendered config as for the other models."""
    llm_args = options.llm_args or {}
    return {
        **common,
        "decoupled_mode": options.decoupled,
        "max_queue_delay_microseconds": options.max_queue_delay_microseconds,
        "lora_weights_datatype": lora_dtype,
        "exclude_input_in_output": True,
        "cancellation_check_period_ms": None,
        "unanswered_stop_timeout_ms": None,
        "max_adapters_per_llm": options.max_adapters_per_llm,
        "adapter_snapshot_dir": options.adapter_snapshot_dir,
        "guided_decoding_backend": llm_args.get("guided_decoding_backend"),
        "images": options.images,
    }


def write_llm_args(folder: Path, llm_args: Mapping[str, Any]) -> Path:
    """Write ``llm_args`` as ``folder/llm_args.json`` (the PyTorch-backend model passes it to ``LLM(**args)``).

    Raises:
        TemplateError: not a mapping with a ``model``, or a value JSON cannot hold.
    """
    if not isinstance(llm_args, Mapping) or not llm_args.get("model"):
        raise TemplateError(f"the PyTorch backend's LLM arguments must be a mapping with a 'model' (the checkpoint "
                            f"folder); got {str(llm_args)[:200]}")
    try:
        text = json.dumps(dict(llm_args), indent=2, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"the PyTorch backend's LLM arguments must be JSON values: {exc}") from None
    path = folder / LLM_ARGS_FILE
    path.write_text(text + "\n", encoding="utf-8")
    return path


#: Inputs only the PyTorch-backend model has, which the ensemble passes to ``tensorrt_llm`` when the rendered model
#: declares them: ``lora_path`` (the LLM API takes an adapter's folder, not converted tensors) and
#: ``stream_interval_ms`` (its responses joined per interval). The C++ backend's model declares neither.
FORWARDED_MODEL_INPUTS = ("lora_path", "stream_interval_ms")


def forward_model_inputs(ensemble: model_config_pb2.ModelConfig, llm: model_config_pb2.ModelConfig) -> None:
    """Give the ensemble each of :data:`FORWARDED_MODEL_INPUTS` that the rendered ``tensorrt_llm`` model ``llm``
    declares (optional, as there; ``dims`` [1]) and map it to the ``tensorrt_llm`` step.

    Raises:
        TemplateError: the ensemble has no tensorrt_llm step.
    """
    declared = {t.name: t for t in llm.input}
    for name in FORWARDED_MODEL_INPUTS:
        if name not in declared or any(t.name == name for t in ensemble.input):
            continue
        tensor = ensemble.input.add()
        tensor.name = name
        tensor.data_type = declared[name].data_type
        tensor.dims.append(1)
        tensor.optional = True
        tensor.allow_ragged_batch = True
        for step in ensemble.ensemble_scheduling.step:
            if step.model_name == "tensorrt_llm":
                step.input_map[name] = name
                break
        else:
            raise TemplateError(f"the ensemble has no tensorrt_llm step to map {name} to")


def takes_stream_interval(llm: model_config_pb2.ModelConfig) -> bool:
    """Whether a rendered ``tensorrt_llm`` model takes ``stream_interval_ms`` (the PyTorch-backend model)."""
    return any(t.name == "stream_interval_ms" for t in llm.input)


#: The text ``ensemble``'s inputs that its model passes to ``tensorrt_llm`` as they are, by the name they have there
#: (upstream's ensemble step, triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt @2a9abd95). Equal
#: to ``LLM_INPUTS`` of triton_model_repo/ensemble/1/model.py (tests/test_text_ensemble.py checks).
TEXT_ENSEMBLE_LLM_INPUTS = {
    "exclude_input_in_output": "exclude_input_in_output", "top_k": "runtime_top_k", "top_p": "runtime_top_p",
    "temperature": "temperature", "length_penalty": "len_penalty", "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "seed": "seed", "return_log_probs": "return_log_probs", "beam_width": "beam_width",
    "num_return_sequences": "num_return_sequences", "stream": "streaming", "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights", "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type", "guided_decoding_guide": "guided_decoding_guide",
}


def cut_text_ensemble_inputs(ensemble: model_config_pb2.ModelConfig, llm: model_config_pb2.ModelConfig) -> list[str]:
    """Remove from the text ``ensemble`` each input whose ``tensorrt_llm`` input the rendered model ``llm`` does not
    declare (``num_return_sequences`` on the reference and PyTorch-backend models), so that Triton refuses it by
    name ("unexpected inference input") instead of the model failing later. Returns the names removed."""
    declared = {t.name for t in llm.input}
    cut = [t.name for t in ensemble.input
           if t.name in TEXT_ENSEMBLE_LLM_INPUTS and TEXT_ENSEMBLE_LLM_INPUTS[t.name] not in declared]
    kept = [t for t in ensemble.input if t.name not in cut]
    del ensemble.input[:]
    ensemble.input.extend(kept)
    return cut
