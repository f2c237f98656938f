"""The prompt of a prediction with images: the conversation rendered by the chat template with an image part where
each image goes, as text, and the images in the order their placeholders come.

TensorRT-LLM 1.2.1's LLM API takes images only with the prompt as text: the model's input processor tokenizes it and
expands each placeholder the chat template wrote into the image's tokens (``tensorrt_llm/inputs/registry.py``;
triton_model_repo/tensorrt_llm_pytorch/1/translate.py has the sources). So such a prompt is rendered here and not
tokenized: the LLM's processor tokenizes it, once. Three things follow:

* **where images go**: an image part of ``messages`` where it is; ``image_input``'s images at the start of the user
  turn (the last user message of ``messages``, or the turn of ``prompt``), before its text, where Gemma 3's and
  Qwen2-VL's input processors place images (1.2.1's placeholder registry: ``BEFORE_TEXT``). The chat template decides
  what it writes for an ``{"type": "image"}`` part (Gemma 3: ``<start_of_image>``). A template that writes nothing
  for one, or cannot render a list of parts, takes no images (:attr:`ImagePrompts.off_reason`);
* **user text is text**: the processor tokenizes the whole prompt with special tokens parsed, so a special-token
  string in the user's text (``<start_of_image>``, ``<|im_start|>``) would become a control token, or a placeholder
  without an image. Such text is refused (as :mod:`cog_triton.streaming.prompt` keeps it text for token ids), unless
  ``COG_TRITON_SPECIAL_TOKENS_IN_USER_TEXT`` lets it through;
* **the BOS token once**: the processor tokenizes with the tokenizer's special tokens added (``processor(text=...)``
  with its defaults, e.g. Gemma 3's ``<bos>``), so when the tokenizer adds its BOS and the template wrote it too, the
  rendered text's leading BOS is left out (the model sees it once, as with a prompt of token ids).

The conversation is rendered as a text prompt's is
(:meth:`cog_triton.streaming.prompt.PromptTokenizer.render_messages`): with the chat template's keyword arguments the worker resolved (the reasoning switches, ``chat_template_kwargs``),
an earlier turn's thinking under the key the template reads.

Blocking (the chat template): runs on the thread that loads a prediction's images
(:meth:`cog_triton.streaming.image_requests.ImageRequests.load`).
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Sequence

from common.errors import ImageInputError, InputError
from cog_triton.streaming.images import ImageRef
from cog_triton.streaming.prompt import REASONING_KEY, Prompt, PromptTokenizer

#: The part a chat template renders as an image (Hugging Face's chat format).
IMAGE_PART = {"type": "image"}


class ImagePrompts:
    """Renders the prompts of predictions with images (see the module docstring).

    Args:
        prompts: the stream process's prompt formatter (its tokenizer, chat template and rules).
    """

    def __init__(self, prompts: PromptTokenizer) -> None:
        self.prompts = prompts
        tokenizer = prompts.tokenizer
        bos = prompts.bos_text
        added = list(tokenizer("", add_special_tokens=True)["input_ids"]) if bos else []
        #: The BOS text to leave out of a rendered prompt's start (the processor's tokenizer adds it), or "".
        self.leading_bos = bos if bos and added[:1] == [tokenizer.convert_tokens_to_ids(bos)] else ""
        #: Why this model's chat template takes no images, or None.
        self.off_reason: Optional[str] = self._template_problem()

    def _template_problem(self) -> Optional[str]:
        if not self.prompts.has_chat_template:
            return "this model's tokenizer has no chat template, which is where images are placed"
        text = [{"type": "text", "text": "x"}]
        try:
            with_image = self.prompts._apply_template([{"role": "user", "content": [dict(IMAGE_PART), *text]}])
            without = self.prompts._apply_template([{"role": "user", "content": text}])
        except Exception as exc:  # noqa: BLE001 - a template that cannot render parts
            return f"this model's chat template cannot render a message of parts ({type(exc).__name__}: {exc})"
        if with_image == without:
            return "this model's chat template writes nothing for an image part"
        return None

    def render(self, inputs: Any) -> tuple[str, list[ImageRef]]:
        """The prompt of ``inputs`` (a :class:`cog_triton.ipc.PredictInputs` with images) as the LLM is given it
        (:meth:`sent`), and its images in the order of their placeholders (see :meth:`rendered`)."""
        prompt, refs = self.rendered(inputs)
        return self.sent(prompt), refs

    def sent(self, prompt: Prompt) -> str:
        """The text of a :meth:`rendered` prompt as the LLM is given it: its leading BOS left out where the
        processor's tokenizer adds it (see the module docstring)."""
        text = prompt.text
        return text[len(self.leading_bos):] if self.leading_bos and text.startswith(self.leading_bos) else text

    def rendered(self, inputs: Any) -> tuple[Prompt, list[ImageRef]]:
        """The prompt of ``inputs`` (a :class:`cog_triton.ipc.PredictInputs` with images) as the chat template
        rendered it (a :class:`cog_triton.streaming.prompt.Prompt` without ids, with the conversation rendered: where
        it leaves a thinking model's thinking is read from it as from a text prompt), and its images in the order of
        their placeholders.

        Raises:
            ImageInputError: the template takes no images, ``prompt_template`` is given, or ``messages`` have no user
                turn for ``image_input``.
            InputError: user text holds a special-token string, or the chat template refuses the conversation (as
                :meth:`cog_triton.streaming.prompt.PromptTokenizer.render_messages`).
        """
        if self.off_reason is not None:
            raise ImageInputError(f"{inputs.image_count} image(s) were given, but {self.off_reason}")
        files = [ImageRef(path, f"image_input[{i}]") for i, path in enumerate(inputs.image_input)]
        if inputs.messages is None:
            if inputs.prompt_template is not None:
                raise ImageInputError("image_input goes where the model's chat template places images, so "
                                      "prompt_template cannot be used with it; leave prompt_template empty")
            texts = [inputs.system_prompt, inputs.prompt]
            conversation = [{"role": "user",
                             "content": [dict(IMAGE_PART) for _ in files] + [{"type": "text", "text": inputs.prompt}]}]
            refs = list(files)
        else:
            conversation, refs, texts = self._conversation(inputs.messages, files)
            texts.append(inputs.system_prompt)
            if self.prompts.reasoning_key:  # an earlier turn's thinking the template reads is user text too
                texts += [str(m[REASONING_KEY]) for m in inputs.messages if REASONING_KEY in m]
        self._refuse_special_text(texts)
        text, rendered = self.prompts.render_messages(conversation, inputs.system_prompt, inputs.template_kwargs)
        return Prompt(text=text, ids=[], add_special_tokens=False, conversation=rendered), refs

    @staticmethod
    def _conversation(messages: Sequence[dict[str, Any]],
                      files: list[ImageRef]) -> tuple[list[dict[str, Any]], list[ImageRef], list[str]]:
        """``messages`` in the chat format (image parts as ``{"type": "image"}``), ``image_input``'s images at the
        start of the last user message; the images in placeholder order; the user texts."""
        conversation = copy.deepcopy(list(messages))
        last_user = max((i for i, m in enumerate(conversation) if m.get("role") == "user"), default=None)
        if files and last_user is None:
            raise ImageInputError("image_input goes into the last user message, and messages have none")
        refs: list[ImageRef] = []
        texts: list[str] = []
        for index, message in enumerate(conversation):
            content = message.get("content")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            rendered = []
            if index == last_user and files:
                rendered += [dict(IMAGE_PART) for _ in files]
                refs += files
            for number, part in enumerate(parts):
                if part.get("type") == "image":
                    rendered.append(dict(IMAGE_PART))
                    refs.append(ImageRef(str(part["url"]), f"messages[{index}].content[{number}]"))
                else:
                    rendered.append({"type": "text", "text": str(part.get("text", ""))})
                    texts.append(str(part.get("text", "")))
            message["content"] = rendered if any(p["type"] == "image" for p in rendered) or not isinstance(
                content, str) else content
        return conversation, refs, texts

    def _refuse_special_text(self, texts: Sequence[str]) -> None:
        prompts = self.prompts
        if prompts.parse_user_special or prompts._special_re is None:
            return
        for text in texts:
            found = prompts._special_re.search(text or "")
            if found:
                raise InputError(
                    f"the input contains the special token {found.group(0)!r}; with images the model's processor "
                    "tokenizes the whole prompt and would read it as a control token (or an image placeholder "
                    "without an image): remove it, or set COG_TRITON_SPECIAL_TOKENS_IN_USER_TEXT=true")


__all__ = ["IMAGE_PART", "ImagePrompts"]
