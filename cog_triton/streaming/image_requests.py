"""A prediction with images, in a stream process: its prompt and images loaded, its request for ``tensorrt_llm``,
and the engine's counts read from its responses.

TensorRT-LLM 1.2.1 takes images only with the prompt as text (:mod:`cog_triton.streaming.image_prompt`), so such a
prediction is not tokenized here: :meth:`ImageRequests.load` renders its prompt with the images' placeholders and
reads, fetches and checks its images (:mod:`cog_triton.streaming.images`), and :meth:`ImageRequests.fields` gives the
request's own fields: the text, the images' bytes, and the end and pad ids the ensemble's preprocessing would fill
in for a text request (the client sends it to ``tensorrt_llm`` itself:
:meth:`cog_triton.streaming.client.GenerateRequest.image_request`). The
LLM's input processor tokenizes the prompt, so its length is known only from the engine's responses
(:func:`counted` reads it there), and ``max_tokens`` goes as given: the LLM holds it to its ``max_seq_len``
(``_deduce_max_tokens``). The rest of the request (sampling, guide, adapter) and the stream are
:class:`cog_triton.streaming.generation.Generator`'s, as for text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from common.errors import ImageInputError
from cog_triton.ipc import PredictInputs
from cog_triton.stream_config import GeneratorConfig, ImageLimits
from cog_triton.streaming.client import CountedChunk, GenerateChunk
from cog_triton.streaming.image_prompt import ImagePrompts
from cog_triton.streaming.images import CheckedImage, load_images
from cog_triton.streaming.prompt import Prompt, PromptTokenizer


@dataclass(frozen=True)
class PredictionImages:
    """A prediction's prompt rendered with its images' placeholders (``prompt``: as the chat template rendered it,
    without ids; ``text``: as the LLM is given it), and its images read and checked (:meth:`ImageRequests.load`)."""

    prompt: Prompt
    text: str
    images: tuple[CheckedImage, ...]


class ImageRequests:
    """The image side of a stream process's :class:`~cog_triton.streaming.generation.Generator`.

    Args:
        tokenizer: the model's tokenizer (its end and pad ids).
        prompts: renders prompts (None: images are refused, ``off``).
        off: why images are refused (:attr:`GeneratorConfig.images_off`; overridden by what the chat template
            cannot do, :attr:`ImagePrompts.off_reason`).
        limits: what an image may be.
    """

    def __init__(self, tokenizer: Any, prompts: Optional[ImagePrompts], off: Optional[str] = "images are not served",
                 limits: ImageLimits = ImageLimits()) -> None:
        self.prompts = prompts
        self.off_reason = (off or "images are not served") if prompts is None else prompts.off_reason
        self.limits = limits
        # as the ensemble's preprocessing fills them for a text request (triton_model_repo/preprocessing: eos, pad
        # else eos)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.end_id = int(eos) if eos is not None else 0
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else self.end_id

    @classmethod
    def of(cls, config: GeneratorConfig, tokenizer: Any, prompts: PromptTokenizer) -> "ImageRequests":
        """For a stream process's config (the chat template probed only where images are served)."""
        image_prompts = ImagePrompts(prompts) if config.images_off is None else None
        return cls(tokenizer, image_prompts, config.images_off, config.image_limits)

    def load(self, inputs: PredictInputs) -> PredictionImages:
        """Render the prompt of a prediction with images as text and read, fetch and check its images (blocking: its
        image URLs within their deadline, and decoding; the stream process runs it on a thread of its own).

        Raises:
            ImageInputError: images are not served, or one is refused (count, size, format, pixels, animation, its
                URL); InputError: user text with a special token, or the chat template refuses the conversation.
        """
        if self.prompts is None or self.off_reason is not None:
            raise ImageInputError(f"{inputs.image_count} image(s) were given, but {self.off_reason}")
        prompt, refs = self.prompts.rendered(inputs)
        return PredictionImages(prompt, self.prompts.sent(prompt), tuple(load_images(refs, self.limits)))

    def fields(self, loaded: PredictionImages) -> dict[str, Any]:
        """The :class:`~cog_triton.streaming.client.GenerateRequest` fields of an image request (its ``input_ids``
        empty)."""
        return {"text_input": loaded.text, "image_bytes": tuple(image.data for image in loaded.images),
                "end_id": self.end_id, "pad_id": self.pad_id}


async def counted(responses: AsyncIterator[GenerateChunk],
                  on_counts: Optional[Callable[[int, int], None]]) -> AsyncIterator[GenerateChunk]:
    """``responses`` of a request with images, ``on_counts(prompt_tokens, image_tokens)`` called with the first
    counts they carry (a layer of its own: only such a request reads them)."""
    reported = on_counts is None
    async for chunk in responses:
        if not reported and isinstance(chunk, CountedChunk):
            reported = True
            on_counts(chunk.prompt_tokens, chunk.image_tokens)  # type: ignore[misc]
        yield chunk


__all__ = ["ImageRequests", "PredictionImages", "counted"]
