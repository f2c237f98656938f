"""Tests of cog_triton.streaming.stop: StopSequenceMatcher and parse_stop_sequences."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from cog_triton.streaming.detokenizer import IncrementalDetokenizer  # noqa: E402
from common.errors import InputError  # noqa: E402
from cog_triton.streaming.stop import StopSequenceMatcher
from cog_triton.worker.stop_sequences import MAX_STOP_SEQUENCE_LENGTH, MAX_STOP_SEQUENCES, parse_stop_sequences

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"


@pytest.fixture(scope="session")
def tokenizer():
    if not (CHECKPOINT / "tokenizer.json").is_file():
        pytest.fail(f"tokenizer not available at {CHECKPOINT}: run scripts/setup", pytrace=False)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(CHECKPOINT))


def run(stops, chunks):
    """Push every chunk; return (pushed outputs, finish output, stopped flags, matcher)."""
    m = StopSequenceMatcher(stops)
    outs, flags = [], []
    for chunk in chunks:
        out, stopped = m.push(chunk)
        outs.append(out)
        flags.append(stopped)
    return outs, m.finish(), flags, m


def expected_cut(text, stops):
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


# --- StopSequenceMatcher -------------------------------------------------------------------------


def test_stop_within_one_chunk():
    outs, final, flags, m = run(["<end>"], ["Hello<end>world"])
    assert outs == ["Hello"] and flags == [True] and final == ""
    assert m.stopped


def test_stop_split_char_by_char():
    text = "Hello there\nUser: what now?"
    outs, final, flags, m = run(["User:"], list(text))
    assert "".join(outs) + final == "Hello there\n"
    stop_at = text.index("User:") + len("User:") - 1
    assert flags == [False] * stop_at + [True] * (len(text) - stop_at)
    # Characters that may start "User:" were held back, the rest went out at once.
    assert outs[: text.index("U")] == list("Hello there\n")
    assert all(o == "" for o in outs[text.index("U") :])


def test_partial_match_released_when_it_turns_out_not_to_be_a_stop():
    m = StopSequenceMatcher(["User:"])
    assert m.push("Hello Us") == ("Hello ", False)  # "Us" is held back
    assert m.push("e") == ("", False)
    assert m.push("ful") == ("Useful", False)
    assert m.push(" U") == (" ", False)
    assert m.finish() == "U"
    assert not m.stopped


def test_earliest_of_two_stop_sequences_wins():
    for chunks in (["a STOP b END c"], list("a STOP b END c"), ["a ST", "OP b E", "ND c"]):
        outs, final, flags, m = run(["END", "STOP"], chunks)
        assert "".join(outs) + final == "a "
        assert m.stopped
    outs, final, _, _ = run(["END", "STOP"], ["x END y STOP"])
    assert "".join(outs) + final == "x "


def test_overlapping_prefixes():
    for stops in (["ab", "abc"], ["abc", "ab"]):
        assert run(stops, ["xabc"])[0] == ["x"]
        outs, final, flags, _ = run(stops, ["xa", "b", "c"])
        assert outs == ["x", "", ""] and flags == [False, True, True] and final == ""
        outs, final, flags, _ = run(stops, ["xa", "c"])  # "a" held, then released
        assert outs == ["x", "ac"] and flags == [False, False]


def test_longer_stop_that_starts_earlier_wins_over_one_completed_first():
    # "bc" completes first, but "abcd" may still complete and it starts earlier: wait and see.
    outs, final, flags, m = run(["abcd", "bc"], ["x", "a", "b", "c", "d"])
    assert "".join(outs) + final == "x" and flags[-1] and m.stopped
    outs, final, flags, m = run(["abcd", "bc"], ["x", "a", "b", "c", "e"])
    assert "".join(outs) + final == "xa" and flags == [False, False, False, False, True]
    # The stream ends while still waiting: finish() cuts at the complete one.
    outs, final, flags, m = run(["abcd", "bc"], ["xabc"])
    assert outs == ["x"] and flags == [False] and final == "a" and m.stopped


def test_stop_at_very_start():
    assert run(["<end>"], ["<end>and more"])[0] == [""]
    outs, final, flags, m = run(["<end>"], list("<end>and more"))
    assert "".join(outs) + final == "" and m.stopped


def test_no_stop_finish_releases_everything():
    outs, final, flags, m = run(["<end>"], ["Hello ", "world <en"])
    assert outs == ["Hello ", "world "] and final == "<en" and not any(flags)
    assert not m.stopped
    assert m.finish() == ""  # idempotent


def test_text_after_stop_is_ignored():
    m = StopSequenceMatcher(["STOP"])
    assert m.push("one STOP two") == ("one ", True)
    assert m.push("three") == ("", True)
    assert m.push("") == ("", True)
    assert m.finish() == ""


def test_empty_and_duplicate_stops():
    m = StopSequenceMatcher(["", "x", "x", ""])
    assert m.stop_sequences == ("x",)
    assert m.push("abxcd") == ("ab", True)
    m = StopSequenceMatcher([])
    assert m.push("anything <end>") == ("anything <end>", False)
    assert m.finish() == ""
    m = StopSequenceMatcher([""])
    assert m.push("abc") == ("abc", False)


def test_empty_pushes_and_errors():
    m = StopSequenceMatcher(["ab"])
    assert m.push("") == ("", False)
    assert m.push("a") == ("", False)
    assert m.push("") == ("", False)
    with pytest.raises(TypeError):
        m.push(b"b")
    assert m.finish() == "a"
    with pytest.raises(RuntimeError):
        m.push("x")
    with pytest.raises(TypeError):
        StopSequenceMatcher("ab")
    with pytest.raises(TypeError):
        StopSequenceMatcher(["ab", 3])


def test_unicode_stop_sequences():
    outs, final, _, m = run(["🛑", "终止"], list("go 🤖 go 终点 终止 never"))
    assert "".join(outs) + final == "go 🤖 go 终点 "


def test_randomized_emitted_text_is_text_cut_before_first_stop():
    rng = random.Random(4242)
    alphabet = "abc \n"
    for _ in range(3000):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.1:
            stops.append("")
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        chunks, pos = [], 0
        while pos < len(text):
            size = rng.choice([0, 1, 1, 2, 3, 7, 40])
            chunks.append(text[pos : pos + size])
            pos += size
        m = StopSequenceMatcher(stops)
        max_len = max(len(s) for s in stops)
        emitted = ""
        stopped = False
        pushed = 0
        for chunk in chunks:
            out, stopped_now = m.push(chunk)
            pushed += len(chunk)
            assert not (stopped and out)
            assert stopped_now or not stopped  # once stopped, always stopped
            stopped = stopped_now
            emitted += out
            if not stopped:  # only a possible stop start is held back: fewer than max_len characters
                assert pushed - len(emitted) < max_len
        emitted += m.finish()
        want, want_stopped = expected_cut(text, stops)
        assert emitted == want, (stops, chunks)
        assert m.stopped == want_stopped


def test_with_incremental_detokenizer_and_real_tokenizer(tokenizer):
    text = "Sure! Here is 🤖 the answer: 机器学习.\nUser: and now?\nAssistant:"
    ids = tokenizer.encode(text)
    for stops in (["User:"], ["\nUser", "Assistant:"], ["学习"]):
        det = IncrementalDetokenizer(tokenizer)
        m = StopSequenceMatcher(stops)
        emitted, stopped = "", False
        for token_id in ids:
            out, stopped = m.push(det.push([token_id]))
            emitted += out
            if stopped:
                break
        if not stopped:
            out, stopped = m.push(det.finish())
            emitted += out + m.finish()
        assert emitted == expected_cut(text, stops)[0]
        assert "\ufffd" not in emitted


# --- parse_stop_sequences ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ("", []),
        ("<end>", ["<end>"]),
        ("<end>,User:", ["<end>", "User:"]),
        ("a, b", ["a", " b"]),  # verbatim: spaces are part of the sequence
        ("a,,b,", ["a", "b"]),  # empty items dropped
        ("a,b,a", ["a", "b"]),  # duplicates dropped
        ("\n\nUser:", ["\n\nUser:"]),
        ("[INST],[/INST]", ["[INST]", "[/INST]"]),  # not JSON: "[" not followed by '"'
        ('["a,b", "c"]', ["a,b", "c"]),
        ('  [ "\\nUser:", "x" ] ', ["\nUser:", "x"]),
        ("[]", []),
        ('["", "a"]', ["a"]),
        (["a,b", "c", ""], ["a,b", "c"]),
        ([], []),
    ],
)
def test_parse_stop_sequences_valid(value, expected):
    assert parse_stop_sequences(value) == expected


def test_parse_stop_sequences_limits_are_inclusive():
    many = [f"s{i}" for i in range(MAX_STOP_SEQUENCES)]
    assert parse_stop_sequences(",".join(many)) == many
    assert parse_stop_sequences(json.dumps(many)) == many
    long = "x" * MAX_STOP_SEQUENCE_LENGTH
    assert parse_stop_sequences(long) == [long]
    # Duplicates do not count towards the limit.
    assert parse_stop_sequences(",".join(many + many)) == many


def _error(value) -> str:
    with pytest.raises(InputError) as info:
        parse_stop_sequences(value)
    message = str(info.value)
    assert message.startswith("[invalid_input] stop_sequences:")
    return message


def test_parse_too_many_sequences():
    value = ",".join(f"s{i}" for i in range(MAX_STOP_SEQUENCES + 1))
    message = _error(value)
    assert "17" in message and "at most 16" in message and "s0,s1" in message
    _error([f"s{i}" for i in range(17)])


def test_parse_sequence_too_long():
    value = "ok," + "y" * (MAX_STOP_SEQUENCE_LENGTH + 1)
    message = _error(value)
    assert "257 characters" in message and "at most 256" in message and "yyyy" in message
    assert len(message) < 400  # the value is shortened in the message


def test_parse_unparsable_json():
    message = _error('["a,b", "c"')
    assert "not valid JSON" in message and '["a,b", "c"' in message and "comma-separated" in message
    _error('["a" "b"]')


def test_parse_json_with_non_strings():
    message = _error('["a", 1]')
    assert "must be a string" in message and "1" in message
    _error('[ "a", null]')
    _error('["a", ["nested"]]')


def test_parse_wrong_types():
    message = _error(42)
    assert "int" in message and "42" in message
    _error(["a", 3])
    _error({"a": 1})


# The messages are what a caller reads: each names the input, the offending value and what is allowed.
# Compared whole (the mutation run of scripts/mutation showed that substring checks let wrong text through).
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            '["a,b", "c"',
            "stop_sequences: '[\"a,b\", \"c\"' starts like a JSON array but is not valid JSON (Expecting ',' "
            "delimiter at character 11); pass a JSON array of strings such as '[\"a,b\", \"User:\"]' or a "
            'comma-separated string such as "<end>,User:"',
        ),
        ('["a", 1]', "stop_sequences: '[\"a\", 1]' contains 1 (int); every stop sequence must be a string"),
        (["a", None], "stop_sequences: ['a', None] contains None (NoneType); every stop sequence must be a string"),
        (
            42,
            'stop_sequences: got 42 of type int; pass a comma-separated string such as "<end>,User:", '
            "a JSON array of strings, or nothing",
        ),
    ],
)
def test_parse_error_messages(value, message):
    assert _error(value) == "[invalid_input] " + message


def test_long_values_are_shortened_to_120_characters_in_messages():
    def shown(item: str) -> str:
        message = _error(item)
        return message[message.index("the stop sequence ") + len("the stop sequence ") : message.index(" is ")]

    long = "".join(chr(ord("a") + i % 26) for i in range(MAX_STOP_SEQUENCE_LENGTH + 1))
    assert shown(long) == repr(long)[:117] + "..."
    assert len(shown(long)) == 120


def test_show_keeps_a_repr_of_exactly_the_limit_whole():
    from cog_triton.worker.stop_sequences import _show

    assert _show("x" * 118) == repr("x" * 118)  # 120 characters: not shortened
    assert _show("x" * 119) == repr("x" * 119)[:117] + "..."  # 121: shortened to 120


def test_programming_errors_name_what_was_wrong():
    with pytest.raises(TypeError, match=r"^stop_sequences must be a sequence of strings, not a single string$"):
        StopSequenceMatcher("ab")
    with pytest.raises(TypeError, match=r"^stop sequences must be strings, got 3 \(int\)$"):
        StopSequenceMatcher(["ab", 3])
    m = StopSequenceMatcher(["ab"])
    with pytest.raises(TypeError, match=r"^text must be a str, got bytes$"):
        m.push(b"b")
    m.finish()
    with pytest.raises(RuntimeError, match=r"^StopSequenceMatcher\.push\(\) called after finish\(\)$"):
        m.push("x")
