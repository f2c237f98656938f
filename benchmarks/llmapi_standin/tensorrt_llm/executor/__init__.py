"""The executor names the PyTorch-backend Triton model uses: ``LoRARequest`` (``executor/request.py``),
``RequestError`` (``executor/utils.py``) and the result classes (``executor/result.py``) of TensorRT-LLM
1.2.1 (stand-in)."""

from .request import LoRARequest
from .result import CompletionOutput, GenerationResult, Logprob
from .utils import RequestError

__all__ = ["CompletionOutput", "GenerationResult", "Logprob", "LoRARequest", "RequestError"]
