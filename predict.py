"""Cog predictor: declares the inputs and delegates to :class:`cog_triton.worker.service.LLMService`.

``setup()`` fetches the weights (engine or Hugging Face checkpoint + tokenizer), renders the
Triton model repository, starts Triton and the stream processes and runs a short self-test;
``run()`` streams the ensemble's text (gRPC ``ModelStreamInfer``, detokenized in the stream
processes) as a generator coglet iterates.

``BaseRunner``/``run()`` is the idiom of the pinned cog (0.20 and later: replicate/cog 30151726,
``python/cog/predictor.py``); ``BasePredictor``/``predict()`` still work there but log deprecation
warnings at every setup. ``Predictor().predict(...)`` keeps working: ``BaseRunner.predict`` is cog's
bridge to ``run()``. The class cannot define both methods: coglet refuses a predictor that does
("predictor must define either run() or predict(), not both", crates/coglet-python/src/predictor.rs).
The class keeps its name and file, so ``cog.yaml`` ``predict: predict.py:Predictor`` and
``COG_PREDICT_TYPE_STUB`` are unchanged; ``cog predict``/``cog run`` and ``POST /predictions`` do not
depend on the method's name.

The ``Input(...)`` declarations below are read *statically* by ``cog build`` (Cog's schema
generator parses this file's source): every default and bound must be a literal, every
description one string literal, and an input that may be empty is ``Optional[...]``. Those
literals are the one source of the inputs' bounds: the schema generated from them is committed as
``cog_triton/openapi_schema.json`` (checked by tests/test_schema.py), which ``cog_triton.worker.inputs`` reads and
which coglet validates against once it is in place as ``.cog/openapi_schema.json`` (the Dockerfile copies
it there; local runs install it: :func:`cog_triton.worker.schema.install_for_coglet`).
"""

# No ``from __future__ import annotations`` here: coglet resolves run()'s annotations with
# typing.get_type_hints for every prediction (crates/coglet-python/src/input.rs ``classify_fields``, replicate/cog
# 6110c912), and string annotations make that evaluate each of the inputs' types again: about 86 µs a prediction
# under the worker's one GIL instead of 12 (2-core development machine), paid by every prediction of a burst.
import logging
from typing import Iterator, Optional

import cog
from cog import BaseRunner, ConcatenateIterator, Input, Path

from cog_triton.worker import cog_bridge
from cog_triton.worker.service import LLMService
from cog_triton.settings import Settings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("predict")
cog_bridge.install_cancel_hook()


class Predictor(BaseRunner):
    """LLM served by Triton Inference Server + TensorRT-LLM (or the CPU reference backend)."""

    def setup(self, weights: Optional[Path] = None) -> None:
        """Fetch ``weights`` (URL or path; default COG_TRITON_WEIGHTS / COG_WEIGHTS) and start Triton."""
        self.service = LLMService(Settings.from_env())
        self.service.setup(weights)

    def healthcheck(self) -> bool:
        """coglet calls this on GET /health-check while READY (5 s limit): a Triton that could not be
        restarted, or that stopped answering, shows as UNHEALTHY with the reason, not READY."""
        service = getattr(self, "service", None)
        if service is None:
            return True  # setup has not run: coglet reports that state itself
        health = service.health()
        if not health.healthy:
            raise RuntimeError(health.reason)  # coglet: "Healthcheck failed: <reason>"
        return True

    # Why one function: its parameters are the Cog inputs' literal Input(...) declarations, which
    # Cog's static schema generator reads from this signature (cog build runs no code); the body hands them over.
    @cog.streaming  # x-cog-streaming in the schema: coglet then streams the output over SSE
    @cog.concurrent(max=64)  # predictions at once (cog 0.23, #3089); COG_MAX_CONCURRENCY overrides it at run time
    async def run(
        self,
        prompt: str = Input(
            description="Text to respond to (one user turn). Give prompt or messages, not both.",
            default="",
            max_length=1000000,
        ),
        messages: str = Input(
            description='A conversation as a JSON array of {"role", "content"} objects, e.g. [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "What is 2+2?"}], rendered with the chat template of the model. Give prompt or messages, not both.',  # noqa: E501 - one literal (cog's schema generator)
            default="",
            max_length=1000000,
        ),
        system_prompt: str = Input(
            description="System message; used by the chat template (before messages, which must then not start with a system message) or by {system_prompt} in prompt_template.",  # noqa: E501 - one literal
            default="",
            max_length=1000000,
        ),
        prompt_template: str = Input(
            description="Template with {prompt} (and optionally {system_prompt}). Empty: the tokenizer's chat template when it has one, else {prompt}.",  # noqa: E501 - one literal: cog's schema generator does not join implicitly concatenated strings
            default="",
            max_length=100000,
        ),
        max_tokens: int = Input(
            description="Maximum tokens to generate (capped by the model's max sequence length).",
            default=512,
            ge=1,
            le=2147483647,
        ),
        min_tokens: int = Input(
            description="Minimum tokens to generate before the end token; 0 or -1 = none. Some deployments cannot apply it (the PyTorch backend's default sampler): there a prediction that sets it fails, saying so; leave it out.",  # noqa: E501 - one literal
            default=0,
            ge=-1,
            le=2147483647,
        ),
        temperature: float = Input(description="Sampling temperature; 0 = greedy.", default=0.7, ge=0, le=5),
        top_p: float = Input(
            description="Nucleus sampling probability mass; 1 = off, 0 = greedy.", default=0.95, ge=0, le=1
        ),
        top_k: int = Input(
            description="Sample from the k most likely tokens (at most 1024, TensorRT-LLM's limit); 0 or -1 = no limit.",  # noqa: E501 - one literal
            default=0,
            ge=-1,
            le=1024,
        ),
        repetition_penalty: float = Input(
            description="Penalty for repeated tokens; 1 = none. Some deployments cannot apply it (the PyTorch backend's default sampler): there a prediction that sets it fails, saying so; leave it out.",  # noqa: E501 - one literal
            default=1.0, ge=0.01, le=10
        ),
        presence_penalty: float = Input(
            description="Additive penalty for tokens already generated; 0 = none. Some deployments cannot apply it (the PyTorch backend's default sampler): there a prediction that sets it fails, saying so; leave it out.",  # noqa: E501 - one literal
            default=0.0, ge=-2, le=2
        ),
        frequency_penalty: float = Input(
            description="Additive penalty per occurrence of a generated token; 0 = none. Some deployments cannot apply it (the PyTorch backend's default sampler): there a prediction that sets it fails, saying so; leave it out.",  # noqa: E501 - one literal
            default=0.0, ge=-2, le=2
        ),
        stop_sequences: str = Input(
            description='Comma-separated stop sequences (or a JSON array, e.g. ["a,b", "c"]); never emitted. For a model that thinks they are matched in the answer, never in the thinking.',  # noqa: E501 - one literal
            default="",
            max_length=8192,
        ),
        seed: Optional[int] = Input(
            description="Random seed; leave empty for a random one. Some deployments cannot apply a seed when sampling (the PyTorch backend's default sampler): there a prediction that sets one fails, saying so; leave it out, or set temperature to 0 (greedy decoding gives the same output every time).",  # noqa: E501 - one literal
            default=None, ge=0, le=9007199254740991
        ),
        json_schema: str = Input(
            description='A JSON Schema (as text): the output (for a model that thinks, its answer after the thinking) is then a JSON document valid against it (guided decoding). The json_schema object of an OpenAI response_format ({"name", "schema", "strict"}) is accepted too. Empty: off.',  # noqa: E501 - one literal
            default="",
            max_length=100000,
        ),
        response_format: str = Input(
            description="text, or json_object: the output is any JSON document (guided decoding). With json_schema, that schema applies.",  # noqa: E501 - one literal
            default="text",
            choices=["text", "json_object"],
        ),
        regex: str = Input(
            description="A regular expression the whole output (for a model that thinks, its answer) must match (guided decoding). Empty: off.",  # noqa: E501 - one literal
            default="",
            max_length=10000,
        ),
        grammar: str = Input(
            description="An EBNF grammar (the GBNF dialect of xgrammar, starting at rule root) the output (for a model that thinks, its answer) must follow (guided decoding). Empty: off.",  # noqa: E501 - one literal
            default="",
            max_length=100000,
        ),
        length_penalty: float = Input(
            description="Beam search's length penalty (TensorRT-LLM's len_penalty). Generation here samples with one beam, where it has no effect; accepted for clients of Replicate's Triton LLMs.",  # noqa: E501 - one literal
            default=1.0,
            ge=0,
            le=5,
        ),
        log_performance_metrics: bool = Input(
            description="Log the token count, tokens per second, generation time and time to first token of this prediction.",  # noqa: E501 - one literal
            default=False,
        ),
        max_new_tokens: Optional[int] = Input(
            description="Deprecated alias of max_tokens (as in Replicate's Triton LLMs): used when max_tokens is left at its default or equal; giving both with different values is an error.",  # noqa: E501 - one literal
            default=None,
            ge=1,
            le=2147483647,
        ),
        min_new_tokens: Optional[int] = Input(
            description="Deprecated alias of min_tokens (as in Replicate's Triton LLMs): used when min_tokens is left at its default or equal; giving both with different values is an error.",  # noqa: E501 - one literal
            default=None,
            ge=-1,
            le=2147483647,
        ),
        lora_weights: str = Input(
            description="A LoRA adapter (a fine-tune of this model) to apply: the https URL of a .tar, .tar.gz or .zip archive of a Hugging Face PEFT adapter (adapter_config.json + adapter_model.safetensors), or hf://owner/repo[@revision]. Empty: the base model.",  # noqa: E501 - one literal
            default="",
            max_length=4096,
        ),
        reasoning_effort: str = Input(
            description="How much the model thinks before it answers: none, low, medium or high, mapped onto what its chat template reads (enable_thinking or thinking: none turns thinking off, low, medium and high turn it on; reasoning_effort: the level itself). Empty: the model's default. A level the template cannot express is refused, naming those it can. Whatever the model's format, the stream is its thinking between <think> and </think>, then the answer.",  # noqa: E501 - one literal
            default="",
            choices=["", "none", "low", "medium", "high"],
        ),
        include_reasoning: bool = Input(
            description="Stream the model's thinking before its answer, between <think> and </think> (the same for every model family); false: the answer alone. The thinking counts against max_tokens either way.",  # noqa: E501 - one literal
            default=True,
        ),
        chat_template_kwargs: str = Input(
            description='Further variables for the chat template of the model, as a JSON object (e.g. {"date_string": "26 Jul 2024"}): only variables the template reads, and none that other inputs set (reasoning_effort sets enable_thinking, thinking and reasoning_effort). Empty: none.',  # noqa: E501 - one literal
            default="",
            max_length=100000,
        ),
        thinking_budget_tokens: int = Input(
            description="Most tokens the model may spend thinking before its answer, its thinking markers included: when they run out the thinking is ended and the model writes its answer. 0 = no budget (max_tokens bounds the thinking and the answer together). Refused for a model that does not think or whose thinking is off.",  # noqa: E501 - one literal
            default=0,
            ge=0,
            le=2147483647,
        ),
        image_input: list[Path] = Input(
            description="Images for the model to see (files or URLs: JPEG, PNG, WebP or still GIF), placed in the user turn (the last one of messages) before its text, where the model's chat template writes images. For an image model served from a Hugging Face checkpoint on the PyTorch backend; at most 8 images by default, counting image parts of messages.",  # noqa: E501 - one literal
            default=[],
        ),
    ) -> ConcatenateIterator[str]:
        """Stream the model's answer as text deltas.

        Input errors (bad values, a prompt too long for the model) are raised here, before any
        output; the returned generator is what coglet iterates to stream (see cog_triton.worker.cog_bridge).
        """
        # Every input, by name (the signature above is their one list): validated against the schema made from it.
        values = locals()
        inputs = self.service.validate(**{name: value for name, value in values.items() if name != "self"})
        # The prediction's metric scope, taken here (coglet finds it through a context variable): the
        # metrics are recorded later from another thread. cog.emit_metric is a deprecated alias in cog 0.23.
        scope = cog.current_scope()
        stream: Iterator[str] = await self.service.predict(inputs, metric=scope.record_metric)
        return stream
