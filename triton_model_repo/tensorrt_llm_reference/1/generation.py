"""Generation of one request for the reference ``tensorrt_llm`` model: a Hugging Face causal LM run
with ``transformers`` on the CPU, one token per step, with the sampling, penalties, stop words and guided
decoding of TensorRT-LLM 1.1 (sources in ``model.py``'s docstring and beside each rule).

Anything with the :class:`TokenGenerator` protocol can take :class:`Generation`'s place (the benchmark's
stand-in engine does).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import List, Optional, Protocol, Sequence

import numpy as np
import torch

from .parsing import SamplingParams


def _ends_with(seq: Sequence[int], suffix: Sequence[int]) -> bool:
    n = len(suffix)
    return n <= len(seq) and list(seq[len(seq) - n :]) == list(suffix)


def stop_word_end(context: Sequence[int], n_new: int, stop_words: Sequence[Sequence[int]]) -> Optional[int]:
    """Where the first stop word completed by the last ``n_new`` tokens of ``context`` ends.

    As TensorRT-LLM's ``stopWordsCriterion`` (stopCriteriaKernels.cu @9b931c0f): the word is compared
    against prompt + output, ending at a newly generated token, so its earlier tokens may lie in the
    prompt but a word wholly inside the prompt never matches.

    Returns:
        The length of ``context`` up to and including the stop word (the output keeps it), or None.
    """
    first_new = len(context) - n_new
    for end in range(first_new + 1, len(context) + 1):
        head = context[:end]
        if any(word and _ends_with(head, word) for word in stop_words):
            return end
    return None


class TokenGenerator(Protocol):
    """What the :class:`scheduler.Scheduler` needs from a request's generation.

    Attributes:
        prompt_ids: the prompt.
        params: its sampling parameters (``return_log_probs`` is read).
        tokens: the accepted generated tokens so far, never the end token.
        log_probs: one per token in ``tokens`` when ``params.return_log_probs``.
        finished / finish_reason: set once it ends ("end_id", "length", "stop_words", "stopped",
            "cancelled", "error").
    """

    prompt_ids: List[int]
    params: SamplingParams
    tokens: List[int]
    log_probs: List[float]
    finished: bool
    finish_reason: Optional[str]

    def step(self) -> List[int]:
        """Run one decoding step; return the tokens it accepted (possibly none)."""
        ...

    def finish(self, reason: str) -> None:
        """End now and free resources."""
        ...


def load_model(hf_model_dir: str, torch_threads: int = 0):
    """Load a causal LM in float32 for CPU inference (``eval()``, no gradients).

    ``torch_threads`` > 0 calls ``torch.set_num_threads``; 0 leaves the torch default.
    """
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    model = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32, local_files_only=True)
    model.eval()
    model.requires_grad_(False)
    return model


def vocab_size_of(model) -> int:
    """Number of rows of the input embedding (valid token ids are [0, this))."""
    return int(model.get_input_embeddings().num_embeddings)


class Generation:
    """One request's decoding with a transformers model: its own KV cache (DynamicCache) and RNG.

    ``step()`` runs one forward pass: the prefill of the whole prompt on the first call, then one
    token per call. It returns ``[token]``, or ``[]`` when the step ended the generation on the end
    token (which is not kept, as upstream). After a step, ``finished`` may be True
    (request_output_len reached, stop word completed, end token).

    Per step, the logits of the last position (float32) go through, in order: temperature;
    repetition_penalty; presence/frequency penalties; min_tokens (end_id banned); bad words. Then comes
    greedy argmax (see :attr:`SamplingParams.greedy`), or top_k -> top_p -> multinomial sampling with the
    request's generator. The first three are TensorRT-LLM's ``batchApplyPenalty``
    (``cpp/tensorrt_llm/kernels/penaltyKernels.cu``, @249d93d5): ``logit *= 1 / (temperature + 1e-6)``
    unless temperature is 1 (so even greedy decoding scales, and temperature 0 makes the additive
    penalties negligible); then, for each token id that occurs in prompt + output (the occurrence
    counts start from the prompt in the context phase and grow by each generated token),
    ``logit = logit < 0 ? logit * repetition : logit / repetition``, ``logit -= presence``,
    ``logit -= frequency * occurrences``. Token ids outside the vocabulary are not counted.
    """

    def __init__(self, model, prompt_ids: Sequence[int], params: SamplingParams, grammar=None,
                 adapter: Optional[str] = None, applier=None) -> None:
        from transformers import TopKLogitsWarper, TopPLogitsWarper  # noqa: PLC0415

        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        self.model = model
        self.adapter = adapter  # the LoRA adapter each forward pass runs with (None: the base model)
        self._applier = applier  # lora.PeftApplier when the model serves LoRA
        self.prompt_ids: List[int] = [int(t) for t in prompt_ids]
        self.params = params
        self.tokens: List[int] = []
        self.log_probs: List[float] = []
        self.finished = False
        self.finish_reason: Optional[str] = None
        self._cache = None
        self._pending: Optional[int] = None  # generated token not yet fed to the model
        self._started = False
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(int(params.seed))
        self._counts: Optional[torch.Tensor] = None  # occurrences of each token id in prompt + self.tokens
        # penaltyKernels.cu: each is applied only when it differs from its default (almostEqual, 1e-9), in float32
        self._inv_temperature = (
            None if abs(params.temperature - 1.0) < 1e-9
            else float(np.float32(1.0) / (np.float32(params.temperature) + np.float32(1e-6)))
        )
        self._penalized = any(abs(value - default) >= 1e-9 for value, default in (
            (params.repetition_penalty, 1.0), (params.presence_penalty, 0.0), (params.frequency_penalty, 0.0)))
        self._warpers = []
        if not params.greedy:
            if params.top_k > 0:
                self._warpers.append(TopKLogitsWarper(int(params.top_k)))
            if params.top_p is not None and params.top_p < 1.0:
                self._warpers.append(TopPLogitsWarper(float(params.top_p)))
        self._single_bad = sorted({w[0] for w in params.bad_words if len(w) == 1})
        self._multi_bad = [w for w in params.bad_words if len(w) > 1]
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._matcher = None
        if grammar is not None:
            import xgrammar  # noqa: PLC0415 - only for guided requests

            self._xgr = xgrammar
            self._matcher = xgrammar.GrammarMatcher(grammar)
            self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size_of(model))

    @property
    def cum_log_prob(self) -> float:
        """Sum of the chosen tokens' log-probabilities (when return_log_probs)."""
        return float(sum(self.log_probs))

    def finish(self, reason: str) -> None:
        """End the generation now (``reason`` goes to finish_reason) and free its KV cache."""
        if not self.finished:
            self.finished = True
            self.finish_reason = reason
        self._cache = None
        self._pending = None

    def _forward(self, ids: List[int]) -> torch.Tensor:
        kwargs = {"input_ids": torch.tensor([ids], dtype=torch.long), "past_key_values": self._cache, "use_cache": True}
        if self._keep_arg:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        self._cache = out.past_key_values
        return out.logits[0, -1, :].float().unsqueeze(0)  # [1, vocab]

    def _penalize(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, then the repetition/presence/frequency penalties (penaltyKernels.cu batchApplyPenalty)."""
        p = self.params
        vocab = logits.shape[-1]
        if self._inv_temperature is not None:
            logits = logits * self._inv_temperature
        if not self._penalized:
            return logits
        if self._counts is None:  # the context phase: count the prompt's tokens
            prompt = torch.tensor([t for t in self.prompt_ids if 0 <= t < vocab], dtype=torch.long)
            self._counts = torch.bincount(prompt, minlength=vocab).to(torch.float32)
        counts = self._counts[:vocab].unsqueeze(0)
        seen = counts > 0
        repeated = torch.where(logits < 0, logits * p.repetition_penalty, logits / p.repetition_penalty)
        penalized = repeated - p.presence_penalty - p.frequency_penalty * counts
        return torch.where(seen, penalized, logits)

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        vocab = logits.shape[-1]
        logits = self._penalize(logits)
        if p.end_id is not None and len(self.tokens) < p.min_tokens and 0 <= p.end_id < vocab:
            # With a guide that allows nothing but the end token (the document is complete), the end
            # token is still chosen: TensorRT-LLM's bitmask writes -inf (logitsBitmask.cu), its min-length
            # penalty only -FLT_MAX (penaltyKernels.cu batchApplyPenalty), which stays the maximum.
            others = torch.cat([logits[0, : p.end_id], logits[0, p.end_id + 1 :]])
            if self._matcher is None or bool(torch.isfinite(others).any()):
                logits[0, p.end_id] = float("-inf")
        if self._single_bad or self._multi_bad:
            banned = [t for t in self._single_bad if 0 <= t < vocab]
            if self._multi_bad:
                context = self.prompt_ids + self.tokens
                for word in self._multi_bad:
                    if 0 <= word[-1] < vocab and _ends_with(context, word[:-1]):
                        banned.append(word[-1])
            if banned:
                logits[0, banned] = float("-inf")
        return logits

    def _choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        if self.params.greedy:
            return int(torch.argmax(logits, dim=-1)[0]), logits
        dummy_ids = torch.zeros((1, 1), dtype=torch.long)  # warpers ignore input_ids
        for warper in self._warpers:
            logits = warper(dummy_ids, logits)
        probs = torch.softmax(logits, dim=-1)
        token = int(torch.multinomial(probs, num_samples=1, generator=self._generator)[0, 0])
        return token, logits

    def step(self) -> List[int]:
        """Run one decoding step. Returns the accepted new tokens: ``[token]``, or ``[]``."""
        if self.finished:
            return []
        applier = self._applier
        with torch.inference_mode():
            with applier.lock if applier is not None else contextlib.nullcontext():
                if applier is not None:
                    applier.use(self.adapter)
                if not self._started:
                    self._started = True
                    logits = self._forward(self.prompt_ids)
                else:
                    logits = self._forward([self._pending])
            self._pending = None
            if self._matcher is not None:
                # GuidedDecoder::build fills the bitmask after accepting the last token; execute applies it
                # to the logits before the sampling layers (penalties, min length, top-k/top-p).
                self._matcher.fill_next_token_bitmask(self._bitmask)
                self._xgr.apply_token_bitmask_inplace(logits, self._bitmask)
            logits = self._process(logits)
            token, final_logits = self._choose(logits)
            log_prob = None
            if self.params.return_log_probs:
                log_prob = float(torch.log_softmax(final_logits, dim=-1)[0, token])
        p = self.params
        if p.end_id is not None and token == p.end_id:
            self.finish("end_id")  # the end token is not returned, so neither is its log-prob
            return []
        if self._matcher is not None and not self._matcher.accept_token(token):
            raise RuntimeError(f"the guide's matcher refused token {token}, which its own bitmask allowed")
        self.tokens.append(token)
        if log_prob is not None:
            self.log_probs.append(log_prob)
        if self._counts is not None and 0 <= token < self._counts.shape[0]:
            with torch.inference_mode():  # made in inference mode, so updated in it
                self._counts[token] += 1  # the generation phase: one more occurrence of the new token
        if p.stop_words and stop_word_end(self.prompt_ids + self.tokens, 1, p.stop_words) is not None:
            self.finish("stop_words")
        elif len(self.tokens) >= p.max_new_tokens:
            self.finish("length")
        else:
            self._pending = token
        return [token]

    def run(self) -> List[int]:
        """Step until finished. Returns the generated tokens (without end_id)."""
        while not self.finished:
            self.step()
        return list(self.tokens)
