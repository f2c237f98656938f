"""The benchmark's ``tensorrt_llm`` for ``scripts/benchmark --engine pytorch``: the product's PyTorch-backend model
(``triton_model_repo/tensorrt_llm_pytorch/1/model.py``, loaded from the path in the ``pytorch_model`` parameter,
unchanged but for where its LLM arguments come from) over the LLM API stand-in in its paced mode
(``benchmarks/llmapi_standin``: a text's tokens at a fixed step, no network). Never served by the product image.

setup() renders this folder as ``tensorrt_llm`` when ``COG_TRITON_TEMPLATE_DIR`` points at the template folder
``benchmarks.stack.write_pytorch_standin_templates`` writes (in place of ``tensorrt_llm_reference``, the folder
setup() renders for a Hugging Face checkpoint), so the real Cog server and predictor run over it. This wrapper:

* puts the stand-in's folder (``standin_root``) on ``sys.path``, and the entries of ``PYTHONPATH``, which
  Triton's Python backend stub ignores (on the GPU host the benchmark's packages travel on ``PYTHONPATH``);
* turns the stand-in's paced mode on (``LLMAPI_STANDIN_STEP_MS`` = ``step_ms``, ``LLMAPI_STANDIN_TEXT`` =
  ``text_file``) before the product model builds its LLM;
* gives the product model its LLM arguments from the rendered parameters (``load_llm_args``): ``model`` =
  ``hf_model_dir``, ``max_batch_size`` = the config's ``max_batch_size``, ``max_seq_len``, ``sampler_type``
  (``benchmarks.stack`` sets TRTLLMSampler: its requests carry ``min_tokens`` and seeds), ``stream_interval``
  (``scripts/benchmark --llm-stream-interval``).

One instance, as upstream's ``llmapi`` model (triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt
@0a710573: ``count: 1``): one LLM per GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

MODULE_NAME = "benchmark_pytorch_model"


def _param(params: dict, key: str) -> str:
    value = params.get(key)
    raw = value.get("string_value", "") if isinstance(value, dict) else ""
    return "" if raw.strip().startswith("${") else raw.strip()


def load_product_model(path: str):
    """Import the product's PyTorch-backend model.py at ``path`` (once per process)."""
    module = sys.modules.get(MODULE_NAME)
    if module is not None:
        return module
    if not Path(path).is_file():
        raise ValueError(f"parameter pytorch_model: {path} is not a file (the product's tensorrt_llm_pytorch model.py)")
    # a package of its folder: the model imports the modules beside it relatively, as in Triton (1.model)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path,
                                                  submodule_search_locations=[str(Path(path).parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE_NAME]
        raise
    return module


class TritonPythonModel:
    """What Triton loads: the product model with the benchmark's LLM arguments (see the module docstring)."""

    def initialize(self, args) -> None:
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        root = _param(params, "standin_root")
        if not root or not Path(root, "tensorrt_llm").is_dir():
            raise ValueError(f"parameter standin_root: {root!r} does not hold the LLM API stand-in (tensorrt_llm/)")
        sys.path.insert(0, root)
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if entry and entry not in sys.path:
                sys.path.append(entry)
        os.environ["LLMAPI_STANDIN_STEP_MS"] = _param(params, "step_ms")
        os.environ["LLMAPI_STANDIN_TEXT"] = _param(params, "text_file")
        llm_args = {"model": _param(params, "hf_model_dir"), "max_batch_size": int(config["max_batch_size"])}
        if _param(params, "max_seq_len"):
            llm_args["max_seq_len"] = int(_param(params, "max_seq_len"))
        if _param(params, "sampler_type"):
            llm_args["sampler_type"] = _param(params, "sampler_type")
        if _param(params, "stream_interval") not in ("", "1"):
            llm_args["stream_interval"] = int(_param(params, "stream_interval"))
        product = load_product_model(_param(params, "pytorch_model"))

        class BenchmarkModel(product.TritonPythonModel):
            def load_llm_args(self, params: dict) -> dict:
                return dict(llm_args)

        self._impl = BenchmarkModel()
        self._impl.initialize(args)

    def execute(self, requests):
        return self._impl.execute(requests)

    def finalize(self) -> None:
        impl = getattr(self, "_impl", None)
        if impl is not None:
            impl.finalize()
