"""The one place where the serving image and its TensorRT-LLM version are pinned.

The Dockerfile's ``FROM`` line, the model-repository templates (tensor names) and engine checks
all follow these values; ``tests/test_packaging.py`` fails when the Dockerfile drifts from them.

Source of the pairing: Triton's compatibility matrix (triton-inference-server/server,
docs/introduction/compatibility.md): NGC ``tritonserver:26.02-trtllm-python-py3`` ships
TensorRT-LLM 1.1.0 (TensorRT 10.13.3.9, CUDA 13.0.2). The ``inflight_batcher_llm`` tensor names of
that release (``seed``, ``min_tokens``, ``stop_words_list`` ...) are the ones our templates use.
"""

TRITON_IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"
TRITON_IMAGE_TAG = "26.02-trtllm-python-py3"
TRITON_IMAGE = f"{TRITON_IMAGE_REPOSITORY}:{TRITON_IMAGE_TAG}"
TENSORRT_LLM_VERSION = "1.1.0"
