"""``LLM`` of TensorRT-LLM 1.2.1's LLM API, PyTorch backend (stand-in).

Facts followed (NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm.py`` @4c05a748, the nearest stored version):

* ``LLM(model, tokenizer=None, tokenizer_mode='auto', skip_tokenizer_init=False, trust_remote_code=False,
  tensor_parallel_size=1, dtype='auto', revision=None, tokenizer_revision=None, **kwargs)``; ``LLM`` is the
  PyTorch one (``_TorchLLM``: ``backend`` defaults to 'pytorch');
* ``BaseLLM.__init__`` refuses a keyword that is not a ``TorchLlmArgs`` field, ``_mpi_session`` or ``backend``
  with ``ValueError("<class name> got invalid argument: <key>")``, then builds the arguments with pydantic (a
  nested unknown key fails there), logging "Failed to parse the arguments for the LLM constructor: ..." and
  re-raising; a multi-GPU world checks the device count ("Only N GPUs are available, but M are required.");
* ``generate_async(inputs, sampling_params=None, lora_request=None, prompt_adapter_request=None,
  streaming=False, kv_cache_retention_config=None, disaggregated_params=None, _postproc_params=None,
  scheduling_params=None, cache_salt=None)``: "LLM is shutting down" (RuntimeError) after shutdown;
  ``_prepare_sampling_params`` (no ``end_id`` and no tokenizer: ValueError; otherwise ``_setup``; a non
  ``SamplingParams``: TypeError); inputs as ``prompt_inputs`` (a ``list[int]`` is the prompt's token ids);
  ``_check_arguments`` for the PyTorch backend: without chunked prefill, a prompt longer than
  ``max_num_tokens`` is refused ("The sum of prompt length (P), query length (0) should not exceed
  max_num_tokens (N)", P printed as prompt_len / cp_size, a float);
* the worker's ``_deduce_max_tokens`` (``executor/base_worker.py`` @7b437aaa): ``max_tokens`` above
  ``max_seq_len - prompt length`` is reduced to it with a warning ("User-specified `max_tokens` (M) is greater
  than deduced `default_max_tokens` (D), using default_max_tokens instead."); ``max_seq_len`` is the argument,
  else what the model engine sets (the checkpoint's ``max_position_embeddings`` here);
* prompts (``generate_async`` @323158958, the 1.2-era index copy of ``llm.py`` nearest 1.2.1: ``orchestrator_type``
  and ``TrtLlmArgs`` still there): ``inputs`` go through ``prompt_inputs`` (``inputs/data.py``); token ids **with**
  ``multi_modal_data`` on a checkpoint whose input processor is not the default one are decoded with
  ``self.tokenizer`` into a text prompt ("VLMs need to process/tokenize the prompt in their own way"; an
  ``AttributeError`` without a tokenizer) and ``sampling_params.add_special_tokens`` set False; token ids are then the
  prompt as they are (**their images dropped** on a text-only checkpoint); a text prompt with ``multi_modal_data``
  runs through ``create_input_processor_with_hash(self.input_processor)``, one without through the input processor
  itself (``inputs/registry.py`` has both); ``RequestOutput.prompt_token_ids`` are the processor's ids (for an
  image, its expanded tokens) and ``prompt`` the text;
* ``LLM.tokenizer`` is the input processor's tokenizer (``BaseLLM.tokenizer`` property; ``_TorchLLM._build_model``
  makes the input processor with the loaded tokenizer, None under ``skip_tokenizer_init``);
* ``shutdown()`` stops the executor;
* a worker stopped by a failure outside the ``RequestError`` path (a LoRA load, see :mod:`.._standin.engine`):
  the next ``generate_async`` raises that failure and shuts the executor down (``executor/executor.py``
  ``_handle_background_error``: the proxy's ``submit`` calls it), and later ones raise "LLM is shutting down";
* the sampler is chosen once for the LLM from ``sampler_type`` and ``max_beam_width`` (see
  :mod:`.._standin.engine`; ``self.sampler`` names it, a stand-in attribute).

Paced mode (stand-in only): see README.md beside the package.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

from ..executor.request import LoRARequest
from ..executor.result import GenerationResult
from ..sampling_params import SamplingParams
from .llm_args import TorchLlmArgs

logger = logging.getLogger("tensorrt_llm")

#: The stand-in's paced mode (environment of the process that builds the LLM).
STEP_MS_ENV = "LLMAPI_STANDIN_STEP_MS"
TEXT_ENV = "LLMAPI_STANDIN_TEXT"
#: Its scripted mode, within the paced mode (tests only: ``_standin/engine.py`` ``ScriptedState``).
SCRIPT_ENV = "LLMAPI_STANDIN_SCRIPT"
#: BuildConfig's default max_batch_size, which the PyTorch backend falls back to (unverified at 1.2.1).
DEFAULT_MAX_BATCH_SIZE = 2048


class RequestOutput(GenerationResult):
    """The output of one request (``tensorrt_llm.llmapi.llm.RequestOutput``): request_id, prompt_token_ids,
    outputs, finished, abort(), aborted(); iterate it with ``async for`` (see ``executor/result.py``)."""

    _prompt: Optional[str] = None

    @property
    def prompt(self) -> Optional[str]:
        return self._prompt


class LLM:
    """The LLM API's entry point, PyTorch backend (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, model: Union[str, Path], tokenizer: Any = None, tokenizer_mode: str = "auto",
                 skip_tokenizer_init: bool = False, trust_remote_code: bool = False, tensor_parallel_size: int = 1,
                 dtype: str = "auto", revision: Optional[str] = None, tokenizer_revision: Optional[str] = None,
                 **kwargs: Any) -> None:
        self._executor = None
        kwargs.setdefault("backend", "pytorch")
        try:
            valid = set(TorchLlmArgs.model_fields) | {"_mpi_session", "backend"}
            for key in kwargs:
                if key not in valid:
                    raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
            self.args = TorchLlmArgs.from_kwargs(
                model=model, tokenizer=tokenizer, tokenizer_mode=tokenizer_mode,
                skip_tokenizer_init=skip_tokenizer_init, trust_remote_code=trust_remote_code,
                tensor_parallel_size=tensor_parallel_size, dtype=dtype, revision=revision,
                tokenizer_revision=tokenizer_revision, **kwargs)
        except Exception as exc:
            logger.error(f"Failed to parse the arguments for the LLM constructor: {exc}")
            raise
        self.mpi_session = self.args.mpi_session
        if self.args.world_size > 1:
            import torch  # noqa: PLC0415

            if torch.cuda.device_count() < self.args.world_size:
                raise RuntimeError(f"Only {torch.cuda.device_count()} GPUs are available, but "
                                   f"{self.args.world_size} are required.")
        self._build()

    # -- building ---------------------------------------------------------------------------------
    def _build(self) -> None:
        from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415

        from .._standin.engine import Engine, instantiate_sampler, load_scripts, text_token_ids  # noqa: PLC0415
        from .._standin.lora import (  # noqa: PLC0415
            ABORT_DELAY_MS_ENV,
            LORA_DEVICE_BYTES_ENV,
            LoraStore,
            LoraWorker,
            dtype_bytes,
        )

        args = self.args
        model_dir = str(args.model)
        self.tokenizer = None
        if not args.skip_tokenizer_init:
            self.tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer or model_dir), local_files_only=True,
                                                           use_fast=args.tokenizer_mode != "slow")
        from ..inputs.registry import create_input_processor  # noqa: PLC0415

        self.input_processor = create_input_processor(model_dir, self.tokenizer)
        self.tokenizer = getattr(self.input_processor, "tokenizer", self.tokenizer)
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        architecture = (getattr(config, "architectures", None) or [""])[0]
        text_config = getattr(config, "text_config", None) or config  # Gemma3VLM.infer_max_seq_len: the LLM's
        self.max_seq_len = int(args.max_seq_len or getattr(text_config, "max_position_embeddings", 0) or 2048)
        image_token = getattr(config, "image_token_index", None)
        step_ms = os.environ.get(STEP_MS_ENV, "").strip()
        model = lora = compiler = lora_worker = None
        cycle: List[int] = []
        if step_ms:
            if self.tokenizer is None:
                raise ValueError(f"stand-in: {STEP_MS_ENV} (paced mode) needs the tokenizer")
            text = os.environ.get(TEXT_ENV, "")
            if not text or not Path(text).is_file():
                raise ValueError(f"stand-in: {STEP_MS_ENV} is set but {TEXT_ENV}={text!r} is not a file")
            cycle = text_token_ids(self.tokenizer, Path(text).read_text(encoding="utf-8"))
            vocab = int(getattr(config, "vocab_size", 0) or len(self.tokenizer))
            step_s = float(step_ms) / 1e3
            if step_s <= 0:
                raise ValueError(f"stand-in: {STEP_MS_ENV} must be positive, got {step_ms}")
            script = os.environ.get(SCRIPT_ENV, "").strip()
            scripts = load_scripts(script) if script else None
            if scripts is not None:  # scripted mode replays a guided request's tokens through its guide
                compiler = self._grammar_compiler(vocab)
        else:
            step_s = None
            scripts = None
            import torch  # noqa: PLC0415
            from transformers import AutoModelForCausalLM  # noqa: PLC0415

            if architecture == "Gemma3ForConditionalGeneration":
                from transformers import Gemma3ForConditionalGeneration as model_class  # noqa: PLC0415
            else:
                model_class = AutoModelForCausalLM
            model = model_class.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
            model.eval()
            model.requires_grad_(False)
            vocab = int(model.get_input_embeddings().num_embeddings)
            if args.lora_config is not None:
                lora = LoraStore(model, args.lora_config.max_lora_rank, args.lora_config.max_cpu_loras)
                budget = os.environ.get(LORA_DEVICE_BYTES_ENV, "").strip()
                dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16"
                lora_worker = LoraWorker(dtype_bytes(dtype), int(budget) if budget else None)
            compiler = self._grammar_compiler(vocab)
        self.vocab_size = vocab
        if args.speculative_config is not None:
            raise ValueError("stand-in: speculative decoding (its sampler replaces sampler_type) is not emulated")
        self.sampler = instantiate_sampler(args.sampler_type, args.max_beam_width)
        self._executor = Engine(
            max_batch_size=int(args.max_batch_size or DEFAULT_MAX_BATCH_SIZE), vocab_size=vocab, model=model,
            lora=lora, grammar_compiler=compiler, paced_step_s=step_s, cycle=cycle, log=logger.warning,
            sampler=self.sampler, stream_interval=args.stream_interval, scripts=scripts, tokenizer=self.tokenizer,
            lora_worker=lora_worker, abort_delay_s=float(os.environ.get(ABORT_DELAY_MS_ENV, "").strip() or 0) / 1e3,
            image_token_id=image_token)

    def _grammar_compiler(self, vocab: int) -> Any:
        """xgrammar's compiler for ``guided_decoding_backend='xgrammar'`` (None without a backend).

        Raises:
            ValueError: another backend (not emulated).
        """
        backend = self.args.guided_decoding_backend
        if backend is None:
            return None
        if backend != "xgrammar":
            raise ValueError(f"stand-in: guided_decoding_backend {backend!r} is not emulated")
        import xgrammar  # noqa: PLC0415

        info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab,
                                                       stop_token_ids=[int(self.tokenizer.eos_token_id)])
        return xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)

    # -- generation -------------------------------------------------------------------------------
    def generate_async(self, inputs: Any, sampling_params: Optional[SamplingParams] = None,
                       lora_request: Optional[LoRARequest] = None, prompt_adapter_request: Any = None,
                       streaming: bool = False, kv_cache_retention_config: Any = None,
                       disaggregated_params: Any = None, _postproc_params: Any = None,
                       scheduling_params: Any = None, cache_salt: Optional[str] = None) -> RequestOutput:
        """Submit one request; returns its :class:`RequestOutput` at once (see the module docstring)."""
        if self._executor is None or self._executor.is_shutdown():
            raise RuntimeError("LLM is shutting down")
        if self._executor.error is not None:  # the worker died: _handle_background_error raises it and shuts down
            error = self._executor.error
            self.shutdown()
            raise error
        sampling_params = self._prepare_sampling_params(sampling_params)
        prompt, text, multimodal = self._process_inputs(inputs, sampling_params)
        self._check_arguments(len(prompt), 0, sampling_params)
        max_new = self._deduce_max_tokens(len(prompt), sampling_params.max_tokens)
        from .._standin.engine import ActiveRequest  # noqa: PLC0415

        request_id = next(self._ids)
        result = RequestOutput(request_id, prompt, sampling_params, bool(streaming), self._executor,
                               tokenizer=self.tokenizer)
        result._prompt = text
        lora = lora_request if self.args.lora_config is not None else None
        self._executor.submit(ActiveRequest(request_id, prompt, sampling_params, bool(streaming), result, max_new,
                                            lora=lora, multimodal=multimodal))
        return result

    def _prepare_sampling_params(self, sampling_params: Optional[SamplingParams]) -> SamplingParams:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"The sampling_params must be type SamplingParams or None, but got {type(sampling_params)}")
        if sampling_params.end_id is None:
            if self.tokenizer is None:
                raise ValueError("tokenizer is required to reset end_id if it is None, or you can explicitly specify "
                                 "the end_id for sampling_params")
            sampling_params._setup(self.tokenizer)
        if sampling_params.stop is not None or sampling_params.stop_token_ids or sampling_params.bad is not None:
            raise NotImplementedError("stand-in: stop / stop_token_ids / bad strings are not emulated")
        return sampling_params

    def _process_inputs(self, inputs: Any, sampling_params: SamplingParams) -> Tuple[List[int], Optional[str], Any]:
        """(prompt token ids, prompt text or None, multimodal data or None) of ``inputs`` as ``generate_async`` makes
        them (see the module docstring)."""
        from ..inputs.data import prompt_inputs  # noqa: PLC0415
        from ..inputs.registry import DefaultInputProcessor, create_input_processor_with_hash  # noqa: PLC0415

        inputs = prompt_inputs(inputs)
        if not inputs.get("prompt") and inputs.get("prompt_token_ids") and (
                inputs.get("multi_modal_data") or inputs.get("multi_modal_embeddings")) and not isinstance(
                    self.input_processor, DefaultInputProcessor):
            # VLMs need to process/tokenize the prompt in their own way (upstream's words)
            prompt = self.tokenizer.decode(inputs["prompt_token_ids"])
            inputs = {"prompt": prompt, "multi_modal_data": inputs.get("multi_modal_data"),
                      "mm_processor_kwargs": inputs.get("mm_processor_kwargs")}
            sampling_params.add_special_tokens = False
        if "prompt_token_ids" in inputs:
            return list(inputs["prompt_token_ids"]), None, None
        if "prompt" in inputs:
            if "multi_modal_data" in inputs:
                ids, extra = create_input_processor_with_hash(self.input_processor)(inputs, sampling_params)
            elif "multi_modal_embeddings" in inputs:
                raise NotImplementedError("stand-in: multi_modal_embeddings are not emulated")
            else:
                ids, extra = self.input_processor(inputs, sampling_params)
            data = (extra or {}).get("multimodal_data")
            return list(ids), inputs["prompt"], data or None
        raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")

    def _check_arguments(self, prompt_len: int, query_len: int, sampling_params: SamplingParams) -> None:
        max_num_tokens = self.args.max_num_tokens
        if not self.args.enable_chunked_prefill and max_num_tokens and prompt_len / 1 + query_len > max_num_tokens:
            raise ValueError(f"The sum of prompt length ({prompt_len / 1}), query length ({query_len}) should not exceed "
                             f"max_num_tokens ({max_num_tokens})")

    def _deduce_max_tokens(self, prompt_len: int, max_tokens: Optional[int]) -> int:
        default_max_tokens = self.max_seq_len - prompt_len
        if default_max_tokens <= 0:
            logger.warning(f"`default_max_tokens` ({default_max_tokens}) should be greater than 0, "
                           f"`default_max_tokens` ({default_max_tokens}) = max_seq_len ({self.max_seq_len}) - "
                           f"`splited_prompt_len` ({prompt_len}) - `query_token_len` (0)")
        if max_tokens is None:
            return default_max_tokens
        if max_tokens > default_max_tokens:
            logger.warning(f"User-specified `max_tokens` ({max_tokens}) is greater than deduced `default_max_tokens` "
                           f"({default_max_tokens}), using default_max_tokens instead.")
            return default_max_tokens
        return max_tokens

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.shutdown()
        return False

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["LLM", "RequestOutput"]
