"""Engine build configs: one YAML file per model, loaded into a typed, validated object.

A build config says where the Hugging Face checkpoint comes from and how to turn it into the
archive that ``setup()`` downloads: with the TensorRT-LLM backend (checkpoint conversion, optional
quantization, ``trtllm-build``; GPU only) or with the CPU reference backend (the checkpoint is
packed as it is). Examples live in ``configs/engines/``; the schema is :class:`EngineBuildConfig`.

Parsing is pyyaml's ``safe_load``; validation is pydantic's. Unknown keys are errors, and every
error names the key path, the value seen and what is allowed (:class:`BuildConfigError`).

Interface facts (TensorRT-LLM 1.1.0, unchanged in 1.2.1, the version pinned in :mod:`tensorrtllm_backend.pins`;
re-audit in docs/engines.md):
quantization modes are ``tensorrt_llm.quantization.QuantAlgo`` members reached through
``QuantConfig`` (weight-only int8/int4 at conversion time) or through ModelOpt calibration
(``tensorrt_llm.quantization.quantize_and_export``; fp8, int4 AWQ, w4a8 AWQ, int8 SmoothQuant,
nvfp4). Plugin names and values are those of ``trtllm-build`` (``tensorrt_llm/plugin/plugin.py``).
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from common.errors import BuildConfigError
from tensorrtllm_backend.lora import (
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_LORAS,
    FUSED_MLP_PAIR,
    SUPPORTED_MODULES,
    fused_pair_problem,
)


class Backend(str, Enum):
    """Which Triton model serves the archive."""

    TENSORRTLLM = "tensorrtllm"  # C++ TensorRT-LLM backend, engine built on GPU
    REFERENCE = "reference"  # CPU reference implementation, Hugging Face checkpoint as is
    PYTORCH = "pytorch"  # TensorRT-LLM's PyTorch backend (LLM API): the checkpoint packed as is and verified

#: Sections a ``pytorch`` build config may not set: the PyTorch backend builds nothing, and what they would
#: decide is chosen when serving (COG_TRITON_LLM_* settings) or by the checkpoint itself (its quantization).
PYTORCH_SERVING_SECTIONS = ("dtype", "quantization", "kv_cache_quantization", "calibration", "parallelism", "limits",
                            "features", "plugins", "workers", "lora")


class DType(str, Enum):
    """Activation / weight dtype of the engine (``--dtype`` of checkpoint conversion)."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


class Quantization(str, Enum):
    """Weight/activation quantization (TensorRT-LLM 1.1.0 ``QuantAlgo``)."""

    NONE = "none"
    INT8_WO = "int8_wo"  # W8A16, weight-only, no calibration
    INT4_WO = "int4_wo"  # W4A16, weight-only, no calibration
    INT4_AWQ = "int4_awq"  # W4A16_AWQ, ModelOpt calibration
    W4A8_AWQ = "w4a8_awq"  # W4A8_AWQ, ModelOpt calibration (Hopper and later)
    INT8_SQ = "int8_sq"  # W8A8_SQ_PER_CHANNEL SmoothQuant, ModelOpt calibration
    FP8 = "fp8"  # FP8 weights and activations, ModelOpt calibration (compute capability >= 8.9)
    NVFP4 = "nvfp4"  # NVFP4, ModelOpt calibration (compute capability >= 10.0)


class KVCacheQuantization(str, Enum):
    """KV cache dtype (``kv_cache_quant_algo``); needs ModelOpt calibration when not ``none``."""

    NONE = "none"
    FP8 = "fp8"
    INT8 = "int8"


# QuantAlgo member names of TensorRT-LLM 1.1.0 (tensorrt_llm/quantization/mode.py).
QUANT_ALGO: dict[Quantization, Optional[str]] = {
    Quantization.NONE: None,
    Quantization.INT8_WO: "W8A16",
    Quantization.INT4_WO: "W4A16",
    Quantization.INT4_AWQ: "W4A16_AWQ",
    Quantization.W4A8_AWQ: "W4A8_AWQ",
    Quantization.INT8_SQ: "W8A8_SQ_PER_CHANNEL",
    Quantization.FP8: "FP8",
    Quantization.NVFP4: "NVFP4",
}
KV_CACHE_QUANT_ALGO: dict[KVCacheQuantization, Optional[str]] = {
    KVCacheQuantization.NONE: None,
    KVCacheQuantization.FP8: "FP8",
    KVCacheQuantization.INT8: "INT8",
}
# Modes that need ModelOpt calibration (quantize_and_export), with its qformat spelling.
CALIBRATED_QFORMAT: dict[Quantization, str] = {
    Quantization.INT4_AWQ: "int4_awq",
    Quantization.W4A8_AWQ: "w4a8_awq",
    Quantization.INT8_SQ: "int8_sq",
    Quantization.FP8: "fp8",
    Quantization.NVFP4: "nvfp4",
}
# Lowest GPU compute capability (major, minor) each mode runs on.
MIN_COMPUTE_CAPABILITY: dict[Quantization, tuple[int, int]] = {
    Quantization.FP8: (8, 9),
    Quantization.W4A8_AWQ: (8, 9),
    Quantization.NVFP4: (10, 0),
}
KV_MIN_COMPUTE_CAPABILITY: dict[KVCacheQuantization, tuple[int, int]] = {KVCacheQuantization.FP8: (8, 9)}

PLUGIN_DTYPES = ("auto", "float16", "bfloat16", "float32", "disable")
# trtllm-build plugin flags we pass through, with the values each accepts.
PLUGINS: dict[str, tuple[str, ...]] = {
    "gemm_plugin": PLUGIN_DTYPES + ("fp8", "nvfp4"),
    "gpt_attention_plugin": PLUGIN_DTYPES,
    "nccl_plugin": PLUGIN_DTYPES,
    "moe_plugin": PLUGIN_DTYPES,
    "mamba_conv1d_plugin": PLUGIN_DTYPES,
    "gemm_swiglu_plugin": ("fp8", "disable"),
    "low_latency_gemm_plugin": ("fp8", "disable"),
    "fp8_rowwise_gemm_plugin": PLUGIN_DTYPES,
}

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

_STRICT = ConfigDict(extra="forbid", frozen=True, use_enum_values=False, str_strip_whitespace=True)


class Source(BaseModel):
    """Where the Hugging Face checkpoint comes from.

    ``checkpoint`` is a local folder (absolute, or starting with ``./``, ``../`` or ``~``; relative
    paths are resolved against the config file's folder) or a Hugging Face Hub id ``org/name``,
    downloaded at ``revision`` (a branch, tag or commit) with ``HF_TOKEN`` when set.
    """

    model_config = _STRICT
    checkpoint: str = Field(min_length=1)
    revision: Optional[str] = Field(default=None, min_length=1)

    @property
    def is_local(self) -> bool:
        """True when ``checkpoint`` names a local folder rather than a Hub id."""
        c = self.checkpoint
        return c.startswith(("/", "./", "../", "~")) or c in (".", "..")

    @model_validator(mode="after")
    def _check(self) -> "Source":
        if not self.is_local and not HUB_ID_PATTERN.match(self.checkpoint):
            raise ValueError(
                f"checkpoint {self.checkpoint!r} is neither a local folder (absolute, or starting with ./ ../ ~) "
                "nor a Hugging Face Hub id of the form org/name"
            )
        if self.is_local and self.revision is not None:
            raise ValueError("revision applies to Hugging Face Hub ids only, not to a local checkpoint folder")
        return self


class Calibration(BaseModel):
    """ModelOpt calibration for the calibrated quantization modes (``quantize_and_export``)."""

    model_config = _STRICT
    dataset: str = Field(default="cnn_dailymail", min_length=1, description="Hub dataset id or local folder.")
    size: int = Field(default=512, ge=1, le=100_000, description="Number of calibration samples.")
    batch_size: int = Field(default=1, ge=1, le=1024)
    max_seq_len: int = Field(default=512, ge=1, le=131_072, description="Tokens per calibration sample.")
    awq_block_size: Literal[32, 64, 128] = 128
    seed: int = Field(default=1234, ge=0)


class Parallelism(BaseModel):
    """Tensor and pipeline parallelism; the engine's world size is ``tp_size * pp_size`` GPUs."""

    model_config = _STRICT
    tp_size: int = Field(default=1, ge=1, le=64)
    pp_size: int = Field(default=1, ge=1, le=64)

    @property
    def world_size(self) -> int:
        """Number of ranks (= GPUs) the engine needs."""
        return self.tp_size * self.pp_size


class Limits(BaseModel):
    """Engine limits (``trtllm-build`` flags of the same names). Sizes in tokens, batch in requests."""

    model_config = _STRICT
    max_batch_size: int = Field(default=8, ge=1, le=4096)
    max_input_len: int = Field(default=2048, ge=1, le=1_048_576)
    max_seq_len: int = Field(default=4096, ge=2, le=1_048_576)
    max_num_tokens: Optional[int] = Field(default=None, ge=1, le=1_048_576)
    max_beam_width: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _check(self) -> "Limits":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be below max_seq_len ({self.max_seq_len}): "
                "at least one token must be generated"
            )
        return self


class Features(BaseModel):
    """``trtllm-build`` feature switches (each becomes ``--<name> enable|disable``)."""

    model_config = _STRICT
    paged_kv_cache: bool = Field(default=True, description="Paged KV cache (needed for in-flight batching).")
    paged_context_fmha: bool = Field(default=True, description="Paged context FMHA (enables chunked context, KV reuse).")
    context_fmha: bool = True
    remove_input_padding: bool = Field(default=True, description="Packed inputs (needed for in-flight batching).")
    multiple_profiles: bool = Field(default=False, description="Several TensorRT optimization profiles.")
    use_fused_mlp: bool = True
    reduce_fusion: bool = False


class Lora(BaseModel):
    """Serving LoRA adapters per request (``trtllm-build --lora_plugin --max_lora_rank --lora_target_modules``,
    tensorrt_llm/commands/build.py; recorded in the engine's config.json ``build_config.lora_config``).

    Attributes:
        lora_plugin: the LoRA plugin's dtype; ``auto`` = the engine dtype. LoRA weights must have the
            model's dtype (loraUtils.cpp), so another value must equal ``dtype``.
        max_lora_rank: the largest adapter rank (r) served; also sizes the plugin's workspace.
        lora_target_modules: TensorRT-LLM module names adapters may touch (tensorrt_llm/lora_manager.py
            LORA_MODULE_IDS; this image converts the separate attention and MLP projections). With the fused
            gated MLP (``features.use_fused_mlp``, the default) mlp_h_to_4h and mlp_gate go together or not at
            all: the fused layer applies LoRA to gate_proj and up_proj only together (tensorrt_llm/layers/mlp.py
            fc_gate_lora @ 04a2cacb; the fusion: tensorrt_llm/builder.py optimize_model_with_config @ 008b2b8d), so
            an engine with one of them would silently ignore adapters' weights for it. With gemm_swiglu_plugin,
            neither (FusedGatedMLP.fc_gate_plugin raises NotImplementedError for LoRA on them).
        max_loras: how many adapters of ``max_lora_rank`` on every module the LoRA cache is sized to hold
            (the default of COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES; not a trtllm-build flag).
    """

    model_config = _STRICT
    lora_plugin: str = "auto"
    max_lora_rank: int = Field(default=DEFAULT_MAX_LORA_RANK, ge=1, le=1024)
    lora_target_modules: tuple[str, ...] = Field(default=SUPPORTED_MODULES, min_length=1)
    max_loras: int = Field(default=DEFAULT_MAX_LORAS, ge=1, le=4096)

    @field_validator("lora_plugin")
    @classmethod
    def _check_plugin(cls, value: str) -> str:
        allowed = ("auto", "float16", "bfloat16", "float32")
        if value not in allowed:
            raise ValueError(f"{value!r} is not allowed; allowed: {', '.join(allowed)} (remove the lora section "
                             "to build without LoRA)")
        return value

    @field_validator("lora_target_modules")
    @classmethod
    def _check_modules(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in value if m not in SUPPORTED_MODULES]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} not supported; allowed: {', '.join(SUPPORTED_MODULES)}")
        if len(set(value)) != len(value):
            raise ValueError("a module is listed twice")
        return value


class EngineBuildConfig(BaseModel):
    """One model's build recipe, as written in ``configs/engines/<name>.yaml``.

    Attributes:
        name: archive name, lowercase ``[a-z0-9._-]`` (the archive is ``<name>.tar.gz``).
        backend: ``tensorrtllm`` (GPU engine), ``reference`` (CPU, checkpoint packed as is) or ``pytorch``
            (the checkpoint packed as is for TensorRT-LLM's PyTorch backend, after checking it can serve it).
        source: the Hugging Face checkpoint.
        dtype: engine dtype; ``reference`` keeps the checkpoint's own dtype and ignores it.
        quantization / kv_cache_quantization / calibration: see :class:`Quantization`.
        parallelism: tp_size and pp_size (world size = tp_size * pp_size GPUs).
        limits: max_batch_size, max_input_len, max_seq_len, max_num_tokens, max_beam_width.
        features: paged KV cache, paged context FMHA, multiple profiles and other build switches.
        plugins: ``trtllm-build`` plugin flags, e.g. ``gemm_plugin: auto``.
        workers: parallel engine builds (``trtllm-build --workers``), at most the world size.
        lora: serve LoRA adapters per request (see :class:`Lora`); None: no LoRA plugin.

    Raises (from :func:`load_build_config`):
        BuildConfigError: unknown key, bad value or inconsistent combination.
    """

    model_config = _STRICT
    name: str
    backend: Backend = Backend.TENSORRTLLM
    source: Source
    dtype: DType = DType.FLOAT16
    quantization: Quantization = Quantization.NONE
    kv_cache_quantization: KVCacheQuantization = KVCacheQuantization.NONE
    calibration: Optional[Calibration] = None
    parallelism: Parallelism = Parallelism()
    limits: Limits = Limits()
    features: Features = Features()
    plugins: dict[str, str] = Field(
        default_factory=lambda: {"gemm_plugin": "auto", "gpt_attention_plugin": "auto"}
    )
    workers: int = Field(default=1, ge=1, le=64)
    lora: Optional[Lora] = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME_PATTERN.match(value):
            raise ValueError(f"{value!r} is not allowed: use 1-100 characters of a-z 0-9 . _ - (lowercase)")
        return value

    @field_validator("plugins")
    @classmethod
    def _check_plugins(cls, value: dict[str, str]) -> dict[str, str]:
        if "lora_plugin" in value:
            raise ValueError("set the LoRA plugin in the lora section (lora: {lora_plugin: auto, max_lora_rank: ..., "
                             "lora_target_modules: [...]}), not under plugins")
        for plugin, setting in value.items():
            if plugin not in PLUGINS:
                raise ValueError(f"unknown plugin {plugin!r}; known: {', '.join(sorted(PLUGINS))}")
            if setting not in PLUGINS[plugin]:
                raise ValueError(f"{plugin}: {setting!r} is not allowed; allowed: {', '.join(PLUGINS[plugin])}")
        return dict(sorted(value.items()))

    @model_validator(mode="after")
    def _check(self) -> "EngineBuildConfig":
        q, kv = self.quantization, self.kv_cache_quantization
        lora = self.lora
        if self.backend is Backend.PYTORCH:
            # sections that differ from their defaults (a dump of the config, as manifest.json and
            # override_checkpoint write it, repeats the defaults: those are fine)
            fields = type(self).model_fields
            set_here = [k for k in PYTORCH_SERVING_SECTIONS
                        if getattr(self, k) != fields[k].get_default(call_default_factory=True)]
            if set_here:
                raise ValueError(
                    f"the pytorch backend builds nothing, so {', '.join(set_here)} cannot be set here: parallelism, "
                    "limits and LoRA are serving settings (COG_TRITON_LLM_*), and a quantized model is a quantized "
                    "checkpoint (e.g. a ModelOpt export such as nvidia/Llama-3.1-8B-Instruct-FP8)"
                )
            return self
        if lora is not None and lora.lora_plugin != "auto":
            wanted = "float32" if self.backend is Backend.REFERENCE else self.dtype.value
            if lora.lora_plugin != wanted:
                raise ValueError(
                    f"lora.lora_plugin {lora.lora_plugin} differs from the model dtype {wanted}: TensorRT-LLM requires "
                    "LoRA weights of the model's dtype (loraUtils.cpp), and a plugin of another dtype silently ignores "
                    "them (tensorrtllm_backend issue #791); use auto"
                )
        if self.backend is Backend.REFERENCE:
            problems = []
            if self.parallelism.world_size != 1:
                problems.append(f"tp_size*pp_size must be 1 (got {self.parallelism.world_size})")
            if q is not Quantization.NONE or kv is not KVCacheQuantization.NONE:
                problems.append("quantization and kv_cache_quantization must be none")
            if self.limits.max_beam_width != 1:
                problems.append("max_beam_width must be 1")
            if problems:
                raise ValueError("the reference backend runs one CPU process without quantization: " + "; ".join(problems))
            return self
        if q in (Quantization.INT4_WO, Quantization.INT4_AWQ, Quantization.W4A8_AWQ) and self.dtype is DType.FLOAT32:
            raise ValueError(f"quantization {q.value} needs dtype float16 or bfloat16, not float32")
        if self.needs_calibration and self.calibration is None:
            object.__setattr__(self, "calibration", Calibration())
        if not self.needs_calibration and self.calibration is not None:
            raise ValueError(
                f"calibration is only used by quantization {', '.join(m.value for m in CALIBRATED_QFORMAT)} "
                f"or kv_cache_quantization fp8/int8; remove it for quantization {q.value}"
            )
        if q in (Quantization.INT8_WO, Quantization.INT4_WO) and kv is not KVCacheQuantization.NONE:
            raise ValueError(
                f"kv_cache_quantization {kv.value} needs ModelOpt calibration, which weight-only {q.value} does not run; "
                "use quantization int4_awq, fp8 or int8_sq, or kv_cache_quantization none"
            )
        f = self.features
        if lora is not None and f.use_fused_mlp and fused_pair_problem(lora.lora_target_modules):
            raise ValueError(
                f"lora.lora_target_modules has {fused_pair_problem(lora.lora_target_modules)}; list both "
                f"{' and '.join(FUSED_MLP_PAIR)} or neither, or set features.use_fused_mlp: false"
            )
        mlp_in = [m for m in FUSED_MLP_PAIR if lora is not None and m in lora.lora_target_modules]
        if mlp_in and self.plugins.get("gemm_swiglu_plugin", "disable") != "disable":
            raise ValueError(
                f"plugins.gemm_swiglu_plugin {self.plugins['gemm_swiglu_plugin']} cannot apply LoRA to "
                f"{' and '.join(mlp_in)}: trtllm-build raises NotImplementedError for LoRA on the fused MLP's input "
                "projections with that plugin (tensorrt_llm/layers/mlp.py FusedGatedMLP.fc_gate_plugin); remove "
                f"{' and '.join(mlp_in)} from lora.lora_target_modules or set gemm_swiglu_plugin: disable"
            )
        gpt_attention = self.plugins.get("gpt_attention_plugin", "auto")
        if (f.paged_kv_cache or f.paged_context_fmha or f.context_fmha) and gpt_attention == "disable":
            raise ValueError("paged_kv_cache, paged_context_fmha and context_fmha need gpt_attention_plugin enabled")
        if f.paged_context_fmha and not f.context_fmha:
            raise ValueError("features.paged_context_fmha needs features.context_fmha: true")
        if f.paged_context_fmha and not f.paged_kv_cache:
            raise ValueError("features.paged_context_fmha needs features.paged_kv_cache: true")
        limits = self.limits
        if limits.max_num_tokens is not None and not f.paged_context_fmha and limits.max_num_tokens < limits.max_input_len:
            raise ValueError(
                f"limits.max_num_tokens ({limits.max_num_tokens}) is below limits.max_input_len ({limits.max_input_len}): "
                "a full prompt would not fit in one step; raise max_num_tokens or enable features.paged_context_fmha "
                "(chunked context)"
            )
        if self.workers > self.parallelism.world_size:
            raise ValueError(f"workers ({self.workers}) must not exceed the world size ({self.parallelism.world_size})")
        return self

    @property
    def needs_calibration(self) -> bool:
        """True when the build runs ModelOpt calibration (calibrated quantization or KV-cache quantization)."""
        return self.quantization in CALIBRATED_QFORMAT or self.kv_cache_quantization is not KVCacheQuantization.NONE

    @property
    def min_compute_capability(self) -> Optional[tuple[int, int]]:
        """Lowest GPU compute capability (major, minor) the chosen quantization runs on, or None."""
        needs = [MIN_COMPUTE_CAPABILITY.get(self.quantization), KV_MIN_COMPUTE_CAPABILITY.get(self.kv_cache_quantization)]
        present = [n for n in needs if n is not None]
        return max(present) if present else None

    def checkpoint_path(self, base_dir: Path) -> Optional[Path]:
        """The local checkpoint folder (relative paths resolved against ``base_dir``), or None for Hub ids."""
        if not self.source.is_local:
            return None
        path = Path(self.source.checkpoint).expanduser()
        return path if path.is_absolute() else (base_dir / path).resolve()

    def to_manifest(self) -> dict[str, Any]:
        """The config as plain JSON-able data (enums as their values), as recorded in manifest.json."""
        return self.model_dump(mode="json")


def _describe(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
    return f"{loc}: {msg}{shown}" if loc else msg


def parse_build_config(data: Any, where: str = "build config") -> EngineBuildConfig:
    """Validate already-parsed YAML/JSON ``data``.

    Raises:
        BuildConfigError: naming every bad key path, its value and what is allowed; unknown keys
            list the keys allowed at that level.
    """
    if not isinstance(data, dict):
        raise BuildConfigError(f"{where}: must be a mapping of keys to values, got {type(data).__name__}")
    try:
        return EngineBuildConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            text = _describe(err)
            if err["type"] == "extra_forbidden":
                text += f"; allowed: {', '.join(_allowed_keys(err['loc'][:-1]))}"
            problems.append(text)
        raise BuildConfigError(f"{where}: " + "; ".join(problems)) from None


def _allowed_keys(loc: tuple[Union[int, str], ...]) -> list[str]:
    model: Any = EngineBuildConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


def load_build_config(path: Union[str, Path]) -> EngineBuildConfig:
    """Read and validate the YAML build config at ``path``.

    Raises:
        BuildConfigError: the file is missing, not YAML, or invalid (see :func:`parse_build_config`).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise BuildConfigError(f"cannot read build config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BuildConfigError(f"{path} is not valid YAML: {exc}") from None
    return parse_build_config(data, where=str(path))
