"""cog_triton.streaming.lora.peft_config: adapter_config.json read as data. Each hostile value the issue found (a
nested document, lora_alpha as text, an object or 400 digits, NaN, 1e308) and every other bad value of a field the
converter reads is a LoraAdapterError (code invalid_lora_adapter) naming the field; configs peft itself writes are
read as json would read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import LoraAdapterError
from cog_triton.streaming.lora.convert import check_config
from cog_triton.streaming.lora.peft_config import (
    CONFIG_MAX_BYTES,
    CONFIG_MAX_DEPTH,
    CONFIG_MAX_INT_DIGITS,
    check_values,
    parse_config,
)
from tests.lora_adapters import make_adapter

BASE = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}


def _with(**fields) -> bytes:
    return json.dumps({**BASE, **fields}).encode()


def _raw(field: str, text: str) -> bytes:
    """BASE with ``field`` set to the raw JSON ``text`` (for values json.dumps would not write)."""
    return json.dumps({k: v for k, v in BASE.items() if k != field})[:-1].encode() + f', "{field}": {text}}}'.encode()


def _refused(data: bytes) -> str:
    with pytest.raises(LoraAdapterError) as info:
        parse_config(data, "hf://me/a")
    assert info.value.code == "invalid_lora_adapter"
    assert info.value.message.startswith("lora_weights hf://me/a: adapter_config.json ")
    return info.value.message


@pytest.mark.parametrize("data,fragment", [
    # the cases
    (b"[" * 100_000 + b"]" * 100_000, f"nests deeper than the {CONFIG_MAX_DEPTH} levels allowed"),
    (_with(lora_alpha={"a": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}), f"nests deeper than the {CONFIG_MAX_DEPTH}"),
    (_with(lora_alpha="16"), "lora_alpha must be a finite number above 0 and at most 65536, got '16'"),
    (_with(lora_alpha={"v": 16}), "lora_alpha must be a finite number above 0 and at most 65536, got {'v': 16}"),
    (_raw("lora_alpha", "9" * 400), f"holds an integer of 400 digits; at most {CONFIG_MAX_INT_DIGITS} are allowed"),
    (_raw("lora_alpha", "NaN"), "holds NaN, which is not a JSON number; numbers must be finite"),
    (_raw("lora_alpha", "-Infinity"), "holds -Infinity, which is not a JSON number"),
    (_raw("lora_alpha", "1e999"), "holds the number '1e999', beyond the range of a 64-bit float"),
    (_with(lora_alpha=1e308), "lora_alpha must be a finite number above 0 and at most 65536, got 1e+308"),
    # every other bad value of a field that is read
    (_with(lora_alpha=0), "lora_alpha must be a finite number above 0"),
    (_with(lora_alpha=-8), "got -8"),
    (_with(lora_alpha=True), "lora_alpha must be a finite number above 0 and at most 65536, got True"),
    (_with(r=0), "r must be an integer above 0 and at most 65536, got 0"),
    (_with(r=8.5), "r must be an integer above 0 and at most 65536, got 8.5"),
    (_with(r="8"), "r must be an integer above 0 and at most 65536, got '8'"),
    (_with(use_rslora="false"), "use_rslora must be true or false, got 'false'"),
    (_with(use_dora=1), "use_dora must be true or false, got 1"),
    (_with(fan_in_fan_out=[]), "fan_in_fan_out must be true or false, got []"),
    (_with(bias="everything"), "bias must be one of 'none', 'all', 'lora_only', got 'everything'"),
    (_with(modules_to_save="lm_head"), "modules_to_save must be a list or null, got 'lm_head'"),
    (_with(alpha_pattern=[1]), "alpha_pattern must be an object or null, got [1]"),
    (_with(auto_mapping="Llama"), "auto_mapping must be an object or null, got 'Llama'"),
    (_with(auto_mapping={"base_model_class": 3}), "auto_mapping.base_model_class must be a string, got 3"),
    (_with(peft_type=["LORA"]), "peft_type must be a string, got ['LORA']"),
    (_with(base_model_name_or_path={"x": 1}), "base_model_name_or_path must be a string"),
    # the document itself
    (b"{not json", "is not valid JSON"),
    (b"\xff\xfe\x00garbage", "is not valid JSON"),
    (b"[1, 2]", "must hold a JSON object, not list"),
    (b"{}" + b" " * CONFIG_MAX_BYTES, f"has {CONFIG_MAX_BYTES + 2} bytes; at most {CONFIG_MAX_BYTES} are allowed"),
], ids=lambda v: v[:40].decode("latin-1") if isinstance(v, bytes) else v[:40])
def test_a_bad_value_is_an_adapter_error_naming_the_field(data: bytes, fragment: str) -> None:
    message = _refused(data)
    assert fragment in message, message


def test_values_in_messages_are_cut_short() -> None:
    message = _refused(_with(lora_alpha="x" * 10_000))
    assert "'xxxx" in message and len(message) < 300


def test_the_depth_limit_is_a_limit_and_not_less() -> None:
    nested: object = 1
    for _ in range(CONFIG_MAX_DEPTH - 1):  # the document is level 1: this one is CONFIG_MAX_DEPTH deep
        nested = [nested]
    assert parse_config(_with(extra=nested), "x")["extra"] == nested
    _refused(_with(extra=[nested]))


@pytest.mark.parametrize("fields", [
    {}, {"lora_alpha": 128.0}, {"lora_alpha": None, "r": None}, {"bias": None, "use_rslora": True},
    {"modules_to_save": None, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {}},
    {"layer_replication": None, "alora_invocation_tokens": None, "auto_mapping": None},
    {"lora_alpha": 65536, "r": 65536},
])
def test_good_values_pass_as_parsed(fields: dict) -> None:
    data = _with(**fields)
    assert parse_config(data, "x") == json.loads(data)


def test_configs_peft_writes_are_read_as_json_reads_them(tmp_path: Path, checkpoint_dir: Path) -> None:
    folder = make_adapter(checkpoint_dir, tmp_path / "a", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=1,
                          rank_pattern={"v_proj": 2})
    data = (folder / "adapter_config.json").read_bytes()
    config = parse_config(data, "x")
    assert config == json.loads(data) and config["peft_type"] == "LORA"
    check_config(config, "x")


@pytest.mark.parametrize("fields,fragment", [
    ({"layer_replication": [[0, 4], [2, 6]]}, "layer_replication repeats layers of the base model"),
    ({"alora_invocation_tokens": [1, 2]}, "alora_invocation_tokens makes it an activated LoRA"),
])
def test_settings_that_would_be_served_wrong_are_refused(fields: dict, fragment: str) -> None:
    """PEFT's layer_replication and activated LoRA change what an adapter means; TensorRT-LLM's load_from_hf reads
    neither (lora_manager.py @ 007e181b), so serving them would apply the adapter where it was not trained for."""
    with pytest.raises(LoraAdapterError) as info:
        check_config({**BASE, **fields}, "x")
    assert "this adapter cannot be served" in info.value.message and fragment in info.value.message


def test_check_values_also_guards_a_dict_given_directly() -> None:
    deep: object = 0
    for _ in range(100):
        deep = {"k": deep}
    with pytest.raises(LoraAdapterError, match="nests deeper"):
        check_values({**BASE, "x": deep}, "x")
    with pytest.raises(LoraAdapterError, match="lora_alpha must be a finite number"):
        check_values({**BASE, "lora_alpha": float("nan")}, "x")
