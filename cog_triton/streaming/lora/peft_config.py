"""An adapter's ``adapter_config.json``, read as data from an API caller: bounded in size, nesting and numbers, and
every field the converter reads checked for its type and range before anything uses it.

What each field is, from PEFT's ``LoraConfig`` (``peft/tuners/lora/config.py``, peft 0.21.2, the dataclass its
``save_pretrained`` writes as adapter_config.json): ``peft_type`` a string ("LORA"), ``r`` an int, ``lora_alpha``
an int (floats such as 128.0 are common in files written by other tools: TensorRT-LLM's own example,
``tensorrt_llm/lora_manager.py`` ``LoraManager.load_from_hf``'s docstring @ 007e181b, has ``"lora_alpha": 128.0``),
``use_rslora``, ``use_dora``, ``fan_in_fan_out`` and ``lora_bias`` booleans, ``bias`` one of "none", "all",
"lora_only", ``modules_to_save`` a list of names or null, ``rank_pattern`` and ``alpha_pattern`` objects or null,
``layer_replication`` a list of [start, end) pairs or null, ``alora_invocation_tokens`` a list of token ids or null;
``base_model_name_or_path`` a string or null and ``auto_mapping`` an object or null (PEFT's ``PeftConfigMixin``).
TensorRT-LLM reads ``r``, ``lora_alpha`` (as ``float(...)``) and ``use_rslora`` (as ``bool(...)``) without checking
them (``load_from_hf`` @ 007e181b): a ``lora_alpha`` of NaN or 1e308 reaches the weights there. Here each bad value
is a :class:`~common.errors.LoraAdapterError` naming the field, the value (cut short) and what is allowed.

Parsing bounds (:func:`parse_config`): at most :data:`CONFIG_MAX_BYTES`, nested at most :data:`CONFIG_MAX_DEPTH`
deep (Python's json decoder recurses once per level, so a deeper document would otherwise end in RecursionError),
no NaN or Infinity (Python's json accepts them, the JSON standard does not), no number beyond float's range (a
float that parses to infinity) and no integer of more than :data:`CONFIG_MAX_INT_DIGITS` digits.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from common.errors import LoraAdapterError

#: Most bytes of adapter_config.json. PEFT writes about 1 KB; a rank_pattern naming every module of an 80-layer model
#: takes about 30 KB.
CONFIG_MAX_BYTES = 256 << 10
#: Most levels of nesting (the document is level 1). PEFT's deepest field, layer_replication, is 3 levels deep.
CONFIG_MAX_DEPTH = 16
#: Most digits of an integer in it.
CONFIG_MAX_INT_DIGITS = 20
#: ``r`` and ``lora_alpha`` at most this: PEFT's defaults are 8, common adapters use up to a few hundred (alpha is
#: often 2 x r); above it a value is taken for a mistake (the weights' scale is lora_alpha / r).
CONFIG_MAX_RANK = 1 << 16
CONFIG_MAX_ALPHA = float(1 << 16)
#: Values in messages are cut to this many characters.
SHOWN_CHARS = 80

_BOOLEANS = ("use_rslora", "use_dora", "fan_in_fan_out", "lora_bias", "inference_mode")
_BIASES = ("none", "all", "lora_only")
_LISTS = ("modules_to_save", "layer_replication", "alora_invocation_tokens")
_OBJECTS = ("rank_pattern", "alpha_pattern", "auto_mapping")
_STRINGS = ("peft_type", "base_model_name_or_path")


class _Refused(ValueError):
    """A value the decoder met that the document may not hold (raised from json's hooks)."""


def shown(value: Any) -> str:
    """``value`` for a message: its repr, cut to :data:`SHOWN_CHARS` characters (only call it on a document whose
    depth was checked)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def cut(text: str) -> str:
    """``text`` for a message, cut to :data:`SHOWN_CHARS` characters (no quotes)."""
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def _fail(display: str, what: str) -> LoraAdapterError:
    return LoraAdapterError(f"lora_weights {display}: adapter_config.json {what}")


def _constant(name: str) -> Any:
    raise _Refused(f"holds {name}, which is not a JSON number; numbers must be finite")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"holds the number {shown(text)}, beyond the range of a 64-bit float; numbers must be finite")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > CONFIG_MAX_INT_DIGITS:
        raise _Refused(f"holds an integer of {len(text.lstrip('-'))} digits; at most {CONFIG_MAX_INT_DIGITS} are "
                       "allowed")
    return int(text)


def _depth(document: Any) -> int:
    """How many levels deep ``document`` nests (a scalar is 0, ``{}`` 1), without recursion."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, level)
        if level <= CONFIG_MAX_DEPTH:
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse_config(data: bytes, display: str) -> dict[str, Any]:
    """adapter_config.json's bytes as a checked dict (the module docstring's bounds, then :func:`check_values`).

    Raises:
        LoraAdapterError: too large, not UTF-8 JSON, not an object, nested too deep, a number it may not hold, or a
            field of the wrong type or out of range; each names what is wrong and what is allowed.
    """
    if len(data) > CONFIG_MAX_BYTES:
        raise _fail(display, f"has {len(data)} bytes; at most {CONFIG_MAX_BYTES} are allowed")
    try:
        config = json.loads(data, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _Refused as exc:
        raise _fail(display, str(exc)) from None
    except RecursionError:
        raise _fail(display, f"nests deeper than the {CONFIG_MAX_DEPTH} levels allowed") from None
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError of bytes that are not UTF-8
        raise _fail(display, f"is not valid JSON ({shown(str(exc))})") from None
    if not isinstance(config, dict):
        raise _fail(display, f"must hold a JSON object, not {type(config).__name__}")
    check_values(config, display)
    return config


def _number(config: dict[str, Any], name: str, display: str, *, integer: bool, low: float, high: float) -> None:
    value = config.get(name)
    if value is None:
        return
    is_number = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not is_number or not math.isfinite(value) or not low < value <= high:
        kind = "an integer" if integer else "a finite number"
        raise _fail(display, f"{name} must be {kind} above {low:g} and at most {high:g}, got {shown(value)}")


def check_values(config: dict[str, Any], display: str) -> None:
    """Check the fields the converter reads (the module docstring) and the document's depth, in ``config`` as parsed.
    Absent fields and nulls are left to their defaults.

    Raises:
        LoraAdapterError: naming the first field of the wrong type or out of range, its value and what is allowed.
    """
    deepest = _depth(config)
    if deepest > CONFIG_MAX_DEPTH:
        raise _fail(display, f"nests deeper than the {CONFIG_MAX_DEPTH} levels allowed")
    for name in _STRINGS:
        if config.get(name) is not None and not isinstance(config[name], str):
            raise _fail(display, f"{name} must be a string, got {shown(config[name])}")
    _number(config, "r", display, integer=True, low=0, high=CONFIG_MAX_RANK)
    _number(config, "lora_alpha", display, integer=False, low=0, high=CONFIG_MAX_ALPHA)
    for name in _BOOLEANS:
        if config.get(name) is not None and not isinstance(config[name], bool):
            raise _fail(display, f"{name} must be true or false, got {shown(config[name])}")
    bias: Optional[Any] = config.get("bias")
    if bias is not None and bias not in _BIASES:
        raise _fail(display, f"bias must be one of {', '.join(map(repr, _BIASES))}, got {shown(bias)}")
    for name in _LISTS:
        if config.get(name) is not None and not isinstance(config[name], list):
            raise _fail(display, f"{name} must be a list or null, got {shown(config[name])}")
    for name in _OBJECTS:
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise _fail(display, f"{name} must be an object or null, got {shown(config[name])}")
    made_for = (config.get("auto_mapping") or {}).get("base_model_class")
    if made_for is not None and not isinstance(made_for, str):
        raise _fail(display, f"auto_mapping.base_model_class must be a string, got {shown(made_for)}")


__all__ = ("CONFIG_MAX_ALPHA", "CONFIG_MAX_BYTES", "CONFIG_MAX_DEPTH", "CONFIG_MAX_INT_DIGITS", "CONFIG_MAX_RANK",
           "check_values", "cut", "parse_config", "shown")
