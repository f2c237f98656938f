"""``tensorrt_llm.llmapi`` (stand-in): the names the PyTorch-backend Triton model imports from here upstream
(``LLM``, ``MpiCommSession``, ``RequestOutput``; triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
@b35ac1b6) and the config classes."""

from ..executor.request import LoRARequest
from ..sampling_params import GuidedDecodingParams, SamplingParams
from .llm import LLM, RequestOutput
from .llm_args import CudaGraphConfig, KvCacheConfig, LoraConfig, PeftCacheConfig, SchedulerConfig, TorchLlmArgs
from .mpi_session import MpiCommSession

__all__ = ["CudaGraphConfig", "GuidedDecodingParams", "KvCacheConfig", "LLM", "LoRARequest", "LoraConfig",
           "MpiCommSession", "PeftCacheConfig", "RequestOutput", "SamplingParams", "SchedulerConfig",
           "TorchLlmArgs"]
