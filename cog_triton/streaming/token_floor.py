"""A floor on the number of tokens a text becomes, known without tokenizing it.

Tokenizing costs CPU in proportion to the text (about 0.3 s of one core for 1,000,000 characters with
SmolLM2's tokenizer), and a prompt of that size is refused anyway when it is far beyond the model's
maximum input length. :class:`TokenFloor` lets the predictor refuse such a prompt before it is rendered
or tokenized: a token stands for at most ``max_token_chars`` characters of the text, so a text of
``n`` characters becomes at least ``ceil(n / max_token_chars)`` tokens.

That holds only for tokenizers that keep every character of the input and never fold a run of unknown
characters into one token. It is decided from the fast tokenizer's own description
(``backend_tokenizer.to_str()``, the ``tokenizer.json`` format of huggingface/tokenizers):

* model ``BPE`` (the byte-level BPE of GPT-2, Llama 3, Qwen, SmolLM; the sentencepiece BPE of Llama 2
  and Mistral with ``byte_fallback``); not ``fuse_unk`` without ``byte_fallback`` or a byte-level
  pre-tokenizer (one unknown token could then stand for any number of characters), not ``WordPiece``
  or ``Unigram``;
* pre-tokenizers that split without removing anything (``ByteLevel``, ``Metaspace``, ``Digits``,
  ``Punctuation``, ``Split`` other than ``removed``, ``Sequence`` of these);
* normalizers that do not remove characters: ``Prepend``, ``Replace`` with a non-empty content,
  ``Lowercase``, ``NFD``/``NFKD`` (decomposition never shortens a text) and ``NFC``/``NFKC``
  (composition shortens a text by at most 3 characters to 1: a Hangul syllable from its three
  jamo), with the shortening taken into the floor.

For any other tokenizer there is no floor (:meth:`TokenFloor.at_least` returns 0) and every prompt is
tokenized as before. A token's length is counted in the vocabulary's own characters: a byte-level
vocabulary uses one character per byte, so an entry decodes to at most as many characters as it has;
a sentencepiece piece (``▁the``) decodes to as many; a byte-fallback entry (``<0x0A>``) to at most
one; an added token to its content.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

log = logging.getLogger(__name__)

_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
#: Pre-tokenizers that split a text without dropping any of it (huggingface/tokenizers pre_tokenizers).
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split"}
#: How many characters NFC/NFKC composition may fold into one (Hangul L+V+T jamo -> one syllable).
_COMPOSITION_SHRINK = 3.0


@dataclass(frozen=True)
class TokenFloor:
    """``at_least(*texts)``: the fewest tokens those texts can become with this tokenizer.

    Attributes:
        max_token_chars: the most characters of input one token can stand for (0: no floor known).
        shrink: by how much the normalizer may shorten a text (1: not at all).
        reason: why there is no floor (empty when there is one), for the log.
    """

    max_token_chars: int
    shrink: float = 1.0
    reason: str = ""

    @classmethod
    def of(cls, tokenizer: Any) -> "TokenFloor":
        """The floor of a Hugging Face tokenizer (a fast one; a slow tokenizer has none)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return cls(0, reason="not a fast tokenizer")
        try:
            spec = json.loads(backend.to_str())
        except (ValueError, TypeError, AttributeError) as exc:
            return cls(0, reason=f"its description could not be read ({exc})")
        return cls.of_spec(spec)

    @classmethod
    def of_spec(cls, spec: dict[str, Any]) -> "TokenFloor":
        """The floor of a tokenizer described as in ``tokenizer.json``."""
        model = spec.get("model") or {}
        pre = spec.get("pre_tokenizer")
        byte_level = any(p.get("type") == "ByteLevel" for p in _flatten(pre))
        if model.get("type") != "BPE":
            return cls(0, reason=f"its model is {model.get('type')!r}, not BPE")
        if model.get("fuse_unk") and not model.get("byte_fallback") and not byte_level:
            return cls(0, reason="it fuses runs of unknown characters into one token")
        for step in _flatten(pre):
            kind = step.get("type")
            if kind not in _KEEPING_PRE_TOKENIZERS or step.get("behavior") == "Removed":
                return cls(0, reason=f"its pre-tokenizer {kind!r} may drop characters")
        shrink = 1.0
        for step in _flatten(spec.get("normalizer")):
            kind = step.get("type")
            if kind in ("NFC", "NFKC"):
                shrink *= _COMPOSITION_SHRINK
            elif kind == "Replace":
                pattern = step.get("pattern") or {}
                before = str(pattern.get("String", "")) if isinstance(pattern, dict) else ""
                after = str(step.get("content", ""))
                if not before or not after:  # a regex or a deletion: no bound on what it removes
                    return cls(0, reason="its normalizer replaces a pattern or deletes text")
                shrink *= max(1.0, len(before) / len(after))
            elif kind not in ("Prepend", "Lowercase", "NFD", "NFKD"):
                return cls(0, reason=f"its normalizer {kind!r} may remove characters")
        lengths = [1 if _BYTE_FALLBACK.match(entry) else len(entry) for entry in (model.get("vocab") or {})]
        lengths += [len(str(token.get("content", ""))) for token in spec.get("added_tokens") or ()]
        longest = max(lengths, default=0)
        if longest < 1:
            return cls(0, reason="its vocabulary is empty")
        return cls(longest, shrink)

    def at_least(self, *texts: str) -> int:
        """The fewest tokens ``texts`` (all of them together) become; 0 when no floor is known."""
        if self.max_token_chars < 1:
            return 0
        chars = sum(len(text) for text in texts)
        return math.ceil(chars / (self.max_token_chars * self.shrink))


def _flatten(step: Optional[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """The steps of a normalizer or pre-tokenizer description, ``Sequence`` entries expanded."""
    if not step:
        return []
    if step.get("type") == "Sequence":
        inner = step.get("normalizers") or step.get("pretokenizers") or []
        return [leaf for part in inner for leaf in _flatten(part)]
    return [step]
