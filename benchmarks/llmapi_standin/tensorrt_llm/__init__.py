"""Stand-in for the ``tensorrt_llm`` package of TensorRT-LLM 1.2.1: only the LLM API the PyTorch-backend
Triton model uses (``LLM``, ``SamplingParams``, ``GuidedDecodingParams``, ``LoRARequest``, streamed
``RequestOutput``), for tests and the benchmark. Never part of the served image (see README.md beside this
package).

Upstream the top-level package exports ``LLM`` and ``SamplingParams`` (the Triton ``llmapi`` model imports
``from tensorrt_llm import LLM, SamplingParams``: triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
@b35ac1b6).
"""

from .executor.request import LoRARequest
from .llmapi.llm import LLM, RequestOutput
from .sampling_params import GuidedDecodingParams, SamplingParams
from .version import __version__

#: Marks this package as the stand-in (the real one has no such attribute).
STANDIN = True

__all__ = ["LLM", "GuidedDecodingParams", "LoRARequest", "RequestOutput", "SamplingParams", "STANDIN", "__version__"]
