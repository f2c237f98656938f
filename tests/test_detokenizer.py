"""Tests of cog_triton.streaming.detokenizer.IncrementalDetokenizer against the real SmolLM2 tokenizer."""

from __future__ import annotations

import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cog_triton.streaming.detokenizer import _ends_inside_a_character, IncrementalDetokenizer  # noqa: E402

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"
FFFD = "\ufffd"

TEXTS = [
    "Hello world, this is a plain English sentence with spaces.",
    "I like 🤖 and 👨‍👩‍👧 families",
    "机器学习是人工智能的一个分支",
    "Mixed: naïve café — 日本語のテキスト and emoji 😀🎉 in one line!",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "Line one\n\nLine three\twith a tab\r\nand CRLF   and  odd   spacing ",
    "Ünïcödé, Ελληνικά, русский, العربية, हिन्दी, 한국어, ไทย",
    "  leading spaces and trailing spaces   ",
    "🏳️‍🌈👍🏽🇫🇷 flags and skin tones",
    "JSON: {\"key\": [1, 2.5, null], \"ü\": \"✓\"}",
]


def _load_tokenizer(**kwargs):
    if not (CHECKPOINT / "tokenizer.json").is_file():
        pytest.fail(f"tokenizer not available at {CHECKPOINT}: run scripts/setup", pytrace=False)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(CHECKPOINT), **kwargs)


@pytest.fixture(scope="session")
def tokenizer():
    return _load_tokenizer()


@pytest.fixture(scope="session")
def cleanup_tokenizer():
    """The same tokenizer with transformers' clean_up_tokenization forced on (as Llama 3 configs ask)."""
    return _load_tokenizer(
        clean_up_tokenization_spaces=True,
        clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True,
    )


class RecordingTokenizer:
    """Wraps a tokenizer and records the length (in tokens) of every decode call."""

    def __init__(self, tok):
        self._tok = tok
        self.lengths: list[int] = []

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def decode(self, ids, **kwargs):
        self.lengths.append(len(ids))
        return self._tok.decode(ids, **kwargs)


def stream(tok, ids, chunks=None, skip=True, **kwargs):
    """Push ``ids`` in the given chunk sizes (default: one at a time); return (deltas, final)."""
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip, **kwargs)
    deltas = []
    pos = 0
    for size in chunks if chunks is not None else [1] * len(ids):
        deltas.append(det.push(ids[pos : pos + size]))
        pos += size
    assert pos == len(ids), "chunk sizes must cover all ids"
    final = det.finish()
    return deltas, final


def random_chunks(rng, n, sizes=(0, 1, 1, 1, 2, 3, 5, 8)):
    chunks = []
    total = 0
    while total < n:
        size = min(rng.choice(sizes), n - total)
        chunks.append(size)
        total += size
    return chunks


def check_stream(tok, ids, chunks=None, skip=True):
    """The invariants: prefix-stable deltas, concat == full decode (less the U+FFFD of a character
    left incomplete at the very end), no spurious U+FFFD."""
    full = tok.decode(ids, skip_special_tokens=skip)
    if full.endswith(FFFD) and _ends_inside_a_character(tok, ids):
        full = full[:-1]
    deltas, final = stream(tok, ids, chunks, skip)
    emitted = ""
    for delta in deltas:
        emitted += delta
        assert full.startswith(emitted), (ids, emitted, full)
    assert emitted + final == full, (ids, deltas, final, full)
    if FFFD not in full:
        assert not any(FFFD in d for d in deltas + [final]), (ids, deltas)
    return deltas, final


# --- the cases of the brief ------------------------------------------------------------------


def test_plain_english_spaces_one_token_at_a_time(tokenizer):
    text = "Hello world, this is a plain English sentence with spaces."
    ids = tokenizer.encode(text)
    deltas, final = check_stream(tokenizer, ids)
    assert "".join(deltas) == text  # all of it streamed, nothing left for finish()
    assert final == ""
    # ASCII tokens come out one per push, each with its own leading space.
    assert deltas == [tokenizer.decode([i]) for i in ids]
    assert " world" in deltas and " sentence" in deltas


@pytest.mark.parametrize("text", [TEXTS[i] for i in (1, 2, 3, 6, 8, 9)])
def test_multibyte_characters_never_half_done(tokenizer, text):
    ids = tokenizer.encode(text)
    # The tokenization really splits characters across tokens (else this test proves nothing).
    assert any(FFFD in tokenizer.decode([i]) for i in ids)
    deltas, final = check_stream(tokenizer, ids)
    assert "".join(deltas) + final == text
    assert final == ""  # the text ends in a complete character: all of it was streamed


def test_emoji_come_out_whole(tokenizer):
    text = "I like 🤖 and 👨‍👩‍👧 families"
    deltas, _ = check_stream(tokenizer, tokenizer.encode(text))
    # " 🤖" is three byte-level tokens; the space comes first, the emoji in one piece once complete.
    assert deltas[2:5] == [" ", "", "🤖"]
    assert "👨" in deltas and "👩" in deltas and "👧" in deltas
    assert all(FFFD not in d for d in deltas)
    joined = "".join(deltas)
    assert joined == text


def test_cjk(tokenizer):
    text = "机器学习是人工智能的一个分支"
    deltas, final = check_stream(tokenizer, tokenizer.encode(text))
    assert "".join(deltas) + final == text
    # Every delta is made of whole characters of the text, in order.
    assert [d for d in deltas if d] and all(d in text for d in deltas)


def test_newlines_and_code(tokenizer):
    text = TEXTS[4] + TEXTS[5]
    deltas, final = check_stream(tokenizer, tokenizer.encode(text))
    assert "".join(deltas) + final == text


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(tokenizer, skip):
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = (
        [im_start]
        + tokenizer.encode("assistant\nSure 🤖!")
        + [im_end]
        + tokenizer.encode("\n机器 after")
        + [im_end, im_end]
    )
    deltas, final = check_stream(tokenizer, ids, skip=skip)
    text = "".join(deltas) + final
    if skip:
        assert text == "assistant\nSure 🤖!\n机器 after"
        assert "<|im_end|>" not in text
    else:
        assert text == "<|im_start|>assistant\nSure 🤖!<|im_end|>\n机器 after<|im_end|><|im_end|>"
        assert "<|im_end|>" in deltas


def test_special_token_between_bytes_of_one_character(tokenizer):
    """With skip_special_tokens, a special id inside a split character leaves it intact."""
    robot = tokenizer.encode(" 🤖")
    assert len(robot) == 3
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = robot[:2] + [im_end] + robot[2:]
    deltas, final = check_stream(tokenizer, ids, skip=True)
    assert "".join(deltas) + final == " 🤖"
    check_stream(tokenizer, ids, skip=False)


def test_random_chunk_sizes_and_empty_pushes(tokenizer):
    rng = random.Random(1234)
    text = " ".join(TEXTS)
    ids = tokenizer.encode(text)
    for _ in range(30):
        chunks = random_chunks(rng, len(ids))
        deltas, final = check_stream(tokenizer, ids, chunks)
        assert "".join(deltas) + final == text
    # Empty pushes return "" and change nothing.
    det = IncrementalDetokenizer(tokenizer)
    assert det.push([]) == ""
    out = ""
    for token_id in ids:
        out += det.push([token_id])
        assert det.push([]) == ""
        assert det.push(()) == ""
    out += det.finish()
    assert out == text
    assert det.num_tokens == len(ids)


def test_everything_in_one_push(tokenizer):
    text = " ".join(TEXTS)
    ids = tokenizer.encode(text)
    det = IncrementalDetokenizer(tokenizer)
    assert det.push(ids) + det.finish() == text


def test_a_stream_cut_inside_a_character_ends_without_a_replacement_character(tokenizer):
    """A stream cut by max_tokens in the middle of an emoji (seen: a reply of 🍕 ending in "\ufffd"):
    the incomplete bytes are dropped, never emitted as U+FFFD."""
    for emoji in (" 🤖", " 🍕", " 한국", " ト"):
        encoded = tokenizer.encode(emoji)
        cut_inside = 0
        for cut in range(1, len(encoded)):
            ids = tokenizer.encode("Robot:") + encoded[:cut]
            if not tokenizer.decode(ids).endswith(FFFD):  # a cut between characters
                continue
            cut_inside += 1
            det = IncrementalDetokenizer(tokenizer)
            streamed = "".join(det.push([i]) for i in ids)
            final = det.finish()
            assert FFFD not in streamed + final, (emoji, cut)
            assert streamed + final == tokenizer.decode(ids).rstrip(FFFD)
        assert cut_inside, emoji


def test_a_replacement_character_the_model_generates_is_kept(tokenizer):
    ids = tokenizer.encode("bad byte: \ufffd")
    det = IncrementalDetokenizer(tokenizer)
    text = "".join(det.push([i]) for i in ids) + det.finish()
    assert text == "bad byte: \ufffd"


def test_invariant_on_random_real_token_sequences(tokenizer):
    """Random slices of real encodings (starting and ending mid-character), random chunking."""
    rng = random.Random(20240601)
    encoded = [tokenizer.encode(t) for t in TEXTS]
    specials = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    for _ in range(400):
        ids: list[int] = []
        for _ in range(rng.randint(1, 4)):
            enc = rng.choice(encoded)
            a = rng.randrange(len(enc))
            b = rng.randint(a, len(enc))
            ids += enc[a:b]
            if rng.random() < 0.2:
                ids.insert(rng.randint(0, len(ids)), rng.choice(specials))
        for skip in (True, False):
            check_stream(tokenizer, ids, random_chunks(rng, len(ids)), skip=skip)


def test_invariant_on_random_vocab_ids(tokenizer):
    """Arbitrary ids (invalid UTF-8 byte soup included): the concatenation still equals decode()."""
    rng = random.Random(7)
    vocab = len(tokenizer)
    # Byte-level tokens that decode alone to U+FFFD: pieces of multi-byte characters.
    partial = [i for i in range(vocab) if FFFD in tokenizer.decode([i])]
    assert len(partial) > 100
    for n in range(400):
        length = rng.randint(0, 60)
        if n % 2:
            ids = [rng.randrange(vocab) for _ in range(length)]
        else:  # mostly partial-character tokens: lots of U+FFFD, some of them completed
            ids = [rng.choice(partial) if rng.random() < 0.8 else rng.randrange(vocab) for _ in range(length)]
        for skip in (True, False):
            check_stream(tokenizer, ids, random_chunks(rng, len(ids)), skip=skip)


def test_cleanup_tokenization_spaces(cleanup_tokenizer):
    """clean_up_tokenization rewrites " n't" -> "n't" etc. across token boundaries; still exact."""
    tok = cleanup_tokenizer
    assert tok.decode(tok.encode("a . b n't c 's")) == "a. bn't c's"
    rng = random.Random(99)
    pieces = [" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're"]
    pieces += ["n", "'", " ", "  ", "x", "y.", "🤖", "中"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
        ids = tok.encode(text)
        check_stream(tok, ids)
        check_stream(tok, ids, random_chunks(rng, len(ids)))


# --- cost: O(window) per token -----------------------------------------------------------------


def test_decode_window_stays_small(tokenizer):
    text = " ".join(TEXTS) * 20
    ids = tokenizer.encode(text)
    assert len(ids) > 2000
    rec = RecordingTokenizer(tokenizer)
    det = IncrementalDetokenizer(rec)
    rec.lengths.clear()  # ignore the construction-time probes
    out = "".join(det.push([i]) for i in ids)
    assert max(rec.lengths) <= 12, max(rec.lengths)
    assert len(rec.lengths) <= 3 * len(ids)
    rec.lengths.clear()
    out += det.finish()
    assert rec.lengths == [len(ids)]  # finish() decodes everything once
    assert out == text


def test_decode_window_small_with_chunks_and_byte_soup(tokenizer):
    rng = random.Random(5)
    partial = [i for i in range(len(tokenizer)) if FFFD in tokenizer.decode([i])]
    ids = [rng.choice(partial) for _ in range(3000)]
    rec = RecordingTokenizer(tokenizer)
    det = IncrementalDetokenizer(rec)
    rec.lengths.clear()
    chunks = random_chunks(rng, len(ids), sizes=(1, 2, 3))
    pos = 0
    out = ""
    for size in chunks:
        out += det.push(ids[pos : pos + size])
        pos += size
    assert max(rec.lengths) <= 20, max(rec.lengths)
    assert out + det.finish() == tokenizer.decode(ids, skip_special_tokens=True)


# --- a tokenizer whose token boundaries never meet character boundaries ------------------------


class StraddlingByteTokenizer:
    """Minimal byte-level tokenizer: id i decodes to the bytes vocab[i]; decode joins and decodes UTF-8."""

    def __init__(self, vocab: list[bytes]):
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens=False):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")


def _straddling(text: str):
    """Tokens of 3 bytes after a first byte of 1: every boundary falls inside a 3-byte character."""
    data = text.encode("utf-8")
    pieces = [data[:1]] + [data[i : i + 3] for i in range(1, len(data), 3)]
    return StraddlingByteTokenizer(pieces), list(range(len(pieces)))


def test_straddling_tokens_stream_whole_characters():
    text = "机器学习是人工智能的一个分支" * 3
    tok, ids = _straddling(text)
    det = IncrementalDetokenizer(tok)
    deltas = [det.push([i]) for i in ids]
    final = det.finish()
    assert "".join(deltas) + final == text
    assert not any(FFFD in d for d in deltas)
    # Each token completes one character, which is emitted at once.
    assert deltas[0] == ""
    assert deltas[1:] == list(text)
    assert final == ""


def test_gives_up_streaming_past_max_window_but_stays_exact(tokenizer, caplog):
    """Ids that decode to nothing (unknown ids) pile up in the window; past max_window streaming
    stops, and finish() still returns exactly the rest."""
    unknown = len(tokenizer) + 1000
    assert tokenizer.decode([unknown]) == ""
    ids = tokenizer.encode("Hello there") + [unknown] * 20 + tokenizer.encode(" world 🤖")
    det = IncrementalDetokenizer(tokenizer, skip_special_tokens=False, max_window=8)
    streamed = "".join(det.push([i]) for i in ids)
    assert streamed == "Hello there"
    assert det.finish() == " world 🤖"
    assert det.num_tokens == len(ids)
    assert "stopped streaming" in caplog.text


# --- API details ---------------------------------------------------------------------------------


def test_properties_and_numpy_ids(tokenizer):
    ids = tokenizer.encode("Hello 🤖 world")
    det = IncrementalDetokenizer(tokenizer)
    assert det.num_tokens == 0
    out = det.push(np.array(ids[:2], dtype=np.int32))
    out += det.push([np.int64(i) for i in ids[2:]])
    assert det.num_tokens == len(ids)
    assert out + det.finish() == "Hello 🤖 world"
    assert det.finish() == ""  # idempotent


def test_invalid_pushes(tokenizer):
    det = IncrementalDetokenizer(tokenizer)
    with pytest.raises(TypeError):
        det.push(5)
    with pytest.raises(TypeError):
        det.push("abc")
    with pytest.raises(TypeError):
        det.push([1.5])
    with pytest.raises(TypeError):
        det.push([True])
    with pytest.raises(ValueError):
        det.push([-1])
    assert det.num_tokens == 0
    det.finish()
    with pytest.raises(RuntimeError):
        det.push([1])
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tokenizer, max_window=2)


# --- what the mutation run of scripts/mutation showed untested ---------------------------------------


def test_the_byte_table_is_the_inverse_of_transformers_bytes_to_unicode():
    """_BYTE_DECODER is built once at import; the builder itself is compared with GPT-2's table."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from cog_triton.streaming.detokenizer import _byte_decoder

    assert _byte_decoder() == {char: byte for byte, char in bytes_to_unicode().items()}


def test_token_bytes_of_byte_fallback_and_byte_level_tokens():
    from cog_triton.streaming.detokenizer import _token_bytes

    assert _token_bytes("<0xE2>") == b"\xe2"  # sentencepiece byte fallback: hexadecimal
    assert _token_bytes("<0x0a>") == b"\n"
    assert _token_bytes("Ġhé") == b" h\xe9"  # byte-level BPE: each character is one byte ("Ġ" 0x20, "é" 0xE9)
    assert _token_bytes("▁hello") is None  # a sentencepiece piece: whole characters
    assert _token_bytes("") is None


# SmolLM2's byte-level vocabulary: "Ã" is byte 0xC3 (lead of 2), "©" 0xA9 (continuation), "ó" 0xF3 (lead of 4)
LEAD2, CONT, LEAD4 = 142, 119, 188


@pytest.mark.parametrize(
    ("ids", "inside"),
    [
        ([LEAD2], True),  # 1 byte of 2
        ([LEAD2, CONT], False),  # é complete
        ([CONT], False),  # a stray continuation byte: invalid, not incomplete
        ([LEAD4], True),  # 1 byte of 4 (lead F3: 0xF3 & 0xF8 == 0xF0)
        ([LEAD4, CONT, CONT], True),  # 3 bytes of 4
        ([LEAD4, CONT, CONT, CONT], False),  # 4 of 4
        ([19556], False),  # "Hello": ASCII
        ("unknown-then-lead", True),  # an id with no token resets the tail; the lead byte after it counts
        ("lead-then-unknown", False),  # ... and one before it does not
    ],
)
def test_ends_inside_a_character(tokenizer, ids, inside):
    unknown = len(tokenizer) + 5
    assert tokenizer.convert_ids_to_tokens([unknown]) == [None]
    if isinstance(ids, str):
        ids = {"unknown-then-lead": [unknown, LEAD2], "lead-then-unknown": [LEAD2, unknown]}[ids]
    assert _ends_inside_a_character(tokenizer, ids) is inside
    emoji = tokenizer.encode("😀")
    assert _ends_inside_a_character(tokenizer, emoji) is False and _ends_inside_a_character(tokenizer, emoji[:-1])


def test_ends_inside_a_character_with_a_tokenizer_that_cannot_convert_ids():
    class NoTokens:  # stand-in for a tokenizer without convert_ids_to_tokens support (none installed here)
        def convert_ids_to_tokens(self, ids):
            raise NotImplementedError

    assert _ends_inside_a_character(NoTokens(), [1, 2]) is False


def test_a_stream_cut_after_the_lead_byte_of_e_acute_loses_only_that_character(tokenizer, caplog):
    ids = tokenizer.encode("caf") + [LEAD2]
    det = IncrementalDetokenizer(tokenizer)
    assert "".join(det.push([i]) for i in ids) + det.finish() == "caf"
    assert not _warnings(caplog)  # reconciled by dropping the one U+FFFD, not by the divergence path


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cog_triton.streaming.detokenizer"]


@pytest.mark.parametrize(("first", "degrades_at"), [(2, 5), (3, 4)])  # 8 carried over: not yet; 9: stop
def test_streaming_stops_once_more_than_max_window_ids_are_carried_over(tokenizer, caplog, first, degrades_at):
    """Window: the first push has `first` ids (text, then unknown ids that decode to nothing); each later push
    three unknown ids. Before push k, 3 * (k - 2) + first ids are carried over; more than 8 stops streaming."""
    unknown = len(tokenizer) + 1000
    det = IncrementalDetokenizer(tokenizer, max_window=8)
    assert det.push([19556] + [unknown] * (first - 1)) == "Hello"
    k = 1
    while not _warnings(caplog):
        k += 1
        assert det.push([unknown] * 3) == ""
        assert k < 10, "streaming never stopped"
    assert k == degrades_at
    assert _warnings(caplog) == [
        "incremental detokenization stopped streaming (more than 8 tokens without a stable text boundary); "
        "the rest comes at the end"
    ]
    assert det.push(tokenizer.encode(" world")) == ""  # nothing more is streamed ...
    for _ in range(5):
        assert det.push([unknown] * 3) == ""
    assert len(_warnings(caplog)) == 1  # (and streaming is not tried again)
    assert det.finish() == " world"  # ... the rest comes at the end


def test_the_default_window_is_256_ids(tokenizer, caplog):
    unknown = len(tokenizer) + 1000
    det = IncrementalDetokenizer(tokenizer)
    assert det.push([19556] + [unknown] * 255) == "Hello"
    det.push([unknown])  # 256 carried over: still streaming
    assert not _warnings(caplog)
    det.push([unknown])  # 257
    assert len(_warnings(caplog)) == 1


def test_special_ids_that_decode_to_nothing_stay_out_of_the_window(tokenizer, caplog):
    """<|im_end|> (in all_special_ids) and <file_sep> (special only in added_tokens_decoder) decode to "";
    hundreds of them do not fill the window, so the text after them still streams."""
    det = IncrementalDetokenizer(tokenizer, max_window=8)
    assert det.push([19556]) == "Hello"
    for _ in range(20):
        assert det.push([2, 5]) == ""
    assert det.push(tokenizer.encode(" world")) == " world"
    assert not _warnings(caplog)
    assert IncrementalDetokenizer(tokenizer).push([2]) == ""  # skip_special_tokens defaults to True


def _fills_the_window(tok, token_id, caplog) -> bool:
    """Whether 20 pushes of `token_id` after some text stop the streaming (max_window 8)."""
    caplog.clear()
    det = IncrementalDetokenizer(tok, max_window=8)
    det.push([ord("h")])
    for _ in range(20):
        det.push([token_id])
    return bool(_warnings(caplog))


def test_which_special_ids_stay_out_of_the_window(caplog):
    class Added:  # transformers' AddedToken has .special; an entry without it is not special
        def __init__(self, **kw):
            self.__dict__.update(kw)

    # decode raises for 1: not filtered, and the ids after it are still tried
    tok = CharTokenizer(specials={0: "", 1: None, 2: ""})
    assert [_fills_the_window(tok, i, caplog) for i in (0, 2)] == [False, False]
    # no all_special_ids: the special entries of added_tokens_decoder still count, the others do not
    tok = CharTokenizer(specials={3: "", 4: ""}, added_tokens_decoder={3: Added(special=True), 4: Added()})
    del tok.all_special_ids
    assert [_fills_the_window(tok, i, caplog) for i in (3, 4)] == [False, True]


class CharTokenizer:
    """A stand-in tokenizer: id i is the character chr(i), with optional special ids (text, "" or None: decode
    raises) and an `upper` flag: a "!" anywhere upper-cases the whole decode, a context dependence no real
    tokenizer here has, to reach the paths for decodes that disagree between a window and the full text."""

    def __init__(self, specials=None, upper=False, **attributes):
        self.specials = specials or {}
        self.all_special_ids = list(self.specials)
        self.upper = upper
        self.__dict__.update(attributes)

    def decode(self, ids, skip_special_tokens=True):
        out = []
        for i in ids:
            if i in self.specials:
                if self.specials[i] is None:
                    raise ValueError(f"cannot decode {i}")
                out.append("" if skip_special_tokens else self.specials[i] or f"<{i}>")
            else:
                out.append(chr(i))
        text = "".join(out)
        return text.upper() if self.upper and "!" in text else text

    def convert_ids_to_tokens(self, ids):
        return [chr(i) for i in ids]


def test_a_decode_that_changes_earlier_text_is_held_back_and_reconciled_at_the_end(caplog):
    tok = CharTokenizer(upper=True)
    ids = [ord(c) for c in "ab" + "c" * 43 + "!" + "x" * 5]
    det = IncrementalDetokenizer(tok, max_window=64)
    deltas = [det.push([i]) for i in ids]
    assert deltas[:45] == ["a", "b"] + ["c"] * 43
    assert deltas[45:] == [""] * 6  # "ABC...!" does not extend "abc...": nothing more is streamed
    assert det.finish() == "AB" + "C" * 43 + "!XXXXX"  # everything, from the first character that differs
    assert _warnings(caplog) == [  # 40 characters of each side from where they differ
        "incremental detokenization diverged from the full decode after 0 characters "
        f"(emitted {('ab' + 'c' * 38)!r}, full text {('AB' + 'C' * 38)!r})"
    ]


def test_common_prefix_len():
    from cog_triton.streaming.detokenizer import _common_prefix_len

    pairs = [("abc", "abd"), ("ab", "abc"), ("abc", "ab"), ("", "x"), ("axc", "ayc"), ("abcd", "abcd")]
    assert [_common_prefix_len(a, b) for a, b in pairs] == [2, 2, 2, 0, 1, 4]


def test_cleanup_holds_back_only_what_may_start_a_replacement(cleanup_tokenizer):
    tok = cleanup_tokenizer
    space = tok.convert_tokens_to_ids("Ġ")
    ids = tok.encode("Hi") + [space] + tok.encode("n't")  # "Hi", " ", "n", "'t" -> "Hin't"
    det = IncrementalDetokenizer(tok)
    assert [det.push([i]) for i in ids] == ["Hi", "", "", "n't"]  # " " and " n" wait; "Hi" does not
    assert det.finish() == ""
    det = IncrementalDetokenizer(tok)
    assert det.push(tok.encode("Hello world")) == "Hello world"


def test_no_cleanup_without_the_attribute():
    """A tokenizer without clean_up_tokenization_spaces gets no hold-back: a trailing " n" streams at once."""
    det = IncrementalDetokenizer(CharTokenizer())
    assert det.push([ord(" "), ord("n")]) == " n"


def test_error_messages():
    tok = CharTokenizer()
    det = IncrementalDetokenizer(tok)
    for value, message in [
        (5, "token_ids must be a sequence of integer token ids, got int"),
        ("abc", "token_ids must be a sequence of integer token ids, got str"),
        ([1.5], r"token ids must be integers, got 1.5 \(float\)"),
        ([True], "token ids must be integers, got a bool"),
    ]:
        with pytest.raises(TypeError, match=f"^{message}$"):
            det.push(value)
    with pytest.raises(ValueError, match="^token ids must be non-negative, got -1$"):
        det.push([-1])
    det.finish()
    with pytest.raises(RuntimeError, match=r"^IncrementalDetokenizer\.push\(\) called after finish\(\)$"):
        det.push([1])
    with pytest.raises(ValueError, match="^max_window must be at least 8 tokens, got 7$"):
        IncrementalDetokenizer(tok, max_window=7)


def test_the_special_ids_that_decode_to_nothing_are_found_once_and_given(tokenizer) -> None:
    """A stream process finds them once per tokenizer (cog_triton.streaming.generation.Generator.noop_ids) rather than
    once per prediction: given, they are used as they are, and the text is the same as when a detokenizer finds them."""
    from cog_triton.streaming.detokenizer import find_noop_ids

    noop = find_noop_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in noop and noop <= set(tokenizer.added_tokens_decoder)
    ids = tokenizer("Hello <|im_end|> world é", add_special_tokens=False)["input_ids"]
    for given in (noop, None):
        detok = IncrementalDetokenizer(tokenizer, noop_ids=given)
        text = "".join(detok.push([i]) for i in ids) + detok.finish()
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def decode(self, ids, **kwargs):
            calls.append(ids)
            return tokenizer.decode(ids, **kwargs)

    IncrementalDetokenizer(Counting(), noop_ids=noop)
    assert calls == []  # given: no decode at construction
    IncrementalDetokenizer(Counting())
    assert len(calls) >= len(noop)
