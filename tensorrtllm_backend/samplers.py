"""What each sampler of TensorRT-LLM 1.2.1's PyTorch backend does with a request's sampling inputs, and the
refusal a request gets when its sampler would ignore one of them.

The PyTorch backend samples with one of two samplers, chosen per LLM (``TorchLlmArgs.sampler_type``), not per
request. Sources (NVIDIA/TensorRT-LLM; the search index holds no file of the v1.2.1 commit ``376f7e1b``:
``sampler.py`` was read @``00026bd1``, which has FlashInfer sampling (#8581, 2025-11) and lacks the changes merged
after the release/1.2 cut of 2026-01-15, e.g. #9675):

* **Which sampler** (``_torch/pyexecutor/_util.py`` ``instantiate_sampler``, 1.2-era stored version;
  ``llm_args.py`` ``SamplerType``: ``TRTLLMSampler``, ``TorchSampler``, ``auto``; default ``auto``): a one-model
  speculative decoder replaces both (checked before ``sampler_type``); else ``TRTLLMSampler`` when
  ``sampler_type`` is ``TRTLLMSampler``, or ``auto`` with beam search (``max_beam_width > 1``); else
  ``TorchSampler``. This image sets no ``max_beam_width`` and takes no beam search, so ``auto`` is TorchSampler.
* **TorchSampler** (``sampler.py`` @00026bd1 ``TorchSampler``) reads only temperature, top_k and top_p from a
  request's sampling config:

  - repetition, presence and frequency penalties are accepted by ``SamplingParams`` and silently ignored (added
    to TorchSampler by PR #16485, 2026-07-16, whose description says so);
  - ``bad``/``bad_token_ids`` are ignored (PR #16052, 2026-07-07);
  - ``seed`` is ignored: one ``torch.Generator`` seeded once with ``_global_seed = 42`` serves every request
    (per-request seeds: PR #17172, 2026-08);
  - ``min_tokens``: ``_apply_min_length_penalty`` bans the end token while the request's tokens *prompt
    included* plus the step are below ``min_tokens``, so it holds nothing back once the prompt is that long
    (fixed by PR #12166, 2026-03-12; with no end token it bans the last vocabulary id instead, PR #12358): not
    applied as asked;
  - log-probs (``logprobs=1``): ``torch.topk`` over the ``log_softmax`` of the raw logits, before sampling and
    without temperature: the arg-max token's value, keyed by that token, which is the sampled token only when
    decoding is greedy;
  - stop words, the end token and guided decoding (a bitmask applied by the executor before either sampler)
    are applied.
* **TRTLLMSampler** (the same file, ``TRTLLMSampler``, over the C++ ``GptDecoderBatched``): the request's whole
  C++ ``SamplingConfig`` (``SamplingParams._get_sampling_config`` copies every field of the same name), so the
  penalties, ``min_tokens``, ``seed`` (per request; unset: 0), bad and stop words apply as on the C++ backend;
  log-probs are the sampled token's (``update_requests_single_beam_single_step``). It runs with the overlap
  scheduler and guided decoding; it is deprecated after 1.2 (PR #11938, 2026-03) and removed in 1.4 (PR
  #18232), so it is not the default here.

:func:`refusal` is used twice with the same facts: by the PyTorch-backend ``tensorrt_llm`` Triton model for each
request (``triton_model_repo/tensorrt_llm_pytorch/1/samplers.py`` is a link to this file), and by the predictor
before a request leaves the Cog worker (so a Cog caller gets an input error at once). Pure: no imports beyond
the standard library (the Triton model imports it inside Triton's Python backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

TORCH_SAMPLER = "TorchSampler"
TRTLLM_SAMPLER = "TRTLLMSampler"
AUTO = "auto"
#: ``TorchLlmArgs.sampler_type`` values (llm_args.py ``SamplerType``, 1.2-era).
SAMPLER_TYPES = (AUTO, TORCH_SAMPLER, TRTLLM_SAMPLER)
#: The release these facts were read for.
RELEASE = "TensorRT-LLM 1.2.1"
#: How an operator of this image chooses the sampler (cog_triton.settings), named in refusals.
SETTING = "COG_TRITON_LLM_SAMPLER"


def effective_sampler(llm_args: Mapping[str, Any]) -> str:
    """The sampler ``LLM(**llm_args)`` samples with: :data:`TRTLLM_SAMPLER` or :data:`TORCH_SAMPLER` (see the
    module docstring). A speculative decoder's own sampler is taken as TorchSampler's capabilities (it replaces
    the choice; what it applies is not read here, so nothing is assumed to apply beyond TorchSampler)."""
    if llm_args.get("speculative_config"):
        return TORCH_SAMPLER
    chosen = str(llm_args.get("sampler_type") or AUTO)
    if chosen == TRTLLM_SAMPLER:
        return TRTLLM_SAMPLER
    if chosen == AUTO and int(llm_args.get("max_beam_width") or 1) > 1:
        return TRTLLM_SAMPLER
    return TORCH_SAMPLER


@dataclass(frozen=True)
class SamplingInputs:
    """The sampling inputs of one request that a sampler may ignore, by the C++ backend's tensor names.

    Attributes:
        greedy: the request decodes greedily (temperature 0, top_k 1, or the C++ rule for unset values).
        repetition_penalty: 1.0 is off. presence_penalty / frequency_penalty: 0.0 is off.
        min_tokens: tokens the end token is held back for; 0 is off.
        seed: the request's seed, or None when the request gives none.
        bad_words: the request has bad words (``bad_words_list``).
        return_log_probs: the request asks for the log-probabilities of its tokens.
    """

    greedy: bool = False
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: Optional[int] = None
    bad_words: bool = False
    return_log_probs: bool = False


def _fix(name: str, neutral: str) -> str:
    return (f"serve with sampler_type {TRTLLM_SAMPLER} ({SETTING}={TRTLLM_SAMPLER}), which applies it, or leave "
            f"{name} {neutral}")


def refusal(sampler: str, inputs: SamplingInputs) -> Optional[str]:
    """Why ``sampler`` cannot take ``inputs`` as asked (the first such input), or None when it can.

    The message names the input and its value, the sampler, what it does instead (with the upstream change
    that altered it after 1.2.1), and the setting that makes it work. :data:`TRTLLM_SAMPLER` takes every input
    here; :data:`TORCH_SAMPLER` ignores penalties, bad words and (unless decoding is greedy, where it changes
    nothing) seeds, does not apply ``min_tokens`` as asked, and reports the arg-max token's log-probability
    (the sampled token's only under greedy decoding).
    """
    if sampler != TORCH_SAMPLER:
        return None
    what = f"{RELEASE}'s {TORCH_SAMPLER}, the PyTorch backend's sampler for this model,"
    for name, value, neutral in (("repetition_penalty", inputs.repetition_penalty, 1.0),
                                 ("presence_penalty", inputs.presence_penalty, 0.0),
                                 ("frequency_penalty", inputs.frequency_penalty, 0.0)):
        if value != neutral:
            return (f"{name}={value:g} would have no effect: {what} ignores repetition, presence and frequency "
                    f"penalties (they came to it after 1.2.1, NVIDIA/TensorRT-LLM PR #16485); "
                    f"{_fix(name, f'at {neutral:g}')}")
    if inputs.min_tokens > 0:
        return (f"min_tokens={inputs.min_tokens} would not be applied as asked: {what} counts the prompt's tokens "
                "towards min_tokens, so it holds the end token back for no generated token once the prompt is that "
                f"long (fixed after 1.2.1, PR #12166); {_fix('min_tokens', 'at 0')}")
    if inputs.bad_words:
        return (f"bad_words_list would have no effect: {what} ignores bad words (PR #16052 added them after 1.2.1); "
                f"{_fix('bad_words_list', 'empty')}")
    if inputs.seed is not None and not inputs.greedy:
        return (f"seed={inputs.seed} would have no effect: {what} samples every request from one generator seeded "
                f"once, so a request's seed reproduces nothing (per-request seeds came after 1.2.1, PR #17172); "
                f"{_fix('seed', 'out')}")
    if inputs.return_log_probs and not inputs.greedy:
        return (f"return_log_probs with sampling would report another token's log-probability: {what} reports the "
                "most likely token's log-probability from the logits before sampling, not the sampled token's; "
                f"{_fix('return_log_probs', 'off, or decode greedily (temperature 0)')}")
    return None


def takes_seed(sampler: Optional[str]) -> bool:
    """Whether a request's seed does anything on ``sampler`` (None: the C++ backend, which takes it)."""
    return sampler != TORCH_SAMPLER


__all__ = ["AUTO", "RELEASE", "SAMPLER_TYPES", "SETTING", "SamplingInputs", "TORCH_SAMPLER", "TRTLLM_SAMPLER",
           "effective_sampler", "refusal", "takes_seed"]
