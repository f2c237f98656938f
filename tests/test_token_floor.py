"""cog_triton.streaming.token_floor: the fewest tokens a text can become, with the default model's real tokenizer
and with tokenizers built here from huggingface/tokenizers' own parts (a sentencepiece-style BPE with
byte fallback; normalizers and pre-tokenizers that keep or drop characters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import InputError
from cog_triton.streaming.token_floor import TokenFloor

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"


@pytest.fixture(scope="module")
def smollm2(hf_tokenizer) -> Any:
    return hf_tokenizer


@pytest.fixture(scope="module")
def smollm2_floor(smollm2) -> TokenFloor:
    return TokenFloor.of(smollm2)


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_default_models_floor_is_its_longest_vocabulary_entry(smollm2) -> None:
    floor = TokenFloor.of(smollm2)
    spec = json.loads(smollm2.backend_tokenizer.to_str())
    assert floor.max_token_chars == max(len(entry) for entry in spec["model"]["vocab"]) and floor.shrink == 1.0
    assert floor.reason == ""
    assert floor.at_least("word " * 199_999) == -(-999_995 // floor.max_token_chars)


def test_the_floor_is_reached_by_the_longest_entry_repeated(smollm2) -> None:
    """The bound is tight: a text made of the longest entry's own text is that many tokens."""
    floor = TokenFloor.of(smollm2)
    spec = json.loads(smollm2.backend_tokenizer.to_str())
    longest = max(spec["model"]["vocab"], key=len)
    text = smollm2.convert_tokens_to_string([longest]) * 5
    assert len(text) == 5 * floor.max_token_chars  # byte-level: one vocabulary character per byte (ASCII here)
    assert floor.at_least(text) == 5 <= _count(smollm2, text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from([" ", "-", "=", "\n", "a", "the", "é", "中", "🙂", "<|im_start|>", "\t", "0", " " * 40,
                                 "-" * 81]), max_size=200).map("".join))
def test_the_floor_never_exceeds_the_real_count(smollm2, smollm2_floor, text: str) -> None:
    assert smollm2_floor.at_least(text) <= _count(smollm2, text)


def _sentencepiece_style(normalizer: Any = None, pre_tokenizer: Any = None) -> Any:
    """A small BPE with byte fallback and a Metaspace pre-tokenizer (the shape of Llama 2's tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for piece in ("▁", "a", "b", "▁a", "▁ab", "▁aba", "ab", "ba"):
        vocab[piece] = len(vocab)
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("b", "a"), ("▁ab", "a")]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.Metaspace()
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([" ", "a", "b", "ab", "é", "\u1100\u1161\u11a8", "e\u0301", "z"]), max_size=80).map("".join))
def test_a_byte_fallback_tokenizer_with_composition_keeps_the_floor(text: str) -> None:
    from tokenizers import normalizers

    tok = _sentencepiece_style(normalizers.NFKC())
    floor = TokenFloor.of_spec(json.loads(tok.to_str()))
    assert floor.shrink == 3.0 and floor.max_token_chars == 4  # "▁aba"
    assert floor.at_least(text) <= len(tok.encode(text).ids)


def test_hangul_composition_is_the_shrink_the_floor_allows() -> None:
    """Three jamo compose to one syllable: the floor must allow a text three times shorter."""
    from tokenizers import normalizers

    tok = _sentencepiece_style(normalizers.NFC())
    text = "\u1100\u1161\u11a8" * 12  # 36 characters, 12 syllables after NFC
    floor = TokenFloor.of_spec(json.loads(tok.to_str()))
    assert floor.at_least(text) == 3 <= len(tok.encode(text).ids)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, "its model is 'WordPiece', not BPE"),
        ({"model": {"type": "BPE", "vocab": {"a": 0}, "fuse_unk": True, "byte_fallback": False},
          "pre_tokenizer": {"type": "Metaspace"}}, "it fuses runs of unknown characters into one token"),
        ({"pre_tokenizer": {"type": "Whitespace"}}, "its pre-tokenizer 'Whitespace' may drop characters"),
        ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "behavior": "Removed"}, {"type": "ByteLevel"}]}}, "its pre-tokenizer 'Split' may drop"),
        ({"pre_tokenizer": {"type": "Punctuation", "behavior": "Removed"}}, "its pre-tokenizer 'Punctuation' may drop"),
        ({"normalizer": {"type": "StripAccents"}}, "its normalizer 'StripAccents' may remove characters"),
        ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Strip"}]}}, "its normalizer 'Strip' may remove"),
        ({"normalizer": {"type": "Replace", "pattern": {"Regex": "a+"}, "content": "a"}}, "replaces a pattern or deletes"),
        ({"normalizer": {"type": "Replace", "pattern": {"String": "a"}, "content": ""}}, "replaces a pattern or deletes"),
        ({"model": {"type": "BPE", "vocab": {}}}, "its vocabulary is empty"),
    ],
)
def test_tokenizers_that_may_lose_characters_have_no_floor(change: dict, reason: str) -> None:
    spec = {"model": {"type": "BPE", "vocab": {"abc": 0}}, "pre_tokenizer": {"type": "ByteLevel"}, **change}
    floor = TokenFloor.of_spec(spec)
    assert floor.max_token_chars == 0 and reason in floor.reason
    assert floor.at_least("x" * 1_000_000) == 0


def test_fused_unknowns_are_harmless_with_byte_fallback_or_byte_level() -> None:
    for extra in ({"byte_fallback": True}, {}):
        pre = {"type": "Metaspace"} if extra else {"type": "ByteLevel"}
        spec = {"model": {"type": "BPE", "vocab": {"abcd": 0}, "fuse_unk": True, **extra}, "pre_tokenizer": pre}
        assert TokenFloor.of_spec(spec).max_token_chars == 4


def test_replacements_shrink_the_floor_by_their_ratio_and_added_tokens_count() -> None:
    spec = {"model": {"type": "BPE", "vocab": {"ab": 0, "<0x0A>": 1}}, "pre_tokenizer": {"type": "Metaspace"},
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": "  "}, "content": "▁"},
                {"type": "Lowercase"}, {"type": "NFD"}]},
            "added_tokens": [{"content": "<|long_special|>"}]}
    floor = TokenFloor.of_spec(spec)
    assert floor.max_token_chars == len("<|long_special|>") and floor.shrink == 2.0
    assert floor.at_least("x" * 64) == 2 and floor.at_least("x" * 65, "") == 3 and floor.at_least("x" * 32, "y" * 32) == 2


def test_a_slow_or_unreadable_tokenizer_has_no_floor() -> None:
    class Slow:
        pass

    class Broken:
        class backend_tokenizer:  # noqa: N801 - the attribute's name
            @staticmethod
            def to_str() -> str:
                return "{not json"

    assert TokenFloor.of(Slow()).reason == "not a fast tokenizer"
    assert TokenFloor.of(Broken()).max_token_chars == 0 and "could not be read" in TokenFloor.of(Broken()).reason


def test_the_generator_refuses_a_far_too_long_prompt_without_tokenizing_it(monkeypatch) -> None:
    """1,000,000 characters: refused from the floor, before the chat template or the tokenizer run; a prompt
    under the floor but over the limit is still refused with its exact count."""
    from cog_triton.streaming.generation import build_generator
    from cog_triton.stream_config import GeneratorConfig
    from cog_triton.ipc import PredictInputs
    from cog_triton.worker.inputs import validate_inputs
    from tensorrtllm_backend.engine import ModelLimits

    limits = ModelLimits(8, max_input_len=384, max_seq_len=768)
    generator = build_generator(GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=limits, grpc_address="127.0.0.1:9"))
    calls: list[str] = []
    real_encode = generator.prompts.encode
    monkeypatch.setattr(generator.prompts, "encode", lambda *a, **k: calls.append("encode") or real_encode(*a, **k))
    monkeypatch.setattr(generator.prompts, "encode_messages", lambda *a, **k: calls.append("messages"))
    for inputs, what, chars in [
        (validate_inputs(prompt="word " * 199_999, seed=1), "prompt", 999_995),
        (validate_inputs(prompt="hi", system_prompt="x" * 40_000, seed=1), "prompt", 40_002),
        (validate_inputs(messages=json.dumps([{"role": "user", "content": "y" * 40_000}]), seed=1),
         "conversation", 40_000),
    ]:
        with pytest.raises(InputError) as info:
            generator.prepare(inputs, "far")
        floor = -(-chars // generator.floor.max_token_chars)
        assert info.value.message == (
            f"the {what} is too long: its {chars} characters are at least {floor} tokens (no token of this model's "
            f"tokenizer stands for more than {generator.floor.max_token_chars} characters), and the model's maximum "
            f"input length is 384 tokens; shorten the {what}"
        )
    assert calls == []
    with pytest.raises(InputError) as info:  # 2,000 characters: under the floor of 385 tokens, over the limit
        generator.prepare(validate_inputs(prompt="word " * 400, seed=1), "exact")
    assert "the prompt is too long: it has 4" in info.value.message and calls == ["encode"]
