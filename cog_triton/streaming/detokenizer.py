"""Incremental (streaming) detokenization of generated token ids into text deltas.

Triton hands the predictor the generated token ids one response at a time (0, 1 or several ids per
response). Decoding each id on its own is wrong: byte-level BPE splits one emoji or CJK character
over several tokens (each alone decodes to U+FFFD), and sentencepiece tokenizers drop the leading
space of the first token of a decode call. Decoding everything again for every response is right
but costs O(total length) per token. :class:`IncrementalDetokenizer` decodes a small sliding window
of tokens instead and only emits text that later tokens cannot change.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"

# The replacements of transformers' ``clean_up_tokenization`` (applied by ``decode`` when the
# tokenizer has ``clean_up_tokenization_spaces`` set). A text ending with a proper prefix of one of
# them may still change when the next token arrives (" n" + "'t" -> "n't"), so it is held back.
_CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
_CLEANUP_PROPER_PREFIXES = frozenset(p[:i] for p in _CLEANUP_PATTERNS for i in range(1, len(p)))
_CLEANUP_MAX_PREFIX = max(len(p) for p in _CLEANUP_PROPER_PREFIXES)

# How many of the last token boundaries are tried when looking for a place to move the read offset
# while the window text ends with an incomplete character.
_BOUNDARY_TRIES = 4


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text deltas.

    Construct one per generation with the model's Hugging Face tokenizer, call :meth:`push` with the
    ids of each response and :meth:`finish` once at the end. Guarantees:

    * ``"".join(deltas) + finish()`` equals ``tokenizer.decode(all_ids,
      skip_special_tokens=skip_special_tokens)`` exactly.
    * A delta never ends in a half-done multi-byte character: U+FFFD is only emitted when the full
      text has it at that place too (the bytes are invalid UTF-8, not merely incomplete).
    * Each :meth:`push` decodes O(window) tokens (the ids of the previous and the current push plus
      the few ids of a pending incomplete character), never the whole sequence; only
      :meth:`finish` decodes everything, once.

    Algorithm: the prefix_offset/read_offset technique of vLLM, TGI and ``TextStreamer``. The text
    of the window's prefix (ids already emitted, kept as context so leading-space markers and byte
    sequences decode as in the full text) is compared with the text of the whole window; the part
    after the prefix is the delta. A trailing U+FFFD (incomplete character) — and, for tokenizers
    with ``clean_up_tokenization_spaces``, a trailing start of a cleanup pattern such as ``" n"`` —
    is held back until more ids arrive. :meth:`finish` reconciles against one full decode.

    Units: ids are token ids (``int``); lengths in this class are counted in tokens, text offsets
    in characters (Python ``str`` code points).

    If the tokenizer's decode is not consistent between a window and the full sequence (no known
    byte-level BPE or sentencepiece tokenizer), or more than ``max_window`` ids pile up without a
    stable boundary, streaming stops (pushes return ``""``) and :meth:`finish` returns the rest; a
    warning is logged.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        *,
        max_window: int = 256,
        noop_ids: Optional[frozenset[int]] = None,
    ) -> None:
        """Create a detokenizer.

        Args:
            tokenizer: a ``transformers.PreTrainedTokenizerBase`` (anything with ``decode(ids,
                skip_special_tokens=...)``).
            skip_special_tokens: passed to every ``decode`` call; with ``True``, special tokens
                such as ``<|im_end|>`` produce no text.
            max_window: at most this many ids (tokens) carried over from earlier pushes in the
                decode window before streaming gives up and leaves the rest to :meth:`finish`.
            noop_ids: :func:`find_noop_ids` of ``tokenizer``, found once for many detokenizers (a decode per special
                token: about 0.2 ms for SmolLM2's 17, more for vocabularies with hundreds); None: found here.

        Raises:
            ValueError: ``max_window`` is smaller than 8.
        """
        if max_window < 8:
            raise ValueError(f"max_window must be at least 8 tokens, got {max_window}")
        self._tokenizer = tokenizer
        self._skip = bool(skip_special_tokens)
        self._max_window = int(max_window)
        self._cleanup = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        if not self._skip:
            self._noop_ids: frozenset[int] = frozenset()
        else:
            self._noop_ids = noop_ids if noop_ids is not None else find_noop_ids(tokenizer)

        self._ids: list[int] = []  # every id pushed
        self._win: list[int] = []  # the decode window: ids since the prefix offset (no-op ids left out)
        self._read = 0  # read offset in _win: _win[:_read] is the prefix, its text fully emitted
        self._prefix_text = ""  # decode(_win[:_read])
        self._extra = ""  # text after the prefix that was already emitted (ids _win[_read:])
        self._parts: list[str] = []  # every delta returned, for the reconciliation in finish()
        self._degraded = False
        self._finished = False

    # --- public API -----------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        """Number of token ids pushed so far (tokens, special ones included)."""
        return len(self._ids)

    def push(self, token_ids: Iterable[int]) -> str:
        """Append token ids and return the text that became stable (possibly ``""``).

        Args:
            token_ids: the new ids (tokens), in order; may be empty. Python ints or anything with
                ``__index__`` (NumPy integers, a NumPy array of them).

        Returns:
            The text delta in characters; never ends in a character that later ids may complete.

        Raises:
            TypeError: ``token_ids`` is not a sequence of integers (a bare ``int`` or a ``str``
                included).
            ValueError: an id is negative.
            RuntimeError: called after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.push() called after finish()")
        new_ids = _as_id_list(token_ids)
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        if self._degraded:
            return ""
        added = 0
        for token_id in new_ids:
            if token_id not in self._noop_ids:
                self._win.append(token_id)
                added += 1
        if added == 0:
            return ""
        if len(self._win) - added > self._max_window:
            self._degrade(f"more than {self._max_window} tokens without a stable text boundary")
            return ""
        delta = self._step()
        if delta:
            self._parts.append(delta)
        return delta

    def finish(self) -> str:
        """Return the rest of the text: everything not yet emitted, reconciled with a full decode.

        Decodes all ids once (O(total length)). A second call returns ``""``.

        Returns:
            The final text delta (characters), such that all deltas joined equal the full decode.
        """
        if self._finished:
            return ""
        self._finished = True
        full = self._decode(self._ids)
        if full.endswith(REPLACEMENT_CHAR) and _ends_inside_a_character(self._tokenizer, self._ids):
            # The generation stopped (max_tokens) part-way through a multi-byte character: its first
            # bytes are not text yet, and would come out as U+FFFD. Drop them.
            full = full[:-1]
        emitted = "".join(self._parts)
        if full.startswith(emitted):
            rest = full[len(emitted) :]
        else:  # should not happen; the invariant cannot be restored, keep the damage small
            common = _common_prefix_len(emitted, full)
            logger.warning(
                "incremental detokenization diverged from the full decode after %d characters "
                "(emitted %r, full text %r)",
                common,
                emitted[common : common + 40],
                full[common : common + 40],
            )
            rest = full[common:]
        self._parts.append(rest)
        self._win.clear()
        return rest

    # --- internals ------------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip)

    def _stable_end(self, text: str) -> int:
        """Length of the part of ``text`` that later ids cannot change."""
        end = len(text)
        if end and text[end - 1] == REPLACEMENT_CHAR:
            end -= 1
        if self._cleanup:
            end -= _cleanup_holdback(text, end)
        return end

    def _step(self) -> str:
        text = self._decode(self._win)
        prefix = self._prefix_text
        done = len(prefix) + len(self._extra)  # characters of `text` already emitted
        if not (text.startswith(prefix) and text.startswith(self._extra, len(prefix))):
            # Not consistent with what the window decoded to before: wait for more ids (push()
            # gives up once the window grows past max_window).
            return ""
        end = self._stable_end(text)
        delta = text[done:end] if end > done else ""
        if end == len(text):
            self._sync(len(self._win), text)
            return delta
        self._extra += delta
        self._try_move_read_offset(text, max(end, done))
        return delta

    def _sync(self, boundary: int, text_upto: str) -> None:
        """Everything up to token ``boundary`` of the window (text ``text_upto``) has been emitted.

        Makes it the new read offset; the caller sets ``_extra`` afterwards when needed.
        """
        old_read = self._read
        # never empty: push() calls _step only after adding ids; _try_move_read_offset passes boundary > _read
        new_prefix_text = self._decode(self._win[old_read:boundary])
        if new_prefix_text:
            # The ids of this step become the prefix (context for the next step).
            del self._win[:old_read]
            self._read = boundary - old_read
            self._prefix_text = new_prefix_text
        else:
            # No text in the new ids (e.g. a lone sentencepiece "▁"): keep the old prefix as context.
            self._read = boundary
            self._prefix_text = text_upto
        self._extra = ""

    def _try_move_read_offset(self, text: str, emitted_end: int) -> None:
        """Move the read offset to the last token boundary whose text has been emitted completely.

        Keeps the window short while the text keeps ending in an incomplete character.
        """
        n = len(self._win)
        lowest = max(self._read + 1, n - _BOUNDARY_TRIES)
        for boundary in range(n - 1, lowest - 1, -1):
            upto = self._decode(self._win[:boundary])
            if len(upto) <= len(self._prefix_text) or len(upto) > emitted_end:
                continue
            if not text.startswith(upto):
                continue
            if self._cleanup and _cleanup_holdback(upto, len(upto)):
                continue
            extra_after = text[len(upto) : emitted_end]
            self._sync(boundary, upto)
            self._extra = extra_after
            return

    def _degrade(self, why: str) -> None:
        logger.warning("incremental detokenization stopped streaming (%s); the rest comes at the end", why)
        self._degraded = True
        self._win.clear()


def find_noop_ids(tokenizer: Any) -> frozenset[int]:
    """Special ids that ``decode(..., skip_special_tokens=True)`` drops: kept out of a detokenizer's window (one
    decode per special token: find them once per tokenizer and pass them to each :class:`IncrementalDetokenizer`)."""
    candidates: set[int] = set()
    try:
        candidates.update(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        candidates.update(int(i) for i, tok in added.items() if getattr(tok, "special", False))
    except Exception:  # an exotic tokenizer: no filtering, only a little slower
        return frozenset()
    noop = set()
    for token_id in candidates:
        try:
            if tokenizer.decode([token_id], skip_special_tokens=True) == "":
                noop.add(token_id)
        except Exception:
            continue
    return frozenset(noop)


def _cleanup_holdback(text: str, end: int) -> int:
    """Length of the longest suffix of ``text[:end]`` that may start a cleanup replacement."""
    for size in range(min(_CLEANUP_MAX_PREFIX, end), 0, -1):
        if text[end - size : end] in _CLEANUP_PROPER_PREFIXES:
            return size
    return 0


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode table: the character a byte-level BPE vocabulary uses
    for each byte -> that byte (the same table as transformers' ``bytes_to_unicode``)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_DECODER = _byte_decoder()
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _token_bytes(token: str) -> Optional[bytes]:
    """The bytes a vocabulary entry stands for: byte-fallback ``<0xNN>``, or byte-level BPE characters."""
    match = _BYTE_FALLBACK.match(token)
    if match:
        return bytes([int(match.group(1), 16)])
    if token and all(ch in _BYTE_DECODER for ch in token):
        return bytes(_BYTE_DECODER[ch] for ch in token)
    return None  # plain text (sentencepiece pieces): complete characters


def _ends_inside_a_character(tokenizer: Any, ids: Sequence[int]) -> bool:
    """True when the last tokens' bytes end with an incomplete UTF-8 sequence (1-3 bytes of a longer one).

    A U+FFFD that the model generated as a character (bytes EF BF BD) is complete and stays.
    """
    try:
        tokens = tokenizer.convert_ids_to_tokens(list(ids[-4:]))
    except Exception:  # noqa: BLE001 - an exotic tokenizer: keep the text as decoded
        return False
    tail = b""
    for token in tokens:
        raw = _token_bytes(str(token)) if token is not None else None
        if raw is None:
            tail = b""  # text before this point is whole characters
            continue
        tail += raw
    if not tail:
        return False
    for back in range(1, min(4, len(tail)) + 1):
        byte = tail[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead byte
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back < need
    return False


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _as_id_list(token_ids: Iterable[int]) -> list[int]:
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Iterable):
        raise TypeError(f"token_ids must be a sequence of integer token ids, got {type(token_ids).__name__}")
    out = []
    for token_id in token_ids:
        if isinstance(token_id, bool):
            raise TypeError("token ids must be integers, got a bool")
        try:
            value = operator.index(token_id)
        except TypeError:
            raise TypeError(f"token ids must be integers, got {token_id!r} ({type(token_id).__name__})") from None
        if value < 0:
            raise ValueError(f"token ids must be non-negative, got {value}")
        out.append(value)
    return out
