"""cog_triton.streaming.lora.convert: PEFT LoRA adapters -> TensorRT-LLM's lora_weights / lora_config, and its refusals.

* Golden: an adapter with the shapes of a Llama-3-8B rank-16 LoRA on all seven projections (layers 0
  and 31; values from a fixed formula, not an RNG) converts to the rows, widths and values recorded in
  tests/golden/lora/llama-3-8b-r16.json (regenerate with UPDATE_GOLDEN=1 and review the diff).
* Rules (examples/hf_lora_convert.py, lora_manager.py LoraManager.load_from_hf): each row, unpacked as
  A [r, in] then B [out, r], gives back peft's own delta (``get_delta_weight``: B @ A x scale) for the
  bundled model's adapters, with lora_alpha / r, rsLoRA's / sqrt(r) and rank_pattern's per-module r.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save

from common.errors import LoraAdapterError
from cog_triton.streaming.lora.convert import check_config, convert
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.lora import (
    LORA_MODULE_IDS,
    SUPPORTED_MODULES,
    TRTLLM_TO_HF,
    LoraSpec,
    ModelShape,
    checkpoint_lora_spec,
    engine_lora_spec,
)
from tests.lora_adapters import adapter_config, make_adapter

GOLDEN = REPO_ROOT / "tests" / "golden" / "lora" / "llama-3-8b-r16.json"
LLAMA3_8B = ModelShape(num_layers=32, hidden_size=4096, mlp_hidden_size=14336, num_heads=32, num_kv_heads=8,
                       head_size=128)
BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
         "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
#: Module id -> Hugging Face name, written out from lora_manager.py's LORA_MODULE_IDS and lora_helper.py's
#: get_default_trtllm_modules_to_hf_modules (not taken from tensorrtllm_backend.lora, which is under test).
UPSTREAM_HF_NAMES = {1: "q_proj", 2: "k_proj", 3: "v_proj", 4: "o_proj", 5: "gate_proj", 6: "down_proj", 7: "up_proj"}
CONFIG = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "bias": "none", "use_rslora": False}


def spec(shape: ModelShape = LLAMA3_8B, dtype: str = "bfloat16", max_rank: int = 64, modules=SUPPORTED_MODULES):
    return LoraSpec(True, dtype=dtype, max_rank=max_rank, target_modules=tuple(modules), shape=shape,
                    architecture="LlamaForCausalLM", base_model="meta-llama/Meta-Llama-3-8B-Instruct")


def pattern_tensor(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Deterministic values in [0.25, 1.25], never 0 (no RNG: the golden file must not depend on torch's)."""
    i = torch.arange(rows, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(cols, dtype=torch.float64).unsqueeze(0)
    return (torch.sin(i * 0.37 + j * 0.011 + seed) * 0.5 + 0.75).to(torch.float32)


@pytest.fixture(autouse=True)
def _files_here(tmp_path: Path) -> None:
    """Adapter files of a test go into its own temporary folder (:func:`adapter_file`)."""
    _FOLDER[:] = [tmp_path]


_FOLDER: list[Path] = []


def adapter_file(data: bytes) -> Path:
    """``data`` as an adapter_model.safetensors file of this test (convert reads a file, never bytes)."""
    path = _FOLDER[0] / f"adapter-{len(list(_FOLDER[0].iterdir()))}.safetensors"
    path.write_bytes(data)
    return path


def llama_shaped_adapter(layers=(0, 31), r: int = 16) -> Path:
    tensors = {}
    for layer in layers:
        for seed, hf in enumerate(BLOCK):
            in_dim, out_dim = LLAMA3_8B.module_dims({v: k for k, v in TRTLLM_TO_HF.items()}[hf])
            prefix = f"base_model.model.model.layers.{layer}.{BLOCK[hf]}.{hf}"
            tensors[f"{prefix}.lora_A.weight"] = pattern_tensor(r, in_dim, seed + layer)
            tensors[f"{prefix}.lora_B.weight"] = pattern_tensor(out_dim, r, 100 + seed + layer)
    return adapter_file(save(tensors))


def rows_of(tensors) -> list[tuple[int, int, int]]:
    flat = struct.unpack(f"<{3 * tensors.rows}i", tensors.config)
    return [tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)]


def values_of(tensors) -> np.ndarray:
    raw = np.frombuffer(tensors.weights, dtype=np.uint16 if tensors.datatype in ("BF16", "FP16") else np.float32)
    if tensors.datatype == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    elif tensors.datatype == "FP16":
        raw = raw.view(np.float16).astype(np.float32)
    return raw.reshape(tensors.rows, tensors.width)


def test_a_llama_3_8b_shaped_adapter_converts_to_the_golden_rows():
    converted = convert(CONFIG, llama_shaped_adapter(), spec(), "golden")
    tensors = converted.tensors
    values = values_of(tensors)
    actual = {
        "datatype": tensors.datatype,
        "rows": [list(r) for r in rows_of(tensors)],
        "width": tensors.width,
        "row_checks": [
            {"abs_sum": round(float(np.abs(row).sum()), 2), "first": round(float(row[0]), 4),
             "last_nonzero": round(float(row[np.nonzero(row)[0][-1]]), 4), "nonzero": int(np.count_nonzero(row))}
            for row in values
        ],
        "rank": converted.rank, "scale": converted.scale, "layers": converted.layers,
    }
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in actual.items() if key != "row_checks"]
        lines.append(' "row_checks": [\n' + ",\n".join(f"  {json.dumps(c)}" for c in actual["row_checks"]) + "\n ]")
        GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    assert actual == json.loads(GOLDEN.read_text())


def test_the_golden_follows_upstreams_layout():
    """What the golden file must say, from the rules: rows sorted by layer then module id, [id, layer, r];
    width = the widest module's r x (in + out) (mlp: 16 x (4096 + 14336)); each row's values are r x (in + out)."""
    golden = json.loads(GOLDEN.read_text())
    ids = sorted(LORA_MODULE_IDS[m] for m in SUPPORTED_MODULES)
    assert golden["rows"] == [[i, layer, 16] for layer in (0, 31) for i in ids]
    assert golden["width"] == 16 * (4096 + 14336) and golden["datatype"] == "BF16"
    names = {v: k for k, v in LORA_MODULE_IDS.items()}
    for (module_id, _, r), check in zip(golden["rows"], golden["row_checks"]):
        assert check["nonzero"] == r * sum(LLAMA3_8B.module_dims(names[module_id]))
    assert golden["scale"] == 2.0 and golden["rank"] == 16 and golden["layers"] == 2


def test_scale_is_folded_into_b_and_a_is_kept():
    converted = convert(CONFIG, llama_shaped_adapter(layers=(3,)), spec(dtype="float32"), "x")
    values = values_of(converted.tensors)
    a = pattern_tensor(16, 4096, 0 + 3).numpy()
    b = pattern_tensor(4096, 16, 100 + 3).numpy()  # attn_q: [16, 4096] and [4096, 16]
    row = values[0]  # attn_q of layer 3
    assert np.array_equal(row[: 16 * 4096], a.reshape(-1))
    assert np.allclose(row[16 * 4096: 16 * 4096 + 4096 * 16], (b * 2.0).reshape(-1))
    assert not row[16 * 4096 * 2:].any()  # zero padding up to the widest row


@pytest.mark.parametrize("dtype,datatype,itemsize", [("float16", "FP16", 2), ("bfloat16", "BF16", 2),
                                                     ("float32", "FP32", 4)])
def test_weights_have_the_models_dtype(dtype, datatype, itemsize):
    tensors = convert(CONFIG, llama_shaped_adapter(layers=(0,)), spec(dtype=dtype), "x").tensors
    assert tensors.datatype == datatype
    assert len(tensors.weights) == tensors.rows * tensors.width * itemsize
    assert len(tensors.config) == tensors.rows * 3 * 4


@pytest.fixture(scope="module")
def smollm(checkpoint_dir: Path):
    config = json.loads((checkpoint_dir / "config.json").read_text())
    return checkpoint_lora_spec(config, {"max_lora_rank": 16}, True)


@pytest.mark.parametrize("kwargs", [
    dict(r=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"]),
    dict(r=8, alpha=8, targets=["k_proj", "o_proj", "gate_proj", "up_proj"]),
    dict(r=8, alpha=16, targets=["q_proj", "gate_proj"], rank_pattern={"gate_proj": 2}),
], ids=["plain", "alpha-equals-r", "rank-pattern"])
def test_each_row_gives_back_peft_delta(tmp_path, checkpoint_dir, smollm, kwargs):
    """Unpacked as A [r, in] and B [out, r], each row is peft's own delta B @ A x scale of that layer and module."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder = make_adapter(checkpoint_dir, tmp_path / "a", seed=3, **kwargs)
    converted = convert(adapter_config(folder), folder / "adapter_model.safetensors", smollm, "a")
    values = values_of(converted.tensors)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(checkpoint_dir)), str(folder))
    names = {v: k for k, v in LORA_MODULE_IDS.items()}
    layers = model.base_model.model.model.layers
    for (module_id, layer, r), row in zip(rows_of(converted.tensors), values):
        module = names[module_id]
        hf = UPSTREAM_HF_NAMES[module_id]
        in_dim, out_dim = smollm.shape.module_dims(module)
        a = row[: r * in_dim].reshape(r, in_dim)
        b = row[r * in_dim: r * in_dim + out_dim * r].reshape(out_dim, r)
        target = getattr(getattr(layers[layer], BLOCK[hf]), hf)
        expected = target.get_delta_weight("default").detach().numpy()
        assert np.allclose(b @ a, expected, atol=1e-5), (layer, hf)
    assert converted.rank == kwargs["r"]


def test_rslora_scales_by_the_square_root_of_the_rank():
    config = {**CONFIG, "use_rslora": True}
    converted = convert(config, llama_shaped_adapter(layers=(0,)), spec(dtype="float32"), "x")
    assert math.isclose(converted.scale, 32 / math.sqrt(16))


def _adapter_bytes(tensors: dict) -> Path:
    return adapter_file(save({k: v.contiguous() for k, v in tensors.items()}))


def _small(shape=ModelShape(4, 8, 16, 2, 1, 4), **kw):
    return spec(shape=shape, dtype="float32", **kw)


def _ab(layer: int, hf: str, r: int, in_dim: int, out_dim: int) -> dict:
    prefix = f"base_model.model.model.layers.{layer}.{BLOCK.get(hf, 'self_attn')}.{hf}"
    return {f"{prefix}.lora_A.weight": torch.ones(r, in_dim), f"{prefix}.lora_B.weight": torch.ones(out_dim, r)}


REFUSALS = [
    ({"peft_type": "PREFIX_TUNING"}, _ab(0, "q_proj", 2, 8, 8), {}, "peft_type 'PREFIX_TUNING'"),
    ({"use_dora": True}, _ab(0, "q_proj", 2, 8, 8), {}, "use_dora is true"),
    ({"modules_to_save": ["lm_head"]}, _ab(0, "q_proj", 2, 8, 8), {}, "modules_to_save=['lm_head']"),
    ({"bias": "lora_only"}, _ab(0, "q_proj", 2, 8, 8), {}, "trains biases"),
    ({"fan_in_fan_out": True}, _ab(0, "q_proj", 2, 8, 8), {}, "fan_in_fan_out"),
    ({}, {"base_model.model.lm_head.weight": torch.ones(2, 2)}, {}, "lm_head"),
    ({}, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 8)}, {},
     "without its partner"),
    ({}, _ab(0, "c_attn", 2, 8, 24), {}, "'c_attn', which this image cannot serve"),
    ({}, _ab(4, "q_proj", 2, 8, 8), {}, "layer 4, but the LlamaForCausalLM"),
    ({}, _ab(0, "q_proj", 2, 16, 16), {}, "maps 16 -> 16 values, but this LlamaForCausalLM"),
    ({}, _ab(0, "q_proj", 9, 8, 8), {"max_rank": 8},
     "rank r=9 (layer 0 q_proj) is above the engine's max_lora_rank of 8"),
    ({}, _ab(0, "up_proj", 2, 8, 16), {"modules": ["attn_q"]},
     "it adapts up_proj (mlp_gate), but the engine applies LoRA to q_proj (attn_q) only (its lora_target_modules)"),
    ({}, {}, {}, "holds no LoRA weights"),
    ({"auto_mapping": {"base_model_class": "MistralForCausalLM"}}, _ab(0, "q_proj", 2, 8, 8), {},
     "it was made for a MistralForCausalLM (adapter_config.json auto_mapping.base_model_class), but this model is a "
     "LlamaForCausalLM"),
]


@pytest.mark.parametrize("config,tensors,limits,fragment", REFUSALS, ids=[r[3][:30] for r in REFUSALS])
def test_refusals_name_the_value_and_the_limit(config, tensors, limits, fragment):
    with pytest.raises(LoraAdapterError) as info:
        convert({"peft_type": "LORA", "lora_alpha": 4, **config}, _adapter_bytes(tensors), _small(**limits), "ad.tar")
    assert fragment in info.value.message, info.value.message
    assert info.value.message.startswith("lora_weights ad.tar:")


def _fused(modules, fused: bool = True):
    import dataclasses

    return dataclasses.replace(_small(modules=modules), fused_mlp=fused, paged_cache=fused)


def test_an_adapter_module_the_fused_engine_does_not_apply_is_refused_naming_both():
    """An engine built with mlp_h_to_4h but not mlp_gate lists gate_proj among its LoRA modules, so the executor
    takes the rows (loraUtils.cpp), but its fused gated MLP adds no LoRA without both (tensorrt_llm/layers/mlp.py
    fc_gate_lora @ 04a2cacb): the adapter would be half applied. Refused, naming the modules and what it applies."""
    tensors = {**_ab(0, "q_proj", 2, 8, 8), **_ab(0, "gate_proj", 2, 8, 16)}
    with pytest.raises(LoraAdapterError) as info:
        convert({"peft_type": "LORA"}, _adapter_bytes(tensors), _fused(["attn_q", "mlp_h_to_4h"]), "ad.tar")
    message = info.value.message
    assert message.startswith("lora_weights ad.tar: it adapts gate_proj (mlp_h_to_4h), which the engine does not "
                              "apply: its lora_target_modules have mlp_h_to_4h (gate_proj) without mlp_gate (up_proj)")
    assert "The engine applies LoRA to q_proj (attn_q) only" in message
    assert "rebuild the engine with both mlp_h_to_4h and mlp_gate in lora.lora_target_modules" in message
    # the CPU reference model (transformers' MLP, not fused) applies gate_proj alone
    assert convert({"peft_type": "LORA"}, _adapter_bytes(tensors), _fused(["attn_q", "mlp_h_to_4h"], False),
                   "ad.tar").modules == ("attn_q", "mlp_h_to_4h")


def test_gate_and_up_adapters_are_served_by_an_engine_that_applies_both():
    """Both projections (the usual all-linear adapter), or one alone: the module an adapter leaves out gets rank 0,
    whose LoRA output the kernel zeroes (kernels/lora/lora.cpp LoraImpl::run @ 0f4dc1d0)."""
    spec = _fused(["attn_q", "mlp_h_to_4h", "mlp_gate"])
    both = {**_ab(0, "gate_proj", 2, 8, 16), **_ab(0, "up_proj", 2, 8, 16), **_ab(1, "gate_proj", 2, 8, 16),
            **_ab(1, "up_proj", 2, 8, 16)}
    converted = convert({"peft_type": "LORA"}, _adapter_bytes(both), spec, "x")
    assert converted.modules == ("mlp_h_to_4h", "mlp_gate")
    assert rows_of(converted.tensors) == [(5, 0, 2), (7, 0, 2), (5, 1, 2), (7, 1, 2)]
    gate_only = convert({"peft_type": "LORA"}, _adapter_bytes(_ab(0, "gate_proj", 2, 8, 16)), spec, "x")
    assert gate_only.modules == ("mlp_h_to_4h",)


def test_not_safetensors_and_a_model_without_lora_are_refused():
    with pytest.raises(LoraAdapterError, match="not a readable safetensors file"):
        convert({"peft_type": "LORA"}, adapter_file(b"\x00\x01pickle?\x00\x00"), _small(), "x")
    off = engine_lora_spec({"pretrained_config": {"dtype": "float16"}, "build_config": {"plugin_config": {}}})
    with pytest.raises(LoraAdapterError, match="built without the LoRA plugin"):
        convert({"peft_type": "LORA"}, _adapter_bytes(_ab(0, "q_proj", 2, 8, 8)), off, "x")
    check_config({"peft_type": "lora"}, "x")  # the type is matched without case, as peft writes "LORA"


def test_another_base_model_name_with_the_same_sizes_is_served_and_logged(caplog):
    config = {"peft_type": "LORA", "lora_alpha": 4, "base_model_name_or_path": "someone/llama-copy",
              "auto_mapping": {"base_model_class": "LlamaForCausalLM"}}
    with caplog.at_level("WARNING"):
        convert(config, _adapter_bytes(_ab(0, "q_proj", 2, 8, 8)), _small(), "x")
    assert "made from someone/llama-copy, this model from meta-llama/Meta-Llama-3-8B-Instruct" in caplog.text


# --- what reading an adapter may cost (issue 47): its size and header checked before any data is read -------------

def test_a_file_larger_than_the_largest_adapter_served_is_refused_before_it_is_opened():
    """Bytes that are not even safetensors, one byte over the largest adapter the model serves: refused by their
    size (never opened, so never called unreadable), naming the largest adapter and what could be wrong."""
    small = _small(max_rank=2)
    with pytest.raises(LoraAdapterError) as info:
        convert({"peft_type": "LORA"}, adapter_file(b"\xff" * (small.largest_adapter_file_bytes() + 1)), small, "x")
    message = info.value.message
    assert message.startswith(f"lora_weights x: adapter_model.safetensors has {small.largest_adapter_file_bytes() + 1}"
                              " bytes, more than the largest adapter this model serves (rank 2 on q_proj, k_proj, "
                              "v_proj, o_proj, gate_proj, up_proj, down_proj of 4 layers: ")
    assert "a larger rank than 2" in message


def test_a_header_longer_than_such_an_adapters_is_refused_before_it_is_parsed():
    data = save({**_ab(0, "q_proj", 2, 8, 8)}, metadata={"padding": "x" * 200_000})
    small = _small()
    with pytest.raises(LoraAdapterError) as info:
        convert({"peft_type": "LORA"}, adapter_file(data), small, "x")
    assert "more than the 94208 bytes an adapter of this model needs (at most 56 tensors)" in info.value.message
    (header,) = struct.unpack("<Q", data[:8])
    assert f"has a header of {header} bytes" in info.value.message


def test_a_header_length_beyond_the_file_is_unreadable():
    with pytest.raises(LoraAdapterError, match=r"not a readable safetensors file \(its first 8 bytes give a header "
                                               r"of 1000 bytes, longer than the file\)"):
        convert({"peft_type": "LORA"}, adapter_file(struct.pack("<Q", 1000) + b"{}"), _small(), "x")


def test_the_same_weight_twice_is_refused_naming_both_keys():
    """Two adapter names for one module (peft's ``lora_A.<name>.weight``) would otherwise overwrite each other."""
    tensors = {**_ab(0, "q_proj", 2, 8, 8),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_A.other.weight": torch.ones(2, 8)}
    with pytest.raises(LoraAdapterError) as info:
        convert({"peft_type": "LORA"}, _adapter_bytes(tensors), _small(), "x")
    assert "holds two lora_A weights for layer 0 q_proj (" in info.value.message
    assert "q_proj.lora_A.other.weight" in info.value.message


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool])
def test_weights_that_are_not_floats_are_refused(dtype):
    tensors = _ab(0, "q_proj", 2, 8, 8)
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    with pytest.raises(LoraAdapterError, match="layer 0 q_proj lora_A is stored as .*; LoRA weights are floats"):
        convert({"peft_type": "LORA"}, _adapter_bytes(tensors), _small(), "x")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_every_float_dtype_converts_to_the_same_rows(dtype):
    tensors = _ab(1, "v_proj", 2, 8, 4)
    as_f32 = convert({"peft_type": "LORA"}, _adapter_bytes(tensors), _small(), "x").tensors
    other = convert({"peft_type": "LORA"}, _adapter_bytes({k: v.to(dtype) for k, v in tensors.items()}), _small(),
                    "x").tensors
    assert other.weights == as_f32.weights and other.config == as_f32.config


@pytest.mark.parametrize("bad,alpha,dtype,fragment", [
    (float("nan"), 4, "float32", "holds values that are not finite in float32 once lora_B is scaled by 2"),
    (float("inf"), 4, "bfloat16", "not finite in bfloat16"),
    (100.0, 65536, "float16", "not finite in float16 once lora_B is scaled by 32768 (lora_alpha 65536 / r, r=2)"),
])
def test_values_not_finite_in_the_models_dtype_are_refused(bad, alpha, dtype, fragment):
    """A NaN in the file, or a lora_alpha that pushes lora_B beyond float16's range: the engine would get non-finite
    weights and the prediction an empty output (issue 47), so the adapter is refused naming the layer and module."""
    tensors = {**_ab(0, "q_proj", 2, 8, 8), **_ab(3, "o_proj", 2, 8, 8)}
    tensors["base_model.model.model.layers.3.self_attn.o_proj.lora_B.weight"][-1, -1] = bad
    spec = dataclasses.replace(_small(), dtype=dtype)
    with pytest.raises(LoraAdapterError) as info:
        convert({"peft_type": "LORA", "lora_alpha": alpha}, _adapter_bytes(tensors), spec, "x")
    assert info.value.message.startswith("lora_weights x: layer 3 o_proj holds values that are not finite")
    assert fragment in info.value.message


def test_the_adapter_is_read_a_module_at_a_time_with_the_file_mapped_again(monkeypatch):
    """With a small remap size, every module is read from a fresh mapping, and the rows are the same."""
    import cog_triton.streaming.lora.convert as converter

    path = llama_shaped_adapter(layers=(0, 1))
    whole = convert(CONFIG, path, spec(dtype="float32"), "x").tensors
    opened = []
    real = converter._batches

    def batches(modules):
        for batch in real(modules):
            opened.append(len(batch))
            yield batch

    monkeypatch.setattr(converter, "REMAP_BYTES", 1)
    monkeypatch.setattr(converter, "_batches", batches)
    again = convert(CONFIG, path, spec(dtype="float32"), "x").tensors
    assert again.weights == whole.weights and opened == [1] * 14
