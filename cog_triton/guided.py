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

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from common.errors import ConfigError, InputError
from tensorrtllm_backend.pins import XGRAMMAR_VERSION

log = logging.getLogger(__name__)

#: The guide types the backend maps (utils.cc getGuidedDecodingParamsFromTensors, @c8c6df08 and @19290813).
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
#: response_format choices (OpenAI's response_format.type names; json_schema has its own input).
RESPONSE_FORMATS = ("text", "json_object")

# xgrammar's C++ errors start with "[HH:MM:SS] /path/file.cc:123: " and sometimes "Check failed: (...) is false: ".
_XGRAMMAR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_CHECK_FAILED = re.compile(r"^Check failed: \(.*?\) is false:\s*", re.DOTALL)


@dataclass(frozen=True)
class Guide:
    """One prediction's guide.

    Attributes:
        guide_type: one of :data:`GUIDE_TYPES` (what ``guided_decoding_guide_type`` carries).
        guide: the schema / regex / grammar text; ``""`` for ``json`` (any JSON), which needs none.
        source: the input that set it ("json_schema", "response_format", "regex" or "grammar").
    """

    guide_type: str
    guide: str
    source: str

    @property
    def document(self) -> str:
        """What a complete output is, in words (for error messages)."""
        return {
            "json": "JSON document",
            "json_schema": "JSON document",
            "regex": "match of the regex",
            "ebnf_grammar": "sentence of the grammar",
        }[self.guide_type]


def _openai_schema(value: Any) -> Any:
    """The schema inside OpenAI's ``response_format.json_schema`` object ({"name", "schema", "strict"}),
    or ``value`` itself when it is not such an object (a plain JSON Schema has no top-level "schema")."""
    if isinstance(value, dict) and isinstance(value.get("schema"), dict) and "name" in value:
        if not ({"type", "properties", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"} & set(value)):
            return value["schema"]
    return value


def select_guide(
    json_schema: str = "", response_format: str = "text", regex: str = "", grammar: str = ""
) -> Optional[Guide]:
    """The guide the structured-output inputs ask for, or None (free text).

    At most one of ``json_schema``, ``regex`` and ``grammar`` may be given. ``response_format``
    "json_object" asks for any JSON (TensorRT-LLM's ``json`` guide); with ``json_schema`` it is
    redundant and allowed; with ``regex`` or ``grammar`` it is a contradiction.

    Raises:
        InputError: more than one guide, an unknown response_format, or a json_schema that is not a
            JSON object (the message names the input and the problem).
    """
    texts = (("json_schema", json_schema), ("regex", regex), ("grammar", grammar))
    given = [name for name, text in texts if text.strip()]
    if response_format not in RESPONSE_FORMATS:
        raise InputError(f"response_format={response_format!r} is not allowed; allowed: {', '.join(RESPONSE_FORMATS)}")
    if len(given) > 1:
        raise InputError(
            f"{' and '.join(given)} are both set; give at most one of json_schema, regex and grammar "
            "(each constrains the whole output)"
        )
    if response_format == "json_object" and given and given[0] != "json_schema":
        raise InputError(
            f"response_format=json_object asks for JSON, and {given[0]} asks for another format; give one of them"
        )
    if not given:
        return Guide("json", "", "response_format") if response_format == "json_object" else None
    name = given[0]
    if name == "regex":
        return Guide("regex", regex, "regex")
    if name == "grammar":
        return Guide("ebnf_grammar", grammar, "grammar")
    try:
        schema = json.loads(json_schema)
    except json.JSONDecodeError as exc:
        raise InputError(f"json_schema is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    schema = _openai_schema(schema)
    if not isinstance(schema, dict):
        raise InputError(
            f"json_schema must be a JSON Schema object such as {{\"type\": \"object\", ...}}, got a JSON "
            f"{type(schema).__name__}"
        )
    return Guide("json_schema", json.dumps(schema, ensure_ascii=False, separators=(",", ":")), "json_schema")


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
