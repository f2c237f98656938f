"""What TensorRT-LLM 1.2.1's PyTorch backend serves from a Hugging Face checkpoint: architectures and quantization.

A checkpoint is served as it is (no engine build): ``tensorrt_llm.LLM(model=<folder>)`` reads its
``config.json``, picks the model class registered for ``architectures[0]`` and loads the safetensors. Two things
decide whether that can work, and both are checked here, before Triton starts, so a checkpoint the release
cannot serve fails setup with a message instead of failing inside the Triton model:

**Architectures** (:data:`PYTORCH_ARCHITECTURES`). The PyTorch backend's model registry is
``MODEL_CLASS_MAPPING`` in ``tensorrt_llm/_torch/models/modeling_utils.py``, filled by the
``@register_auto_model("<architecture>")`` decorator of each ``tensorrt_llm/_torch/models/modeling_*.py`` (read
@``cb4c622c`` and earlier stored versions); ``AutoModelForCausalLM.from_config`` (``modeling_auto.py``
@``01bffee1``) raises ``ValueError("Unknown architecture for AutoModelForCausalLM: <arch>")`` for any other
``architectures[0]``. The search index holds no file of the v1.2.1 commit (``376f7e1b``), so the list is put
together from the nearest sources, each entry naming its own: the 1.0.0 "Supported Models" page
(nvidia.github.io/TensorRT-LLM/1.0.0/models/supported-models.html), the model imports of
``_torch/models/__init__.py`` (stored @``015fb89c``), the release notes of 1.1 and 1.2
(``docs/source/release-notes.md`` @``001eaece``: GPT-OSS, Hunyuan Dense/MoE, Seed-OSS in 1.1; K-EXAONE, Nemotron
Nano/Super V3, Qwen3-Next, Qwen3-VL in 1.2), the supported-models page published for the 1.2 line (root of
nvidia.github.io/TensorRT-LLM, which lists DeepSeek-V3.2, K-EXAONE, GLM-4.5-4.7, MiniMax M2/M2.1, Nemotron-3-Nano,
Phi-4), and checked against the later registry index ``_torch/models/_arch_index.py`` (@``065ff9e9``, a superset:
every entry here is in it). Architectures only that later index has (Gemma 4, Qwen3.5, DeepSeek-V4, Kimi-K2.5,
Cohere2, ...) postdate 1.2 and are not listed.

Registered but not text generation (``ModelConfig.is_generation_model``, ``tensorrt_llm/_torch/model_config.py``):
``BertForSequenceClassification``, ``Qwen2ForProcessRewardModel``, ``Qwen2ForRewardModel``,
``LlamaForTextEmbedding``; and the vision encoders ``CLIPVisionModel``, ``SiglipVisionModel``. This image streams
generated text, so those are refused too (:data:`NOT_TEXT_GENERATION`).

**Files beyond the weights, and remote code** (:func:`check_checkpoint_files`). ``LLM(...)`` builds an input
processor for every checkpoint when it loads (``_TorchLLM._build_model``: ``create_input_processor(hf_model_dir,
tokenizer, checkpoint_format)``, ``tensorrt_llm/llmapi/llm.py`` @``4c05a748``). For an architecture whose model
class registered one (``@register_input_processor``), ``create_input_processor`` (``tensorrt_llm/inputs/registry.py``
@``3a5845e2``) constructs it with ``trust_remote_code=True``, whatever the LLM's own ``trust_remote_code``, after
reading the config with ``ModelConfig.from_pretrained(..., trust_remote_code=True)``; the others get the
``DefaultInputProcessor`` (the tokenizer only). Each registered processor loads the model's Hugging Face processor,
``AutoProcessor.from_pretrained(model_dir, ...)`` (:data:`PROCESSOR_ARCHITECTURES`, each with its file), so the
checkpoint must carry the image processor's ``preprocessor_config.json`` even when only text is served:
transformers raises ``OSError("Can't load image processor ...")`` without it (seen with transformers 4.57.1 and
5.24.0, ``tests/test_llmapi_args.py``). ``processor_config.json``, ``video_preprocessor_config.json`` and
``chat_template.json`` are read when present (:data:`PROCESSOR_FILES`). ``MllamaForConditionalGeneration`` registers
no input processor (``modeling_mllama.py`` @``000a01de``: ``@register_auto_model`` only, cross-attention skipped): it
needs none of these. VILA
(``LlavaLlamaModel``) reads its three parts from sub-folders named in config.json (``llm_cfg``,
``vision_tower_cfg``, ``mm_projector_cfg``: ``_get_model_paths`` in ``modeling_vila.py`` @``65f1d153``, which also
calls ``snapshot_download`` for a folder that does not exist).

Code from the checkpoint's repository (``auto_map`` in its config.json, tokenizer_config.json or a processor
config names ``module.Class`` of a ``module.py`` beside it) runs in the server once transformers loads those
classes with ``trust_remote_code=True``, which the input processor always passes. So a checkpoint that names any is
refused unless the operator allowed remote code (``COG_TRITON_LLM_TRUST_REMOTE_CODE``), and then each named
``module.py`` must be in the folder (code of another repository, ``repo--module.Class``, is refused: nothing would
fetch it). Phi-4-multimodal needs its repository's code in every case (``Phi4MMInputProcessor`` raises "trust_remote_code
must be True for Phi4MM", and ``_load_phi4mm_classes`` loads its modeling code: ``modeling_phi4mm.py``
@``024c9727``). The predictor's own tokenizer (the stream processes, ``cog_triton/streaming/generation.py``) loads without
remote code: a tokenizer only its repository's code implements fails there even with the setting.

**Quantization** (:func:`checkpoint_quantization`). ``ModelConfig.from_pretrained`` (``_torch/model_config.py``,
1.2-era stored version) reads, in this order: ``hf_quant_config.json`` (a ModelOpt export:
``quantization.quant_algo``, ``quantization.kv_cache_quant_algo``; ``fp8_pb_wo`` is read as
``FP8_BLOCK_SCALES``; ``MIXED_PRECISION`` also reads ``quant_cfg.json``), else ``config.json``
``quantization_config`` with ``quant_method`` ``fp8`` and a ``weight_block_size`` (DeepSeek's FP8,
``FP8_BLOCK_SCALES``) or ``mxfp4`` (GPT-OSS), else ``dtypes.json`` (MXFP4). Any other ``quantization_config``
(GPTQ, AWQ, bitsandbytes, compressed-tensors, or ModelOpt's ``quant_method: "modelopt"`` without an
``hf_quant_config.json`` beside it: the reader of that shape, ``read_modelopt_quant_config``, came later) is not
read: the weights would load as if unquantized, so such a checkpoint is refused. The ModelOpt algorithms the
PyTorch backend runs (:data:`MODELOPT_QUANT_ALGOS`) are the recipes of the "Quantization" feature page
(nvidia.github.io/TensorRT-LLM/1.0.0/features/quantization.html and the later page: FP4, FP8 per tensor, FP8
block scaling, FP8 rowwise, W4A16/W4A8 AWQ and GPTQ; "the default PyTorch backend supports FP4 and FP8
quantization on the latest Blackwell and Hopper GPUs"), named as ``tensorrt_llm/quantization/mode.py``
``QuantAlgo`` names them, with the GPU each needs (FP8 compute capability 8.9, NVFP4 10.0: ModelOpt's support
matrix, nvidia.github.io/Model-Optimizer/guides/0_support_matrix.html).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from common.errors import IncompatibleWeightsError

if TYPE_CHECKING:
    from tensorrtllm_backend.engine import WeightsInfo
    from tensorrtllm_backend.gpus import GPU

#: The TensorRT-LLM release these facts were recorded for.
FACTS_VERSION = "1.2.1"

_DOCS_1_0 = "1.0.0 Supported Models page"
_INIT = "_torch/models/__init__.py model imports (@015fb89c)"
_NOTES_1_1 = "release notes, Release 1.1 (@001eaece)"
_NOTES_1_2 = "release notes, Release 1.2 (@001eaece)"
_DOCS_1_2 = "supported-models page of the 1.2 line"
_DOCS_1_0_MM = "1.0-era Support Matrix (multimodal, served text-only here)"

#: architectures[0] -> where it was found (see the module docstring); every key is in _arch_index.py @065ff9e9.
PYTORCH_ARCHITECTURES: dict[str, str] = {
    "DeciLMForCausalLM": _DOCS_1_0 + " (Nemotron-NAS: the class NemotronNASForCausalLM is registered under this name)",
    "DeepseekV3ForCausalLM": _DOCS_1_0,
    "DeepseekV32ForCausalLM": _DOCS_1_2,
    "Exaone4ForCausalLM": _DOCS_1_0,
    "ExaoneMoEForCausalLM": _NOTES_1_2 + " (K-EXAONE)",
    "Gemma3ForCausalLM": _DOCS_1_0,
    "Gemma3ForConditionalGeneration": _DOCS_1_0_MM,
    "Glm4MoeForCausalLM": _DOCS_1_2,
    "GptOssForCausalLM": _NOTES_1_1,
    "HCXVisionForCausalLM": _DOCS_1_0_MM,
    "HunYuanDenseV1ForCausalLM": _NOTES_1_1,
    "HunYuanMoEV1ForCausalLM": _NOTES_1_1,
    "LlamaForCausalLM": _DOCS_1_0,
    "Llama4ForConditionalGeneration": _DOCS_1_0,
    "LlavaLlamaModel": _DOCS_1_0_MM,
    "LlavaNextForConditionalGeneration": _DOCS_1_0_MM,
    "MiniMaxM2ForCausalLM": _DOCS_1_2,
    "Mistral3ForConditionalGeneration": _DOCS_1_0_MM,
    "MistralForCausalLM": _DOCS_1_0,
    "MixtralForCausalLM": _DOCS_1_0,
    "MllamaForConditionalGeneration": _DOCS_1_0,
    "NemotronForCausalLM": _DOCS_1_0,
    "NemotronHForCausalLM": _INIT + "; " + _NOTES_1_2 + " (Nemotron Nano V3)",
    "Phi3ForCausalLM": _DOCS_1_2,
    "Phi4MMForCausalLM": "release notes, Release 1.0 (phi-4-multimodal)",
    "Qwen2ForCausalLM": _DOCS_1_0,
    "Qwen2MoeForCausalLM": _INIT,
    "Qwen2VLForConditionalGeneration": _DOCS_1_0_MM,
    "Qwen2_5_VLForConditionalGeneration": _DOCS_1_0_MM,
    "Qwen3ForCausalLM": _DOCS_1_0,
    "Qwen3MoeForCausalLM": _DOCS_1_0,
    "Qwen3NextForCausalLM": _NOTES_1_2,
    "Qwen3VLForConditionalGeneration": _NOTES_1_2,
    "Qwen3VLMoeForConditionalGeneration": _NOTES_1_2,
    "SeedOssForCausalLM": _NOTES_1_1,
    "Starcoder2ForCausalLM": _NOTES_1_2,
}

#: Registered architectures that do not generate text (ModelConfig.is_generation_model; vision encoders).
NOT_TEXT_GENERATION = frozenset({
    "BertForSequenceClassification", "Qwen2ForProcessRewardModel", "Qwen2ForRewardModel", "LlamaForTextEmbedding",
    "CLIPVisionModel", "SiglipVisionModel",
})

_LOADS = "calls AutoProcessor.from_pretrained(model_dir)"
#: Architectures whose PyTorch-backend model registers an input processor loading the Hugging Face processor,
#: which reads preprocessor_config.json -> where (module docstring; files of NVIDIA/TensorRT-LLM's
#: tensorrt_llm/_torch/models/, the nearest stored versions: none is stored at v1.2.1).
PROCESSOR_ARCHITECTURES: dict[str, str] = {
    "Gemma3ForConditionalGeneration": f"modeling_gemma3vl.py @0f8dcd9d: Gemma3InputProcessor {_LOADS}",
    "HCXVisionForCausalLM": f"modeling_hyperclovax.py @47a8c65f: HCXVisionInputProcessor {_LOADS}",
    "Llama4ForConditionalGeneration": f"modeling_llama.py @3a5901cd: Llama4InputProcessor {_LOADS}",
    "LlavaNextForConditionalGeneration": f"modeling_llava_next.py @01a4e59c: LlavaNextInputProcessor {_LOADS}",
    "Mistral3ForConditionalGeneration": f"modeling_mistral.py @002f3cc3: the Hugging Face format's processor {_LOADS}",
    "Phi4MMForCausalLM": f"modeling_phi4mm.py @024c9727: Phi4MMInputProcessor {_LOADS}",
    "Qwen2VLForConditionalGeneration": f"modeling_qwen2vl.py @000a01de: Qwen2VLInputProcessorBase {_LOADS}",
    "Qwen2_5_VLForConditionalGeneration": f"modeling_qwen2vl.py @000a01de: Qwen2VLInputProcessorBase {_LOADS}",
    "Qwen3VLForConditionalGeneration": "modeling_qwen3vl.py @002f3cc3: Qwen3VLInputProcessorBase, a "
                                       f"Qwen2VLInputProcessorBase, {_LOADS}",
    "Qwen3VLMoeForConditionalGeneration": "modeling_qwen3vl.py @002f3cc3: Qwen3VLInputProcessorBase, a "
                                          f"Qwen2VLInputProcessorBase, {_LOADS}",
}
#: Architectures this image serves images for on the PyTorch backend -> the source read (1.2-era stored versions of
#: NVIDIA/TensorRT-LLM; none is stored at v1.2.1). Each registers an input processor that takes the prompt as text
#: with ``multi_modal_data["image"]`` (PIL images) and lets the model's Hugging Face processor tokenize it and expand
#: the placeholders its chat template writes (``tensorrt_llm/inputs/registry.py``). Other registered multimodal
#: architectures (PROCESSOR_ARCHITECTURES) are served text-only: their image path is not verified here.
IMAGE_ARCHITECTURES: dict[str, str] = {
    "Gemma3ForConditionalGeneration": "modeling_gemma3vl.py @0f8dcd9d Gemma3InputProcessor: processor(text=prompt, "
                                      "images=...) expands <start_of_image>; run end to end here over the LLM API "
                                      "stand-in, which emulates it",
    "Qwen2VLForConditionalGeneration": "modeling_qwen2vl.py (index copy 2926488359) Qwen2VLInputProcessorBase: "
                                       "processor(text=[prompt], images=...), the image positions written as "
                                       "vocab_size + 1; read, not run here (its processor needs torchvision)",
    "Qwen2_5_VLForConditionalGeneration": "modeling_qwen2vl.py (index copy 2926488359) Qwen2VLInputProcessorBase, as "
                                          "Qwen2-VL; read, not run here",
    "Qwen3VLForConditionalGeneration": "modeling_qwen3vl.py @002f3cc3 Qwen3VLInputProcessorBase, a "
                                       "Qwen2VLInputProcessorBase; read, not run here",
    "Qwen3VLMoeForConditionalGeneration": "modeling_qwen3vl.py @002f3cc3 Qwen3VLInputProcessorBase, a "
                                          "Qwen2VLInputProcessorBase; read, not run here",
}
#: The Hugging Face processor's files, read from the checkpoint folder when present (preprocessor_config.json is
#: required for :data:`PROCESSOR_ARCHITECTURES`); an hf:// source fetches them (cog_triton.weights.hub).
PROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_FILES = (PROCESSOR_CONFIG, "processor_config.json", "video_preprocessor_config.json", "chat_template.json")
#: Architectures that need their repository's code whatever their files say -> why.
REMOTE_CODE_ARCHITECTURES: dict[str, str] = {
    "Phi4MMForCausalLM": "Phi4MMInputProcessor raises unless trust_remote_code, and the model loads its "
                         "repository's modeling code (_load_phi4mm_classes, modeling_phi4mm.py @024c9727)",
}
#: VILA's sub-models, read from sub-folders named by these config.json keys (modeling_vila.py @65f1d153).
VILA_PARTS = ("llm_cfg", "vision_tower_cfg", "mm_projector_cfg")
#: Files whose ``auto_map`` names code of the checkpoint's repository (transformers' Auto classes read it).
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json", PROCESSOR_CONFIG, "processor_config.json",
                  "video_preprocessor_config.json")
TRUST_REMOTE_CODE_SETTING = "COG_TRITON_LLM_TRUST_REMOTE_CODE"

#: ModelOpt quant_algo (QuantAlgo names) the PyTorch backend serves -> lowest compute capability (None: any GPU
#: the backend runs on).
MODELOPT_QUANT_ALGOS: dict[str, Optional[tuple[int, int]]] = {
    "FP8": (8, 9),
    "FP8_BLOCK_SCALES": (8, 9),
    "FP8_PER_CHANNEL_PER_TOKEN": (8, 9),
    "NVFP4": (10, 0),
    "W4A16_AWQ": None,
    "W4A8_AWQ": (8, 9),
    "W4A16_GPTQ": None,
    "W4A8_GPTQ": (8, 9),
    "MIXED_PRECISION": None,
}
#: hf_quant_config.json spellings read as another QuantAlgo (ModelConfig.load_modelopt_quant_config).
MODELOPT_ALIASES = {"fp8_pb_wo": "FP8_BLOCK_SCALES"}
#: kv_cache_quant_algo values of a ModelOpt export that the PyTorch backend's KV cache takes.
KV_CACHE_QUANT_ALGOS = {"FP8": (8, 9), "NVFP4": (10, 0)}
#: Other quantization the 1.2-era ModelConfig.from_pretrained reads (config.json quantization_config).
OTHER_QUANT_METHODS = {"fp8": "FP8_BLOCK_SCALES", "mxfp4": "MXFP4"}


@dataclass(frozen=True)
class CheckpointQuantization:
    """How a checkpoint is quantized, as the PyTorch backend reads it.

    Attributes:
        algo: the QuantAlgo name (e.g. "FP8", "NVFP4", "FP8_BLOCK_SCALES"), or "" when the file names none.
        kv_cache_algo: the KV cache's ("FP8"), or "".
        source: where it was read: "hf_quant_config.json", "config.json quantization_config" or "dtypes.json".
        method: "modelopt", or config.json's quant_method ("fp8", "mxfp4", "gptq", ...).
        supported: whether TensorRT-LLM 1.2.1's PyTorch backend reads and runs it.
        reason: why not (when not supported), for messages.
    """

    algo: str
    kv_cache_algo: str
    source: str
    method: str
    supported: bool = True
    reason: str = ""

    def describe(self) -> str:
        kv = f", KV cache {self.kv_cache_algo}" if self.kv_cache_algo else ""
        return f"{self.algo or 'unnamed'} ({self.method}, {self.source}{kv})"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def checkpoint_quantization(folder: Path, config: Mapping[str, Any]) -> Optional[CheckpointQuantization]:
    """The quantization of the checkpoint in ``folder`` (``config`` is its config.json), or None when it is not
    quantized. Never raises: an unreadable file gives an unsupported result with the reason."""
    hf_quant = folder / "hf_quant_config.json"
    if hf_quant.is_file():
        data = _read_json(hf_quant)
        section = data.get("quantization") if isinstance(data, dict) else None
        if not isinstance(section, dict):
            return CheckpointQuantization("", "", "hf_quant_config.json", "modelopt", False,
                                          "hf_quant_config.json has no \"quantization\" object (ModelOpt's export "
                                          "writes quantization.quant_algo there)")
        algo = str(section.get("quant_algo") or "")
        algo = MODELOPT_ALIASES.get(algo, algo)
        kv = str(section.get("kv_cache_quant_algo") or "")
        return _judge(CheckpointQuantization(algo, kv, "hf_quant_config.json", "modelopt"))
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping):
        method = str(qc.get("quant_method") or "").lower()
        where = "config.json quantization_config"
        if method.startswith("modelopt"):
            algo = str(qc.get("quant_algo") or "")
            return CheckpointQuantization(
                MODELOPT_ALIASES.get(algo, algo), str(qc.get("kv_cache_quant_algo") or ""), where, "modelopt", False,
                f"ModelOpt quantization given only in config.json (quant_method {qc.get('quant_method')!r}); TensorRT-LLM "
                f"{FACTS_VERSION}'s PyTorch backend reads ModelOpt's settings from hf_quant_config.json "
                "(ModelConfig.from_pretrained): export the checkpoint with ModelOpt's unified Hugging Face export, "
                "which writes hf_quant_config.json, or add that file",
            )
        if method == "fp8" and qc.get("weight_block_size"):
            block = list(qc.get("weight_block_size") or [])
            if block != [128, 128]:
                return CheckpointQuantization("FP8_BLOCK_SCALES", "", where, method, False,
                                              f"weight_block_size {block}: FP8_BLOCK_SCALES only supports (128, 128)")
            return CheckpointQuantization("FP8_BLOCK_SCALES", "", where, method)
        if method == "mxfp4":
            return CheckpointQuantization("MXFP4", "", where, method)
        return CheckpointQuantization(
            "", "", where, method or "unnamed", False,
            f"quant_method {qc.get('quant_method')!r} is not read by TensorRT-LLM {FACTS_VERSION}'s PyTorch backend, "
            "which reads ModelOpt's hf_quant_config.json, FP8 block scales (quant_method fp8 with "
            "weight_block_size) and MXFP4; the weights would load as if unquantized. Give the unquantized checkpoint "
            "or a ModelOpt export (e.g. an nvidia/...-FP8 repository)",
        )
    if (folder / "dtypes.json").is_file():
        return CheckpointQuantization("MXFP4", "", "dtypes.json", "mxfp4")
    return None


def _judge(q: CheckpointQuantization) -> CheckpointQuantization:
    if not q.algo:
        return CheckpointQuantization(q.algo, q.kv_cache_algo, q.source, q.method, True,
                                      "")  # KV-cache-only quantization: weights as they are
    if q.algo not in MODELOPT_QUANT_ALGOS:
        return CheckpointQuantization(
            q.algo, q.kv_cache_algo, q.source, q.method, False,
            f"quant_algo {q.algo} is not one the PyTorch backend of TensorRT-LLM {FACTS_VERSION} runs "
            f"(supported: {', '.join(sorted(MODELOPT_QUANT_ALGOS))})",
        )
    if q.kv_cache_algo and q.kv_cache_algo not in KV_CACHE_QUANT_ALGOS:
        return CheckpointQuantization(
            q.algo, q.kv_cache_algo, q.source, q.method, False,
            f"kv_cache_quant_algo {q.kv_cache_algo} is not one the PyTorch backend's KV cache takes "
            f"(supported: {', '.join(sorted(KV_CACHE_QUANT_ALGOS))})",
        )
    return q


def architecture_support(architecture: str) -> tuple[bool, str]:
    """(served, reason) for ``architectures[0]`` on the PyTorch backend of TensorRT-LLM 1.2.1."""
    if architecture in PYTORCH_ARCHITECTURES:
        return True, PYTORCH_ARCHITECTURES[architecture]
    if architecture in NOT_TEXT_GENERATION:
        return False, (f"architecture {architecture} is registered in TensorRT-LLM {FACTS_VERSION}'s PyTorch backend "
                       "but does not generate text (a classifier, reward, embedding or vision model); this image "
                       "serves text generation")
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(architecture, PYTORCH_ARCHITECTURES, n=3, cutoff=0.6)
    hint = f" (close: {', '.join(close)})" if close else ""
    return False, (
        f"architecture {architecture or '(none: config.json has no architectures)'} is not in TensorRT-LLM "
        f"{FACTS_VERSION}'s PyTorch backend model registry{hint}; supported: {', '.join(sorted(PYTORCH_ARCHITECTURES))}"
        ". Serve it with a prebuilt engine if TensorRT-LLM builds one for it, or with COG_TRITON_CHECKPOINT_BACKEND="
        "reference on the CPU"
    )


@dataclass(frozen=True)
class CodeReference:
    """An ``auto_map`` entry: ``file`` names ``auto_class`` (e.g. "AutoConfig") -> ``reference``
    ("module.Class", or "owner/repo--module.Class" for another repository's code)."""

    file: str
    auto_class: str
    reference: str

    @property
    def module_file(self) -> Optional[str]:
        """The ``module.py`` a reference of this repository needs beside it; None for another repository's."""
        if "--" in self.reference or "/" in self.reference or "." not in self.reference:
            return None
        return self.reference.rsplit(".", 1)[0].replace(".", "/") + ".py"

    def describe(self) -> str:
        return f"{self.file} auto_map {self.auto_class}: {self.reference}"


def remote_code_references(*folders: Path) -> list[CodeReference]:
    """Every ``auto_map`` entry of :data:`AUTO_MAP_FILES` in ``folders`` (the checkpoint folder and the tokenizer's,
    each read once), in file order; an unreadable file has none."""
    found: list[CodeReference] = []
    for folder in dict.fromkeys(folders):
        for name in AUTO_MAP_FILES:
            data = _read_json(folder / name) if (folder / name).is_file() else None
            auto_map = data.get("auto_map") if isinstance(data, dict) else None
            if not isinstance(auto_map, Mapping):
                continue
            for auto_class, value in auto_map.items():
                for reference in value if isinstance(value, list) else [value]:
                    if isinstance(reference, str) and reference.strip():
                        found.append(CodeReference(name, str(auto_class), reference.strip()))
    return found


def check_checkpoint_files(info: "WeightsInfo", trust_remote_code: bool = False) -> None:
    """Refuse a checkpoint whose folder lacks what TensorRT-LLM 1.2.1's ``LLM(...)`` reads beside the weights for its
    architecture, or that needs its repository's code while remote code is not allowed (module docstring: "Files
    beyond the weights, and remote code").

    Args:
        info: the inspected checkpoint (``weights_dir``, ``tokenizer_dir``, ``architecture``, ``config``).
        trust_remote_code: the operator allowed the checkpoint's own code (``COG_TRITON_LLM_TRUST_REMOTE_CODE``).

    Raises:
        IncompatibleWeightsError: naming the file, the ``auto_map`` entry or the sub-folder, where it comes from, and
            the fix (the setting, or the files to add).
    """
    folder, arch = info.weights_dir, info.architecture
    references = remote_code_references(folder, info.tokenizer_dir)
    needs_code = REMOTE_CODE_ARCHITECTURES.get(arch)
    if not trust_remote_code and (references or needs_code):
        what = (f"architecture {arch} needs its repository's code ({needs_code})" if needs_code else
                "the checkpoint names code of its repository ("
                + "; ".join(r.describe() for r in references[:3])
                + (f"; and {len(references) - 3} more" if len(references) > 3 else "") + ")")
        raise IncompatibleWeightsError(
            f"{folder}: {what}. That code would run inside the server: TensorRT-LLM {FACTS_VERSION}'s input processor "
            "loads the model's configuration and processor with trust_remote_code=True. This image runs no code of a "
            f"checkpoint unless {TRUST_REMOTE_CODE_SETTING}=true; set it only for a repository you trust (its code runs "
            "with the server's rights and sees its environment, tokens included), or serve a checkpoint whose "
            "architecture transformers implements"
        )
    for reference in references:
        module = reference.module_file
        if module is None:
            raise IncompatibleWeightsError(
                f"{folder}: {reference.describe()} is code of another repository, which this image does not fetch "
                "(nor lets transformers fetch): serve a checkpoint whose own folder holds its code"
            )
        if not (folder / module).is_file() and not (info.tokenizer_dir / module).is_file():
            raise IncompatibleWeightsError(
                f"{folder}: {reference.describe()} needs {module} beside it, and the checkpoint lacks it. With "
                f"{TRUST_REMOTE_CODE_SETTING}=true an hf:// source fetches the repository's top-level *.py files; an "
                "archive or folder must include them"
            )
    if arch in PROCESSOR_ARCHITECTURES and not (folder / PROCESSOR_CONFIG).is_file():
        raise IncompatibleWeightsError(
            f"{folder}: architecture {arch} is multimodal, and TensorRT-LLM {FACTS_VERSION} loads its Hugging Face "
            f"processor when it loads the model, even to serve text ({PROCESSOR_ARCHITECTURES[arch]}); that reads "
            f"{PROCESSOR_CONFIG}, which the checkpoint lacks. Add the repository's {PROCESSOR_CONFIG} (and "
            "processor_config.json, video_preprocessor_config.json, chat_template.json where it has them) to the "
            "weights; an hf:// source fetches them"
        )
    if arch == "LlavaLlamaModel":
        for key in VILA_PARTS:
            part = info.config.get(key)
            # a sub-config: <folder>/<basename of its _name_or_path>; a string: that path as it is
            name = part.get("_name_or_path") if isinstance(part, dict) else part
            where = ((folder / Path(name.strip("/")).name) if isinstance(part, dict) else Path(name)) \
                if isinstance(name, str) and name.strip("/") else None
            if where is None or not where.is_dir():
                raise IncompatibleWeightsError(
                    f"{folder}: architecture LlavaLlamaModel (VILA) loads its parts from the folders config.json "
                    f"names ({', '.join(VILA_PARTS)}: modeling_vila.py @65f1d153 _get_model_paths); {key} "
                    + (f"names {where}, which does not exist" if where else "is missing or names no folder")
                    + ". Give an archive or folder holding them (an hf:// source fetches top-level files only)"
                )


def check_pytorch_checkpoint(info: "WeightsInfo", gpus: Sequence["GPU"] = (), trust_remote_code: bool = False, *,
                             read_files: bool = True,
                             files_refusal: Optional[IncompatibleWeightsError] = None) -> None:
    """Refuse a checkpoint that TensorRT-LLM 1.2.1's PyTorch backend cannot serve, before Triton starts.

    Args:
        info: :func:`tensorrtllm_backend.engine.inspect_weights` of a checkpoint (kind "hf_checkpoint").
        gpus: the visible GPUs; when given, a quantization is checked against the first one's compute capability.
        trust_remote_code: the operator allowed the checkpoint's own code (:func:`check_checkpoint_files`).
        read_files: run :func:`check_checkpoint_files` here; False: its outcome was read before, and
            ``files_refusal`` is what it raised (None: nothing), raised here in its place (a caller that reads
            nothing itself, cog_triton.worker.planning).

    Raises:
        IncompatibleWeightsError: an engine was given, the architecture is not served, the checkpoint lacks a file
            its architecture needs or needs code that is not allowed (:func:`check_checkpoint_files`), the
            quantization is not read or not run by the backend, or the GPU is too old for it; the message names the
            value and what is allowed.
    """
    if info.kind != "hf_checkpoint":
        raise IncompatibleWeightsError(
            f"the PyTorch backend serves Hugging Face checkpoints; {info.weights_dir} holds a TensorRT-LLM engine, "
            "which the C++ backend serves"
        )
    served, reason = architecture_support(info.architecture)
    if not served:
        raise IncompatibleWeightsError(f"{info.weights_dir}: {reason}")
    if read_files:
        check_checkpoint_files(info, trust_remote_code)
    elif files_refusal is not None:
        raise files_refusal
    q = info.quantization
    if q is None:
        return
    if not q.supported:
        raise IncompatibleWeightsError(f"{info.weights_dir}: quantized checkpoint {q.describe()}: {q.reason}")
    if gpus:
        gpu = gpus[0]
        for what, value, table in (("quant_algo", q.algo, MODELOPT_QUANT_ALGOS),
                                   ("kv_cache_quant_algo", q.kv_cache_algo, KV_CACHE_QUANT_ALGOS)):
            need = table.get(value) if value else None
            if need is not None and gpu.capability < need:
                raise IncompatibleWeightsError(
                    f"{info.weights_dir}: {what} {value} needs a GPU of compute capability {need[0]}.{need[1]} or "
                    f"newer, but GPU {gpu.index} ({gpu.name}) has {gpu.compute_capability}: use the unquantized "
                    "checkpoint, another quantization, or a newer GPU"
                )


__all__ = (
    "AUTO_MAP_FILES", "FACTS_VERSION", "IMAGE_ARCHITECTURES", "KV_CACHE_QUANT_ALGOS", "MODELOPT_QUANT_ALGOS", "NOT_TEXT_GENERATION",
    "PROCESSOR_ARCHITECTURES", "PROCESSOR_CONFIG", "PROCESSOR_FILES", "PYTORCH_ARCHITECTURES",
    "REMOTE_CODE_ARCHITECTURES", "TRUST_REMOTE_CODE_SETTING", "CheckpointQuantization", "CodeReference",
    "architecture_support", "check_checkpoint_files", "check_pytorch_checkpoint", "checkpoint_quantization",
    "remote_code_references",
)
