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
request (the renderer copies this file into its version folder: ``templates.py`` ``PACKAGE_MODEL_CODE``), and by the
predictor before a request leaves the Cog worker (so a Cog caller gets an input error at once). Pure: no imports beyond
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


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, told twice.

    Attributes:
        name: the input refused (the C++ backend's tensor name; Cog's input of the same name).
        message: for the caller, leading with what the caller can do (leave the input out, or decode greedily for a
            seed), then why: the caller cannot change the server's sampler.
        remedy: for the operator's log: the setting that applies the input, and the upstream changes behind it.
    """

    name: str
    message: str
    remedy: str

    def log_line(self) -> str:
        """The line the server logs for the operator."""
        return f"refused {self.name} ({TORCH_SAMPLER} would not apply it): {self.remedy}"


def _remedy(name: str, after: str) -> str:
    return (f"to serve {name}, set sampler_type {TRTLLM_SAMPLER} ({SETTING}={TRTLLM_SAMPLER}; deprecated after 1.2, "
            f"NVIDIA/TensorRT-LLM PR #11938) or move to a TensorRT-LLM where {TORCH_SAMPLER} applies it ({after}); "
            "docs/deploy.md: Samplers")


def refusal(sampler: str, inputs: SamplingInputs) -> Optional[Refusal]:
    """Why ``sampler`` cannot take ``inputs`` as asked (the first such input), or None when it can.

    The caller's message names the input and its value and leads with what the caller can do (leave the input out;
    for a seed, or log-probabilities, decode greedily with temperature 0), then says what this deployment's sampler
    would do instead; the operator's remedy (the setting, the upstream pull requests) is :attr:`Refusal.remedy`, for
    the log. :data:`TRTLLM_SAMPLER` takes every input here; :data:`TORCH_SAMPLER` ignores penalties, bad words and
    (unless decoding is greedy, where it changes nothing) seeds, does not apply ``min_tokens`` as asked, and reports
    the arg-max token's log-probability (the sampled token's only under greedy decoding).
    """
    if sampler != TORCH_SAMPLER:
        return None
    why = f"this deployment's sampler ({RELEASE}'s {TORCH_SAMPLER})"
    for name, value, neutral in (("repetition_penalty", inputs.repetition_penalty, 1.0),
                                 ("presence_penalty", inputs.presence_penalty, 0.0),
                                 ("frequency_penalty", inputs.frequency_penalty, 0.0)):
        if value != neutral:
            return Refusal(name, f"{name}={value:g} cannot be applied here: leave {name} out (or set it to "
                                 f"{neutral:g}); {why} ignores repetition, presence and frequency penalties",
                           _remedy(name, "PR #16485"))
    if inputs.min_tokens > 0:
        return Refusal("min_tokens", f"min_tokens={inputs.min_tokens} cannot be applied here: leave min_tokens out (or "
                                     f"set it to 0); {why} counts the prompt's tokens towards min_tokens, so it would "
                                     "not hold the end token back as asked",
                       _remedy("min_tokens", "PR #12166"))
    if inputs.bad_words:
        return Refusal("bad_words_list", f"bad_words_list cannot be applied here: leave it out; {why} ignores bad words",
                       _remedy("bad_words_list", "PR #16052"))
    if inputs.seed is not None and not inputs.greedy:
        return Refusal("seed", f"seed={inputs.seed} cannot be applied here: leave seed out, or set temperature to 0 "
                               f"(greedy decoding gives the same output every time, without a seed); {why} draws "
                               "every request from one shared generator, so a seed would reproduce nothing",
                       _remedy("seed", "PR #17172"))
    if inputs.return_log_probs and not inputs.greedy:
        return Refusal("return_log_probs", "return_log_probs with sampling cannot be applied here: set temperature to "
                                           f"0 (greedy decoding), or leave return_log_probs out; {why} reports the "
                                           "most likely token's log-probability, taken before sampling, not the "
                                           "sampled token's",
                       f"to serve log-probabilities with sampling, set sampler_type {TRTLLM_SAMPLER} "
                       f"({SETTING}={TRTLLM_SAMPLER}); docs/deploy.md: Samplers")
    return None


def takes_seed(sampler: Optional[str]) -> bool:
    """Whether a request's seed does anything on ``sampler`` (None: the C++ backend, which takes it)."""
    return sampler != TORCH_SAMPLER


__all__ = ["AUTO", "RELEASE", "Refusal", "SAMPLER_TYPES", "SETTING", "SamplingInputs", "TORCH_SAMPLER",
           "TRTLLM_SAMPLER", "effective_sampler", "refusal", "takes_seed"]
