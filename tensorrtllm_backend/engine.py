"""What the unpacked weights hold: a TensorRT-LLM engine or a Hugging Face checkpoint, and its limits.

Engine facts (``trtllm-build`` of TensorRT-LLM 0.8 and later, incl. 1.1.0 and 1.2.1): the engine folder has
``config.json`` with ``version``, ``pretrained_config`` (``architecture``, ``dtype``,
``vocab_size``, ``mapping`` with ``world_size``/``tp_size``/``pp_size``) and ``build_config``
(``max_batch_size``, ``max_input_len``, ``max_seq_len`` — or ``max_output_len`` up to about 0.10,
where max_seq_len = max_input_len + max_output_len —, ``max_num_tokens``, ``max_beam_width``,
``plugin_config`` with ``context_fmha`` and ``remove_input_padding``), plus one ``rank<K>.engine`` per
rank. Engines from before 0.8 (``builder_config`` layout) are rejected.

A Hugging Face checkpoint (``config.json`` with ``architectures``/``model_type`` and weight files)
is served as it is: by TensorRT-LLM's PyTorch backend through the LLM API on a GPU (its arguments and limits:
:mod:`tensorrtllm_backend.llmapi_args`; what it supports: :mod:`tensorrtllm_backend.checkpoint`, whose
quantization reading :attr:`WeightsInfo.quantization` reports), or by the CPU reference implementation of the
``tensorrt_llm`` model.

LoRA support (:attr:`WeightsInfo.lora`): an engine's from its config.json (build_config.lora_config and
plugin_config.lora_plugin, :func:`tensorrtllm_backend.lora.engine_lora_spec`); a checkpoint's from its
sizes and the archive's build config (:func:`tensorrtllm_backend.lora.checkpoint_lora_spec`).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from common.errors import ConfigError
from tensorrtllm_backend.checkpoint import CheckpointQuantization, checkpoint_quantization
from tensorrtllm_backend.lora import LoraSpec, checkpoint_lora_spec, engine_lora_spec
from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
HF_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
REFERENCE_DEFAULT_MAX_SEQ_LEN = 4096
#: The xgrammar tokenizer info the C++ backend's guided decoding reads (xgrammar_tokenizer_info_path),
#: made by TensorRT-LLM's _xgrammar_tokenizer_info; scripts/build_engine puts it in the archive's tokenizer/.
XGRAMMAR_TOKENIZER_INFO_NAME = "xgrammar_tokenizer_info.json"


@dataclass(frozen=True)
class ModelLimits:
    """Sizes the served model accepts, all in tokens except ``max_batch_size`` (requests).

    ``max_input_len`` is the engine's build value (``trtllm-build --max_input_len``). The longest
    prompt the executor really takes is :meth:`executor_max_input_len`: it also depends on
    ``max_num_tokens``, on the engine's ``context_fmha`` and ``remove_input_padding`` plugins
    (``packed_context_fmha``: both on, as ``trtllm-build`` 1.1 builds by default) and on whether
    chunked context is on (``enable_chunked_context``, the backend parameter; a serving choice).

    ``pytorch_backend``: the limits of a checkpoint served by TensorRT-LLM's PyTorch backend (LLM API), which
    has no build-time ``max_input_len``: the longest prompt is ``min(max_seq_len - 1, max_num_tokens)``, or
    ``max_seq_len - 1`` with chunked prefill (see :func:`tensorrtllm_backend.llmapi_args.pytorch_limits`).
    """

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_beam_width: int = 1
    max_num_tokens: Optional[int] = None
    packed_context_fmha: bool = False
    enable_chunked_context: bool = False
    pytorch_backend: bool = False

    @property
    def max_output_len(self) -> int:
        """Most tokens that can be generated after a 1-token prompt."""
        return self.max_seq_len - 1

    def executor_max_input_len(self) -> int:
        """The longest prompt (tokens) TensorRT-LLM's executor accepts; longer ones fail in Triton with
        "Prompt length (N) exceeds maximum input length (M)" (``LlmRequest::validate``, llmRequest.cpp).

        The ``TrtGptModel`` constructor sets that maximum (cpp/tensorrt_llm/batch_manager/trtGptModel.h):
        ``max_seq_len - 1`` with chunked context; else ``min(max_seq_len - 1, max_num_tokens)`` when the
        engine has context FMHA and packed input (``build_config.plugin_config.context_fmha`` and
        ``remove_input_padding``, read by cpp/tensorrt_llm/runtime/gptJsonConfig.cpp ``parsePluginConfig``);
        else the engine's ``max_input_len``.
        """
        if self.enable_chunked_context:
            return self.max_seq_len - 1
        if (self.packed_context_fmha or self.pytorch_backend) and self.max_num_tokens is not None:
            return min(self.max_seq_len - 1, self.max_num_tokens)
        return self.max_input_len

    def input_limit_reason(self) -> str:
        """How :meth:`executor_max_input_len` was reached, for error messages and logs ("" when it is the
        engine's ``max_input_len``)."""
        if self.pytorch_backend:
            if self.enable_chunked_context:
                return f"max_seq_len - 1 = {self.max_seq_len} - 1, with chunked prefill on (PyTorch backend)"
            if self.max_num_tokens is not None:
                return (
                    f"the PyTorch backend's limit with chunked prefill off: min(max_seq_len - 1, max_num_tokens) = "
                    f"min({self.max_seq_len - 1}, {self.max_num_tokens})"
                )
            return ""
        if self.enable_chunked_context:
            return f"max_seq_len - 1 = {self.max_seq_len} - 1, with chunked context on"
        if self.packed_context_fmha and self.max_num_tokens is not None:
            return (
                f"TensorRT-LLM's executor limit with chunked context off: min(max_seq_len - 1, max_num_tokens) = "
                f"min({self.max_seq_len - 1}, {self.max_num_tokens})"
            )
        return ""


@dataclass(frozen=True)
class WeightsInfo:
    """Description of unpacked weights.

    Attributes:
        kind: "engine" (TensorRT-LLM engine, C++ backend) or "hf_checkpoint" (CPU reference).
        weights_dir: folder holding config.json (and rank*.engine or the checkpoint).
        tokenizer_dir: folder holding the tokenizer files.
        limits: batch and sequence limits.
        world_size / tp_size / pp_size: parallelism (1 for checkpoints).
        architecture: e.g. "LlamaForCausalLM".
        dtype: e.g. "float16".
        trtllm_version: the TensorRT-LLM version that built the engine (None for checkpoints).
        lora: which LoRA adapters the model can serve (off by default).
        quantization: a checkpoint's quantization as TensorRT-LLM's PyTorch backend reads it (ModelOpt's
            hf_quant_config.json, ...), with whether 1.2.1 serves it; None when not quantized (and for engines).
        config: a checkpoint's config.json (empty for engines), for the limits and LLM API arguments built from it.
    """

    kind: Literal["engine", "hf_checkpoint"]
    weights_dir: Path
    tokenizer_dir: Path
    limits: ModelLimits
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    architecture: str = ""
    dtype: str = ""
    trtllm_version: Optional[str] = None
    lora: LoraSpec = field(default_factory=lambda: LoraSpec(False, "no LoRA support was looked up"))
    quantization: Optional[CheckpointQuantization] = None
    config: dict[str, Any] = field(default_factory=dict, compare=False)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _positive_int(section: dict[str, Any], key: str, where: str) -> int:
    value = section.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def find_tokenizer_dir(weights_dir: Path, override: Optional[Path] = None) -> Path:
    """The tokenizer folder: ``override``, else ``weights_dir/tokenizer`` if present, else ``weights_dir``.

    Raises:
        ConfigError: the folder holds none of tokenizer.json, tokenizer.model, vocab.json,
            tokenizer_config.json.
    """
    candidates = [override] if override else [weights_dir / "tokenizer", weights_dir]
    for folder in candidates:
        if folder and folder.is_dir() and any((folder / name).is_file() for name in TOKENIZER_FILES):
            return folder
    raise ConfigError(
        f"no tokenizer found in {', '.join(str(c) for c in candidates if c)}: expected one of "
        f"{', '.join(TOKENIZER_FILES)}; pack the tokenizer files with the weights (top level or tokenizer/)"
    )


def _engine_info(weights_dir: Path, config: dict[str, Any], tokenizer_dir: Path) -> WeightsInfo:
    where = f"{weights_dir / 'config.json'}"
    if "builder_config" in config and "build_config" not in config:
        raise ConfigError(
            f"{where} uses the pre-0.8 TensorRT-LLM engine layout; rebuild the engine with "
            f"TensorRT-LLM {TENSORRT_LLM_VERSION} ({TRITON_IMAGE})"
        )
    pretrained = config.get("pretrained_config")
    build = config.get("build_config")
    if not isinstance(pretrained, dict) or not isinstance(build, dict):
        raise ConfigError(f"{where} lacks pretrained_config/build_config: not a trtllm-build engine config")
    mapping = pretrained.get("mapping") or {}
    try:
        tp = int(mapping.get("tp_size", 1))
        pp = int(mapping.get("pp_size", 1))
        world = int(mapping.get("world_size", tp * pp))
    except (TypeError, ValueError, AttributeError):
        raise ConfigError(
            f"{where}: pretrained_config.mapping must hold integer tp_size/pp_size/world_size, got {mapping!r}"
        ) from None
    if world != tp * pp:
        raise ConfigError(f"{where}: mapping.world_size={world} but tp_size*pp_size={tp * pp}")
    max_input_len = _positive_int(build, "max_input_len", where)
    if "max_seq_len" in build:
        max_seq_len = _positive_int(build, "max_seq_len", where)
    elif "max_output_len" in build:  # engines built before TensorRT-LLM 0.11
        max_seq_len = max_input_len + _positive_int(build, "max_output_len", where)
    else:
        raise ConfigError(f"{where}: build_config needs max_seq_len (or max_output_len for engines before 0.11)")
    max_beam_width = _positive_int(build, "max_beam_width", where) if "max_beam_width" in build else 1
    max_num_tokens = _positive_int(build, "max_num_tokens", where) if build.get("max_num_tokens") is not None else None
    if max_input_len >= max_seq_len + 1:
        raise ConfigError(f"{where}: max_input_len {max_input_len} exceeds max_seq_len {max_seq_len}")
    plugins = build.get("plugin_config")
    plugins = plugins if isinstance(plugins, dict) else {}
    packed_context_fmha = plugins.get("context_fmha") is True and plugins.get("remove_input_padding") is True
    missing = [f"rank{r}.engine" for r in range(world) if not (weights_dir / f"rank{r}.engine").is_file()]
    if missing:
        raise ConfigError(
            f"engine in {weights_dir} has world_size {world} but {', '.join(missing)} "
            "is missing; pack every rank's engine file"
        )
    # Whether this version can serve the engine is checked by tensorrtllm_backend.manifest.
    version = str(config.get("version", "")) or None
    return WeightsInfo(
        kind="engine",
        weights_dir=weights_dir,
        tokenizer_dir=tokenizer_dir,
        limits=ModelLimits(
            max_batch_size=_positive_int(build, "max_batch_size", where),
            max_input_len=max_input_len,
            max_seq_len=max_seq_len,
            max_beam_width=max_beam_width,
            max_num_tokens=max_num_tokens,
            packed_context_fmha=packed_context_fmha,
        ),
        world_size=world,
        tp_size=tp,
        pp_size=pp,
        architecture=str(pretrained.get("architecture", "")),
        dtype=str(pretrained.get("dtype", "")),
        trtllm_version=version,
        lora=engine_lora_spec(config, where),
    )


def _checkpoint_info(
    weights_dir: Path,
    config: dict[str, Any],
    tokenizer_dir: Path,
    max_batch_size: int,
    max_seq_len: Optional[int],
    max_input_len: Optional[int],
    lora_build: Optional[dict[str, Any]] = None,
    base_model: str = "",
) -> WeightsInfo:
    if not any(any(weights_dir.glob(p)) for p in HF_WEIGHT_PATTERNS):
        raise ConfigError(
            f"{weights_dir} has a Hugging Face config.json but no weights ({', '.join(HF_WEIGHT_PATTERNS)})"
        )
    positions = config.get("max_position_embeddings")
    limit = int(positions) if isinstance(positions, int) and positions > 1 else REFERENCE_DEFAULT_MAX_SEQ_LEN
    seq = max_seq_len or min(limit, REFERENCE_DEFAULT_MAX_SEQ_LEN)
    if seq > limit:
        raise ConfigError(
            f"COG_TRITON_REFERENCE_MAX_SEQ_LEN={seq} exceeds the model's max_position_embeddings {limit}"
        )
    inp = max_input_len or seq - 1
    if inp >= seq:
        raise ConfigError(
            f"COG_TRITON_REFERENCE_MAX_INPUT_LEN={inp} must be below the max sequence length {seq} "
            "(at least one token must be generated)"
        )
    architectures = config.get("architectures") or [config.get("model_type", "")]
    return WeightsInfo(
        kind="hf_checkpoint",
        weights_dir=weights_dir,
        tokenizer_dir=tokenizer_dir,
        limits=ModelLimits(max_batch_size=max_batch_size, max_input_len=inp, max_seq_len=seq),
        architecture=str(architectures[0]),
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        lora=checkpoint_lora_spec(
            config, lora_build, importlib.util.find_spec("peft") is not None,
            base_model=base_model or str(config.get("_name_or_path") or ""),
        ),
        quantization=checkpoint_quantization(weights_dir, config),
        config=config,
    )


def find_model_root(weights_dir: Path) -> Path:
    """The folder holding the model's ``config.json``: ``weights_dir`` itself, or its only subfolder.

    Archives are often packed with one top-level folder (``tar czf model.tgz model/``); hidden
    files (our download marker, ``.gitkeep``) are ignored when looking for that single folder.
    """
    if (weights_dir / "config.json").is_file():
        return weights_dir
    visible = [p for p in weights_dir.iterdir() if not p.name.startswith(".")] if weights_dir.is_dir() else []
    if len(visible) == 1 and visible[0].is_dir() and (visible[0] / "config.json").is_file():
        return visible[0]
    return weights_dir


def inspect_weights(
    weights_dir: Path,
    *,
    tokenizer_dir: Optional[Path] = None,
    reference_max_batch_size: int = 8,
    reference_max_seq_len: Optional[int] = None,
    reference_max_input_len: Optional[int] = None,
    reference_lora: Optional[dict[str, Any]] = None,
    base_model: str = "",
) -> WeightsInfo:
    """Describe the weights unpacked in ``weights_dir``.

    ``reference_lora`` / ``base_model``: for a checkpoint, the ``lora`` section of the archive's build
    config (None: LoRA defaults) and what it was made from (for messages).

    An engine is recognised by ``rank*.engine`` files (or ``build_config`` in config.json); a
    Hugging Face checkpoint by ``config.json`` with weights and no engine files.

    The model may sit in ``weights_dir`` or in its only subfolder (see :func:`find_model_root`).

    Raises:
        ConfigError: no config.json, an unreadable or incomplete engine config, missing rank
            files, no tokenizer, or inconsistent limits; the message names the file and value.
    """
    weights_dir = find_model_root(weights_dir)
    config_path = weights_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(
            f"{config_path} not found: the weights must hold a TensorRT-LLM engine (config.json + "
            "rank*.engine) or a Hugging Face checkpoint (config.json + *.safetensors)"
        )
    config = _read_json(config_path)
    tokenizer = find_tokenizer_dir(weights_dir, tokenizer_dir)
    if any(weights_dir.glob("rank*.engine")) or "build_config" in config or "builder_config" in config:
        return _engine_info(weights_dir, config, tokenizer)
    return _checkpoint_info(
        weights_dir, config, tokenizer, reference_max_batch_size, reference_max_seq_len, reference_max_input_len,
        reference_lora, base_model,
    )
