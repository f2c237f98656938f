"""Structured output: the guide a prediction sends to TensorRT-LLM's guided decoding, checked here first.

A prediction may carry one guide (inputs ``json_schema``, ``response_format="json_object"``,
``regex`` or ``grammar``). It reaches the ``tensorrt_llm`` model as the two request tensors of
TensorRT-LLM's Triton backend (1.1.0 and 1.2.1), ``guided_decoding_guide_type`` and ``guided_decoding_guide``.
The backend maps exactly four type strings (``json``, ``json_schema``, ``regex``, ``ebnf_grammar``)
and silently ignores any other (``utils.cc`` ``getGuidedDecodingParamsFromTensors``, NVIDIA/TensorRT-LLM
``triton_backend/inflight_batcher_llm/src``), and its executor compiles the guide with xgrammar only
when the request is first scheduled (``batch_manager/guidedDecoder.cpp`` ``GuidedDecoder::build``:
``CompileJSONSchema``, ``CompileBuiltinJSONGrammar``, ``Grammar::FromRegex`` / ``FromEBNF``). A guide
xgrammar cannot compile would fail there, inside the engine's loop, so the predictor compiles it first
with the same library (xgrammar 0.1.32, TensorRT-LLM 1.2.1's pin) and the same defaults
(``compile_json_schema``: any whitespace, strict mode) and refuses it with xgrammar's reason.

After the generation, :meth:`GuideChecker.is_complete` replays the output tokens through an xgrammar
matcher: the output is a complete document exactly when the grammar accepts the end token there.

**A model that thinks** (:mod:`cog_triton.streaming.thinking`): a guide constrains the output from its first token on
both backends (the C++ executor's ``GuidedDecoder`` and the PyTorch backend's ``GuidedDecoder`` build one matcher
per request from its first generated token; neither knows about thinking), so the guide alone would force the
thinking into the document. :meth:`GuideChecker.thinking_guide` sends instead one EBNF grammar (guide type
``ebnf_grammar``, which both backends take: ``utils.cc`` ``getGuidedDecodingParamsFromTensors`` maps it to
``GuideType::kEBNF_GRAMMAR``, compiled with ``Grammar::FromEBNF``; the PyTorch backend's
``_torch/pyexecutor/grammar_matcher.py`` ``XGrammarMatcherFactory.create`` with ``compile_grammar(guide)``): what
the model writes before its answer (:func:`thinking_head`: its opening marker, free text that does not contain the
closing marker, the closing marker, a little whitespace), then the guide's own grammar (xgrammar's
``Grammar.concat``, printed as EBNF and compiled here as the engine will compile it). xgrammar (0.1.32) takes a
grammar over text, not token ids: every token whose vocabulary text is not empty is text to it, special or not
(``cpp/tokenizer_info.cc`` ``IsSpecialToken`` is ``token == ""``, v0.1.32 @62e13551), so the marker tokens match
their text (``<think>``, ``[/THINK]``, harmony's ``<|channel|>``): :meth:`GuideChecker.unwritable_markers` checks
that each marker's text in xgrammar's vocabulary is its own, and a format whose markers are not is refused. The text
could also be spelled by ordinary tokens (``</`` ``think`` ``>``), which the grammar cannot tell from the marker
token; the stream parser splits by token ids, so the answer the caller gets is checked on its own against the guide
at the end (:meth:`GuideChecker.accepts_text`) and a mismatch fails the prediction rather than return it.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Optional, Sequence

from common.errors import ConfigError, InputError
from cog_triton.ipc import Guide
from cog_triton.reasoning import ThinkingFormat
from tensorrtllm_backend.pins import XGRAMMAR_VERSION

log = logging.getLogger(__name__)

# xgrammar's C++ errors start with "[HH:MM:SS] /path/file.cc:123: " and sometimes "Check failed: (...) is false: ".
_XGRAMMAR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false:\s*", re.DOTALL)


#: Whitespace the grammar lets a model write between the end of its thinking and its guided answer (Qwen3 and
#: DeepSeek-R1 write two line breaks after ``</think>``; GLM-4.5 one): at most 4 characters, so that a small model
#: cannot loop on whitespace there. The stream leaves it out (:mod:`cog_triton.streaming.thinking`).
ANSWER_GAP = "[ \\t\\r\\n]{0,4}"
#: Channels of a harmony message that is thinking (every channel but ``final``: cog_triton.streaming.thinking).
HARMONY_THINKING_CHANNELS = ("analysis", "commentary")


def _literal(text: str) -> str:
    """``text`` as an EBNF string literal (xgrammar takes JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _free_text(stop: str) -> str:
    """An EBNF expression of any text up to and including the first ``stop`` (xgrammar's ``TagDispatch`` without
    tags: what its structural tags' ``any_text`` compiles to; the end token is not allowed inside)."""
    return f"TagDispatch(stop_eos=false, stop_str=({_literal(stop)}), loop_after_dispatch=false)"


def thinking_head(fmt: ThinkingFormat, start: Any) -> Optional[str]:
    """The EBNF grammar (rule ``root``) of what a model that thinks writes before its answer, given where its prompt
    leaves the thinking (``start``: a :data:`~cog_triton.reasoning.PromptState` for tags, the channel of a message the
    prompt left open, or None, for harmony); None when the output is the answer from its first token (the prompt
    closed the thinking, or opened harmony's final channel).

    * tags, the prompt opened the thinking (DeepSeek-R1): the thinking's text, the closing marker, :data:`ANSWER_GAP`;
    * tags, the model may open a block (Qwen3, GLM-4.5, Magistral): nothing, or the opening marker and the same;
    * harmony: any number of thinking messages (``<|channel|>analysis<|message|>TEXT<|end|><|start|>assistant``, the
      prompt ending with ``<|start|>assistant``), then ``<|channel|>final<|message|>``; a thinking message the prompt
      left open is finished first.
    """
    if fmt.kind == "harmony":
        if start == "final":
            return None
        channels = " | ".join(_literal(name) for name in HARMONY_THINKING_CHANNELS)
        rules = [
            f"thinking_message ::= {_literal('<|channel|>')} ({channels}) {_literal('<|message|>')} thinking_text "
            f"{_literal('<|start|>assistant')}",
            f"thinking_text ::= {_free_text('<|end|>')}",
        ]
        finish = f"thinking_text {_literal('<|start|>assistant')} " if start is not None else ""
        return "\n".join([f"root ::= {finish}thinking_message* {_literal('<|channel|>final<|message|>')}", *rules])
    if start == "closed":
        return None
    block = "thinking_text gap"  # the closing marker ends thinking_text
    rules = [f"thinking_text ::= {_free_text(fmt.close_text)}", f"gap ::= {ANSWER_GAP}"]
    if start == "open":
        return "\n".join([f"root ::= {block}", *rules])
    return "\n".join([f'root ::= "" | {_literal(fmt.open_text)} {block}', *rules])


def after_thinking_head(fmt: ThinkingFormat) -> Optional[str]:
    """The EBNF grammar (rule ``root``) of what comes between an ended thinking and the answer, for the answer request
    of a thinking budget (:mod:`cog_triton.streaming.thinking_generation`): :data:`ANSWER_GAP` after a closing
    marker; None for harmony, whose forced ending is the final channel's header."""
    return None if fmt.kind == "harmony" else f"root ::= {ANSWER_GAP}"


def xgrammar_reason(exc: BaseException) -> str:
    """xgrammar's error text without its log prefix (time, C++ file and line, failed check)."""
    text = str(exc).strip()
    text = _XGRAMMAR_PREFIX.sub("", text)
    text = _CHECK_FAILED.sub("", text)
    return text.strip().rstrip(".") or type(exc).__name__


class GuideChecker:
    """Compiles guides with xgrammar for one tokenizer, as TensorRT-LLM's guided decoder does.

    The xgrammar ``TokenizerInfo`` is made from the Hugging Face tokenizer with the end token as the
    only stop token, which is what TensorRT-LLM's ``_xgrammar_tokenizer_info`` writes into the
    tokenizer info file the C++ backend reads (``stop_token_ids = [tokenizer.eos_token_id]``,
    tensorrt_llm/llmapi/tokenizer.py).

    Args:
        tokenizer: the Hugging Face tokenizer the predictor tokenizes with.
        vocab_size: token ids the model can produce (default: the tokenizer's vocabulary).
    """

    #: Grammars of guides for a model that thinks kept as text (a handful of distinct guides in practice).
    MAX_THINKING_GUIDES = 64

    def __init__(self, tokenizer: Any, vocab_size: Optional[int] = None) -> None:
        try:
            import xgrammar  # noqa: PLC0415 - heavy import (torch), only when guided decoding is on
        except ImportError as exc:  # optional: the GPU image has it (via tensorrt_llm), scripts/setup installs it
            raise ConfigError(f"guided decoding needs the xgrammar package ({XGRAMMAR_VERSION}): {exc}") from None

        self._xgr = xgrammar
        self.end_id = int(tokenizer.eos_token_id)
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[self.end_id])
        self._info = info
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        self._thinking_texts: dict[tuple[str, str, str], str] = {}

    def compile(self, guide: Guide) -> Any:
        """xgrammar's compiled grammar for ``guide`` (cached by xgrammar, so a second call is cheap).

        Raises:
            InputError: xgrammar cannot compile it; the message names the input and xgrammar's reason.
        """
        compiler = self._compiler
        if guide.guide_type == "json":  # xgrammar's own JSON grammar: nothing of the user's to refuse
            return compiler.compile_builtin_json_grammar()
        try:
            if guide.guide_type == "json_schema":
                return compiler.compile_json_schema(guide.guide)
            if guide.guide_type == "regex":
                return compiler.compile_grammar(self._xgr.Grammar.from_regex(guide.guide))
            return compiler.compile_grammar(self._xgr.Grammar.from_ebnf(guide.guide))
        except (RuntimeError, ValueError, TypeError) as exc:
            what = {
                "json_schema": "json_schema is not a JSON Schema that guided decoding supports",
                "regex": "regex is not a regular expression that guided decoding supports",
                "ebnf_grammar": "grammar is not an EBNF grammar that guided decoding accepts",
            }[guide.guide_type]
            raise InputError(f"{what}: {xgrammar_reason(exc)}") from None

    def unwritable_markers(self, fmt: ThinkingFormat) -> list[str]:
        """The thinking format's markers (control tokens for harmony) whose text in xgrammar's vocabulary is not
        their own (a token xgrammar decodes to nothing is one no grammar lets through): a grammar cannot write them."""
        vocab = self._info.decoded_vocab
        if fmt.kind == "harmony":
            pairs = [(fmt.channel_id, "<|channel|>"), (fmt.message_id, "<|message|>"), (fmt.end_id, "<|end|>"),
                     (fmt.start_id, "<|start|>")]
        else:
            pairs = [(fmt.open_id, fmt.open_text), (fmt.close_id, fmt.close_text)]
        return [text for token, text in pairs
                if not 0 <= token < len(vocab) or bytes(vocab[token]) != text.encode("utf-8")]

    def thinking_guide(self, guide: Guide, head: str) -> Guide:
        """The guide a model that thinks is sent: one EBNF grammar of ``head`` (:func:`thinking_head`) then
        ``guide``'s own grammar, compiled here first as the engine will compile it (xgrammar caches both the text
        and the compiled grammar).

        Raises:
            InputError: ``guide`` does not compile (as :meth:`compile`).
        """
        key = (guide.guide_type, guide.guide, head)
        text = self._thinking_texts.get(key)
        if text is None:
            self.compile(guide)  # the guide's own errors, named as for any guide
            xgr = self._xgr
            text = str(xgr.Grammar.concat(xgr.Grammar.from_ebnf(head), self._grammar(guide)))
            if len(self._thinking_texts) >= self.MAX_THINKING_GUIDES:
                self._thinking_texts.clear()
            self._thinking_texts[key] = text
        combined = Guide("ebnf_grammar", text, guide.source)
        self.compile(combined)
        return combined

    def _grammar(self, guide: Guide) -> Any:
        """xgrammar's ``Grammar`` of ``guide`` (the defaults :meth:`compile` uses)."""
        xgr = self._xgr
        if guide.guide_type == "json":
            return xgr.Grammar.builtin_json_grammar()
        if guide.guide_type == "json_schema":
            return xgr.Grammar.from_json_schema(guide.guide)
        if guide.guide_type == "regex":
            return xgr.Grammar.from_regex(guide.guide)
        return xgr.Grammar.from_ebnf(guide.guide)

    def accepts_text(self, guide: Guide, text: str) -> bool:
        """True when ``text`` is a complete output of ``guide``: the grammar accepts it, then the end token."""
        matcher = self._xgr.GrammarMatcher(self.compile(guide))
        return bool(matcher.accept_string(text)) and bool(matcher.accept_token(self.end_id))

    def is_complete(self, guide: Guide, token_ids: Sequence[int]) -> bool:
        """True when ``token_ids`` (the generated tokens, without the end token) form a complete
        output of ``guide``: each token is accepted, and then the end token is."""
        matcher = self._xgr.GrammarMatcher(self.compile(guide))
        for token in token_ids:
            if not matcher.accept_token(int(token)):
                return False
        return bool(matcher.accept_token(self.end_id))
