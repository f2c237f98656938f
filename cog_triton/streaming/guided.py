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
"""

from __future__ import annotations

import logging
import re
from typing import Any, Optional, Sequence

from common.errors import ConfigError, InputError
from cog_triton.ipc import Guide
from tensorrtllm_backend.pins import XGRAMMAR_VERSION

log = logging.getLogger(__name__)

# xgrammar's C++ errors start with "[HH:MM:SS] /path/file.cc:123: " and sometimes "Check failed: (...) is false: ".
_XGRAMMAR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false:\s*", re.DOTALL)


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

    def __init__(self, tokenizer: Any, vocab_size: Optional[int] = None) -> None:
        try:
            import xgrammar  # noqa: PLC0415 - heavy import (torch), only when guided decoding is on
        except ImportError as exc:  # optional: the GPU image has it (via tensorrt_llm), scripts/setup installs it
            raise ConfigError(f"guided decoding needs the xgrammar package ({XGRAMMAR_VERSION}): {exc}") from None

        self._xgr = xgrammar
        self.end_id = int(tokenizer.eos_token_id)
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[self.end_id])
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)

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

    def is_complete(self, guide: Guide, token_ids: Sequence[int]) -> bool:
        """True when ``token_ids`` (the generated tokens, without the end token) form a complete
        output of ``guide``: each token is accepted, and then the end token is."""
        matcher = self._xgr.GrammarMatcher(self.compile(guide))
        for token in token_ids:
            if not matcher.accept_token(int(token)):
                return False
        return bool(matcher.accept_token(self.end_id))
