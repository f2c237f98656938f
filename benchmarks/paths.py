"""The benchmark's paths, default points, prompts and process roles (constants shared by its modules).

Part of ``scripts/benchmark`` (:mod:`benchmarks.harness`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from cog_triton.settings import REPO_ROOT

log = logging.getLogger("benchmark")


ARCHIVE = REPO_ROOT / "build" / "default_model" / "smollm2-135m-instruct.tar.gz"


STANDIN_DIR = REPO_ROOT / "benchmarks" / "standin"


STANDIN_TEXT = STANDIN_DIR / "text.txt"


REFERENCE_MODEL = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_reference" / "1" / "model.py"


#: ``--engine pytorch``: the product's PyTorch-backend model, its benchmark wrapper and the LLM API stand-in.
PYTORCH_MODEL_DIR = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_pytorch"


PYTORCH_STANDIN_DIR = REPO_ROOT / "benchmarks" / "standin_pytorch"


LLMAPI_STANDIN_ROOT = REPO_ROOT / "benchmarks" / "llmapi_standin"


#: Engines that emit the stand-in text's tokens at a fixed step (their output is known in advance).
PACED_ENGINES = ("standin", "pytorch")


PATHS = ("tensorrt_llm", "ensemble_ids", "cog", "floor")


GUIDED_PATH = "cog_json"


LORA_PATH = "cog_lora"


FLOOR_PATH = "floor"


FLOOR_DIR = REPO_ROOT / "benchmarks" / "floor"


ALL_PATHS = PATHS + (GUIDED_PATH, LORA_PATH)


COG_PATHS = ("cog", GUIDED_PATH, FLOOR_PATH, LORA_PATH)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


DEFAULT_CONCURRENCY = (1, 8, 32, 64, 128)


REFERENCE_CONCURRENCY = (1, 2, 4)


SMOKE_CONCURRENCY = (1, 4)


PROMPT = "Write a short essay about the history of printing."


GUIDED_PROMPT = "Describe one famous early printed book as JSON."


#: The guide of ``cog_json`` requests: nested, with an array, an enum and bounded numbers; small
#: enough to close well within the default 64 tokens of --engine reference.
GUIDED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "year": {"type": "integer", "minimum": 1400, "maximum": 1900},
        "language": {"type": "string", "enum": ["Latin", "German", "English", "other"]},
        "printer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}},
                    "required": ["name"], "additionalProperties": False},
    },
    "required": ["title", "year", "language", "printer"],
    "additionalProperties": False,
}


CLK_TCK = os.sysconf("SC_CLK_TCK")


CORE_ROLES = ("tritonserver", "stub:tensorrt_llm", "stub:preprocessing", "cog_server", "cog_worker", "stream_proc",
              "loadgen")


SERVER_ROLES = ("tritonserver", "stub:tensorrt_llm", "stub:preprocessing", "cog_server", "cog_worker", "stream_proc")
