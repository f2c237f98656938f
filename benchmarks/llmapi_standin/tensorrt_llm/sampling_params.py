"""``SamplingParams`` and ``GuidedDecodingParams`` of TensorRT-LLM 1.2.1's LLM API (stand-in).

Facts followed (NVIDIA/TensorRT-LLM ``tensorrt_llm/sampling_params.py`` @b35ac1b6, whose ``version.py``
says 1.2.0rc2, the nearest stored version to v1.2.1 @376f7e1b):

* both are keyword-only dataclasses with slots, so a positional argument or an unknown keyword is a
  ``TypeError``;
* ``SamplingParams.__post_init__`` sets ``pad_id`` to ``end_id`` when unset and ``best_of`` to ``n``, then
  ``_validate``: ``top_p`` in [0, 1] ("require 0 <= top_p <= 1, got top_p=..."), ``top_k >= 0``,
  ``temperature >= 0``, ``best_of >= n``, no ``best_of > 1`` under greedy decoding unless
  ``TLLM_ALLOW_N_GREEDY_DECODING`` is set, ``truncate_prompt_tokens >= 1``, and one guide at most
  ("Only one guide can be used for a request, but got N.");
* greedy decoding (``params_imply_greedy_decoding``): temperature, top_p and top_k all unset, or
  ``top_k == 1``, or ``top_p == 0.0``, or ``temperature == 0``; ``top_k == 0`` means all logits;
* ``min_tokens`` below 1 has no effect; ``seed`` None is the runtime's default 0;
* the other sampling values (repetition penalty > 0, min_tokens >= 0, ...) are checked by the C++
  ``SamplingConfig`` the worker builds from them (``_get_sampling_config``; ``executor/base_worker.py``
  ``_enqueue_request`` @7b437aaa wraps its failure in ``RequestError``): :func:`sampling_config_error` gives
  those texts (``cpp/tensorrt_llm/executor/samplingConfig.cpp`` ``check*``, as the CPU reference model
  quotes them).

Only the fields the PyTorch-backend Triton model sets are acted on by the stand-in's engine; the others
are accepted as upstream accepts them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional, Union


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    """One guide for a request: ``json`` (a JSON Schema as str/dict), ``regex``, ``grammar`` (EBNF),
    ``json_object`` (any JSON) or ``structural_tag``."""

    json: Optional[Union[str, dict, Any]] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    json_object: bool = False
    structural_tag: Optional[str] = None

    def _validate(self) -> None:
        count = sum(bool(getattr(self, f.name)) for f in fields(self))
        if count > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {count}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    """Sampling parameters of one request (see the module docstring for the upstream rules)."""

    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    bad: Optional[Union[str, List[str]]] = None
    bad_token_ids: Optional[List[int]] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: Optional[int] = None
    use_beam_search: bool = False
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    top_p_min: Optional[float] = None
    top_p_reset_ids: Optional[int] = None
    top_p_decay: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    min_tokens: Optional[int] = None
    beam_search_diversity_rate: Optional[float] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    prompt_ignore_length: Optional[int] = None
    length_penalty: Optional[float] = None
    early_stopping: Optional[int] = None
    no_repeat_ngram_size: Optional[int] = None
    min_p: Optional[float] = None
    beam_width_array: Optional[List[int]] = None
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: Optional[List[str]] = None
    lookahead_config: Any = None
    guided_decoding: Optional[GuidedDecodingParams] = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    _stream_interval: Optional[int] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self) -> None:
        if self.top_p is not None and (self.top_p < 0 or self.top_p > 1):
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if (self.best_of is not None and self.best_of > 1 and self._greedy_decoding
                and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING", None)):
            raise ValueError(
                "Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, got "
                f"best_of={self.best_of}. Please set to best_of=1 or set an environment variable "
                "TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy decoding."
            )
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @staticmethod
    def params_imply_greedy_decoding(*, temperature: Optional[float], top_p: Optional[float],
                                     top_k: Optional[int]) -> bool:
        """Whether these values mean greedy decoding (see the module docstring)."""
        return ((temperature is None and top_p is None and top_k is None) or top_k == 1 or top_p == 0.0
                or temperature == 0)

    @property
    def _greedy_decoding(self) -> bool:
        return not self.use_beam_search and self.params_imply_greedy_decoding(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    def _setup(self, tokenizer, hf_model_config=None, generation_config=None,
               add_special_tokens: bool = False) -> "SamplingParams":
        """Fill ``end_id``/``pad_id`` from the tokenizer when ``end_id`` is unset (``LLM._prepare_sampling_params``
        calls it then; a tokenizer is required for it)."""
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id
            if self.pad_id is None:
                self.pad_id = self.end_id
        return self


def _assertion(expression: str) -> str:
    """A failed TLLM_CHECK as the C++ runtime words it (cpp/include/tensorrt_llm/common/assert.h)."""
    return f"[TensorRT-LLM][ERROR] Assertion failed: {expression} (samplingConfig.cpp, stand-in)"


def sampling_config_error(params: SamplingParams) -> Optional[str]:
    """The text the C++ ``SamplingConfig`` constructor would fail with for these values, or None.

    The checks of ``samplingConfig.cpp`` that the values the LLM API passes through can fail (the texts are
    the failed expressions, as the CPU reference model's ``parsing.py`` quotes them).
    """
    checks = (
        (params.top_k is None or params.top_k >= 0, "topK.value() >= 0"),
        (params.top_p is None or params.top_p <= 1.0, "topP.value() <= 1.f"),
        (params.temperature is None or (math.isfinite(params.temperature) and params.temperature >= 0),
         "temperature.value() >= 0.f"),
        (params.repetition_penalty is None
         or (math.isfinite(params.repetition_penalty) and params.repetition_penalty > 0),
         "repetitionpenalty.value() > 0.f"),
        (params.min_tokens is None or params.min_tokens >= 0, "minTokens.value() >= 0"),
        (params.length_penalty is None or params.length_penalty >= 0, "lengthPenalty.value() >= 0.f"),
    )
    for ok, expression in checks:
        if not ok:
            return _assertion(expression)
    return None


__all__ = ["GuidedDecodingParams", "SamplingParams", "sampling_config_error"]
