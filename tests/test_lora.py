"""tensorrtllm_backend.lora: the C++ backend's LoRA cache geometry (the host cache's default size) and the fused
gated MLP rule (which target modules an engine applies).

The upstream arithmetic is written out here from NVIDIA/TensorRT-LLM's source (read through the library; not taken
from the module under test), and the module's answers are checked against it:

* ``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp`` @ 9df6d722 (the same arithmetic @ 0cedd9a0):
  ``getPageManagerConfig`` (page width, slots per page, the one-max-sized-LoRA check, pages from slots) and
  ``getMaxNumSlots`` (host slots = bytes / (page width x dtype size)); ``PeftCacheManager``'s constructor caps the
  optimal and maximum adapter sizes at the engine's max_lora_rank;
* ``cpp/tensorrt_llm/runtime/loraCache.cpp`` @ c85e8726 ``LoraCache::determineNumPages`` (rows placed in order, a
  row that does not fit the rest of a page starting the next) and ``claimPagesWithEvict`` (an adapter needs that
  many free pages);
* ``cpp/tensorrt_llm/runtime/loraModule.cpp`` @ 2a9abd95 ``createLoraModules`` and ``loraModule.h`` @ 0ccc36f7
  (each module's in / out and which of them tensor parallelism splits).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from tensorrtllm_backend.lora import (
    SUPPORTED_MODULES,
    TRTLLM_TO_HF,
    LoraSpec,
    ModelShape,
    checkpoint_lora_spec,
    engine_lora_spec,
    fused_pair_problem,
    pages_for_rows,
)

LLAMA3_8B = ModelShape(num_layers=32, hidden_size=4096, mlp_hidden_size=14336, num_heads=32, num_kv_heads=8,
                       head_size=128)
LLAMA2_7B = ModelShape(num_layers=32, hidden_size=4096, mlp_hidden_size=11008, num_heads=32, num_kv_heads=32,
                       head_size=128)
SMOLLM2 = ModelShape(num_layers=30, hidden_size=576, mlp_hidden_size=1536, num_heads=9, num_kv_heads=3, head_size=64)
DTYPE_SIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def upstream_modules(shape: ModelShape, names, tp: int) -> list[tuple[int, int]]:
    """(module id, local in + local out) per module, as createLoraModules and LoraModule::localIn/OutDim give
    them: attn_dense and mlp_4h_to_h split "in" (inTpSplitDim 1), the others split "out" (outTpSplitDim 0)."""
    h, m = shape.hidden_size, shape.mlp_hidden_size
    q, kv = shape.num_heads * shape.head_size, shape.num_kv_heads * shape.head_size
    table = {"attn_q": (1, h, q, False), "attn_k": (2, h, kv, False), "attn_v": (3, h, kv, False),
             "attn_dense": (4, h, h, True), "mlp_h_to_4h": (5, h, m, False), "mlp_4h_to_h": (6, m, h, True),
             "mlp_gate": (7, h, m, False)}
    out = []
    for name in names:
        module_id, in_dim, out_dim, split_in = table[name]
        out.append((module_id, (in_dim // tp + out_dim) if split_in else (in_dim + out_dim // tp)))
    return out


@dataclass
class UpstreamHostCache:
    """One rank's host LoRA cache as getPageManagerConfig / getMaxNumSlots size it."""

    modules: list[tuple[int, int]]
    local_layers: int
    max_lora_rank: int
    dtype_size: int
    host_bytes: int
    optimal_adapter_size: int = 8  # PeftCacheConfig::kDefaultOptimalAdapterSize
    max_adapter_size: int = 64  # PeftCacheConfig::kDefaultMaxAdapterSize

    def __post_init__(self) -> None:
        optimal = min(self.optimal_adapter_size, self.max_lora_rank)
        largest = min(self.max_adapter_size, self.max_lora_rank)
        sizes = [d for _, d in self.modules]
        self.page_width = min(sizes)
        total_slots = sum(optimal * ceil_div(d, self.page_width) for d in sizes) * self.local_layers
        self.slots_per_page = max(total_slots, ceil_div(largest * max(sizes), self.page_width))
        min_total_slots = ceil_div(largest * sum(sizes) * self.local_layers, self.page_width)
        host_slots = self.host_bytes // (self.page_width * self.dtype_size)
        self.starts = host_slots >= min_total_slots  # else "Not enough space allocated to host LoRA cache ..."
        self.pages = ceil_div(host_slots, self.slots_per_page)

    def pages_for(self, rows: list[tuple[int, int]]) -> int:
        """determineNumPages of an adapter whose rows are (module id, rank), in request order."""
        sizes = dict(self.modules)
        page, slot = 0, 0
        for module_id, rank in rows:
            slots = ceil_div(rank * sizes[module_id], self.page_width)
            if slots + slot > self.slots_per_page:
                slot, page = 0, page + 1
            slot += slots
        return page + 1

    def largest_adapter(self) -> list[tuple[int, int]]:
        """max_lora_rank on every module of every local layer, rows by layer then module id (the converter's order)."""
        ids = sorted(module_id for module_id, _ in self.modules)
        return [(module_id, self.max_lora_rank) for _ in range(self.local_layers) for module_id in ids]

    def adapters_held(self, rows: list[tuple[int, int]]) -> int:
        """How many such adapters fit at once (each claims its pages: claimPagesWithEvict)."""
        return self.pages // self.pages_for(rows)


def engine_spec(shape: ModelShape, rank: int, modules=SUPPORTED_MODULES, max_loras: int = 8, dtype: str = "bfloat16",
                tp: int = 1, pp: int = 1) -> LoraSpec:
    return LoraSpec(True, dtype=dtype, max_rank=rank, target_modules=tuple(modules), shape=shape, max_loras=max_loras,
                    fused_mlp=True, paged_cache=True, tp_size=tp, pp_size=pp)


def upstream_cache(spec: LoraSpec, host_bytes: int, optimal=None, largest=None) -> UpstreamHostCache:
    return UpstreamHostCache(upstream_modules(spec.shape, spec.target_modules, spec.tp_size),
                             spec.shape.num_layers // spec.pp_size, spec.max_rank, DTYPE_SIZE[spec.dtype], host_bytes,
                             optimal_adapter_size=optimal or 8, max_adapter_size=largest or 64)


# --- the host LoRA cache's default size -------------------------------------------------------------------------


def test_a_llama_3_8b_cache_holds_all_eight_rank_16_adapters() -> None:
    """The case of the issue: 8 rank-16 adapters on all seven modules of Llama-3-8B (bf16, one GPU). Sized as
    max_loras x the adapter's values, the cache held 7: an adapter's 8,256 slots take 2 pages of 4,608."""
    spec = engine_spec(LLAMA3_8B, rank=16)
    values_only = 8 * spec.adapter_values() * 2
    old = upstream_cache(spec, values_only, largest=16)
    assert (old.page_width, old.slots_per_page, old.pages_for(old.largest_adapter())) == (5120, 4608, 2)
    assert old.adapters_held(old.largest_adapter()) == 7

    host = spec.host_cache_bytes(max_adapter_size=16)
    cache = upstream_cache(spec, host, largest=16)
    assert cache.starts and cache.adapters_held(cache.largest_adapter()) == 8
    assert host == 16 * 4608 * 5120 * 2  # 16 whole pages, nothing more


def test_one_adapter_whose_size_does_not_divide_into_slots_lets_the_backend_start() -> None:
    """max_loras 1 and an adapter whose values are no whole number of slots: values-only bytes give one slot fewer
    than the backend's minimum, and it would stop at start-up ("Not enough space allocated to host LoRA cache to
    hold 1 max sized LoRA")."""
    spec = engine_spec(SMOLLM2, rank=1, max_loras=1, dtype="float16")
    assert not upstream_cache(spec, spec.adapter_values() * 2, largest=1).starts
    cache = upstream_cache(spec, spec.host_cache_bytes(max_adapter_size=1), largest=1)
    assert cache.starts and cache.adapters_held(cache.largest_adapter()) == 1


GEOMETRIES = [
    # shape, modules, tp, pp
    (LLAMA3_8B, SUPPORTED_MODULES, 1, 1),
    (LLAMA3_8B, ("attn_q", "attn_v"), 1, 1),
    (LLAMA3_8B, ("attn_q", "attn_k", "attn_v", "attn_dense"), 2, 1),
    (LLAMA2_7B, SUPPORTED_MODULES, 4, 1),
    (LLAMA2_7B, ("mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"), 1, 2),
    (SMOLLM2, SUPPORTED_MODULES, 1, 1),
    (SMOLLM2, ("attn_k", "attn_dense", "mlp_4h_to_h"), 3, 3),
]


@pytest.mark.parametrize("shape,modules,tp,pp", GEOMETRIES)
def test_the_default_holds_exactly_max_loras_of_the_largest_adapters(shape, modules, tp, pp) -> None:
    """For every geometry, rank, count, optimal / maximum adapter size and dtype: the backend starts, the cache
    holds max_loras adapters of max_lora_rank on every module at once, and not one more (whole pages, no slack)."""
    for rank, max_loras, optimal, largest, dtype in itertools.product(
            (1, 8, 16, 64), (1, 3, 8), (None, 4, 16), (None, 8), ("float16", "float32")):
        spec = engine_spec(shape, rank, modules, max_loras, dtype, tp, pp)
        host = spec.host_cache_bytes(optimal, largest)
        cache = upstream_cache(spec, host, optimal, largest)
        case = (rank, max_loras, optimal, largest, dtype)
        assert cache.starts, case
        assert cache.adapters_held(cache.largest_adapter()) == max_loras, case
        assert cache.pages == max_loras * cache.pages_for(cache.largest_adapter()), case
        pages = spec.cache_pages(optimal, largest)
        assert (pages.page_width, pages.slots_per_page, pages.pages_of(host) // pages.adapter_pages) == (
            cache.page_width, cache.slots_per_page, max_loras), case


@pytest.mark.parametrize("shape,modules,tp,pp", GEOMETRIES)
def test_no_adapter_the_engine_takes_needs_more_pages_than_the_largest(shape, modules, tp, pp) -> None:
    """The default is sized by the largest adapter; any other (fewer modules or layers, lower ranks, rows in the
    converter's order) takes no more pages, so max_loras of any adapters fit."""
    rng = random.Random(f"{shape}{modules}{tp}{pp}")
    spec = engine_spec(shape, 16, modules, 1, "bfloat16", tp, pp)
    cache = upstream_cache(spec, spec.host_cache_bytes(), largest=16)
    most = cache.pages_for(cache.largest_adapter())
    for _ in range(200):
        rows = [(module_id, rng.randint(1, 16)) for module_id, _ in cache.largest_adapter() if rng.random() < 0.8]
        assert cache.pages_for(rows) <= most, rows


def test_pages_for_rows_starts_a_new_page_for_a_row_that_does_not_fit() -> None:
    assert pages_for_rows([4, 4], 8) == 1  # exactly full
    assert pages_for_rows([5, 4], 8) == 2  # the second row does not fit the 3 slots left
    assert pages_for_rows([3, 3, 3], 8) == 2
    assert pages_for_rows([1, 7, 1], 8) == 2
    assert pages_for_rows([], 8) == 1


def test_the_reference_models_cache_counts_the_values_it_holds() -> None:
    """The CPU reference model's LoRA cache is no paged cache (it counts float32 values held): its default stays
    max_loras adapters' values."""
    hf = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
          "num_attention_heads": 2, "num_key_value_heads": 1}
    spec = checkpoint_lora_spec(hf, {"max_lora_rank": 4, "lora_target_modules": ["attn_q"], "max_loras": 3}, True)
    assert not spec.paged_cache
    assert spec.host_cache_bytes() == 3 * 4 * (8 + 8) * 2 * 4


# --- the fused gated MLP ---------------------------------------------------------------------------------------


def lora_engine(modules, **plugins) -> dict:
    return {
        "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16", "num_hidden_layers": 2,
                              "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
                              "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}},
        "build_config": {"plugin_config": {"lora_plugin": "float16", **plugins},
                         "lora_config": {"max_lora_rank": 4, "lora_target_modules": list(modules)}},
    }


@pytest.mark.parametrize("plugins", [{}, {"use_fused_mlp": True}])
def test_an_engine_with_a_fused_mlp_and_one_of_its_pair_does_not_apply_it(plugins) -> None:
    """tensorrt_llm/layers/mlp.py fc_gate_lora @ 04a2cacb adds LoRA to the fused gate/up GEMM only when both
    mlp_h_to_4h and mlp_gate are LoRA modules; use_fused_mlp is on unless the config says otherwise
    (tensorrt_llm/plugin/plugin.py, PluginConfig default)."""
    spec = engine_lora_spec(lora_engine(["attn_q", "mlp_h_to_4h", "mlp_4h_to_h"], **plugins))
    assert spec.enabled and spec.fused_mlp and spec.paged_cache and spec.tp_size == 2
    assert spec.unapplied_modules == ("mlp_h_to_4h",)
    assert spec.applied_modules == ("attn_q", "mlp_4h_to_h")
    assert spec.target_modules == ("attn_q", "mlp_h_to_4h", "mlp_4h_to_h")  # the executor's modules: all three
    assert "mlp_h_to_4h not applied" in spec.describe()
    gate_only = engine_lora_spec(lora_engine(["mlp_gate"], **plugins))
    assert gate_only.unapplied_modules == ("mlp_gate",) and gate_only.applied_modules == ()


def test_an_engine_with_both_or_an_unfused_mlp_applies_every_module() -> None:
    both = engine_lora_spec(lora_engine(["attn_q", "mlp_h_to_4h", "mlp_gate"]))
    assert both.applied_modules == ("attn_q", "mlp_h_to_4h", "mlp_gate") and "not applied" not in both.describe()
    unfused = engine_lora_spec(lora_engine(["mlp_h_to_4h"], use_fused_mlp=False))  # GatedMLP: fc and gate apart
    assert not unfused.fused_mlp and unfused.applied_modules == ("mlp_h_to_4h",)


def test_the_reference_model_applies_either_projection_alone() -> None:
    """transformers' Llama MLP keeps gate_proj and up_proj as separate Linear layers, and peft adds LoRA to each:
    the CPU reference model has no fused pair."""
    hf = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
          "num_attention_heads": 2, "num_key_value_heads": 1}
    spec = checkpoint_lora_spec(hf, {"lora_target_modules": ["attn_q", "mlp_h_to_4h"]}, True)
    assert not spec.fused_mlp and spec.applied_modules == ("attn_q", "mlp_h_to_4h")


def test_the_fused_pair_problem_names_both_modules_and_why() -> None:
    text = fused_pair_problem(["attn_q", "mlp_gate"])
    assert text.startswith("mlp_gate (up_proj) without mlp_h_to_4h (gate_proj)")
    assert "tensorrt_llm/layers/mlp.py fc_gate_lora" in text and "ignore adapters' up_proj weights" in text
    assert fused_pair_problem(["attn_q"]) == "" and fused_pair_problem(["mlp_gate", "mlp_h_to_4h"]) == ""


# --- the largest adapter a model serves (what one adapter may cost a stream process) ------------------------------

def upstream_largest_values(shape: ModelShape, modules, rank: int) -> int:
    """Values of an adapter of ``rank`` on every one of ``modules`` in every layer, from createLoraModules' sizes
    (loraModule.cpp @ 2a9abd95, written out in :func:`upstream_modules` for one rank: tp 1)."""
    return rank * sum(size for _, size in upstream_modules(shape, modules, 1)) * shape.num_layers


@pytest.mark.parametrize("shape,rank,modules,file_bytes", [
    # the figures: SmolLM2-135M at rank 64 on every module, 78 MB of float32 weights; an 8B Llama at rank 64
    # on all seven, 0.34 GB in bfloat16 and so 0.67 GB as the float32 file peft saves by default
    (SMOLLM2, 64, SUPPORTED_MODULES, 78_151_680),
    (LLAMA3_8B, 64, SUPPORTED_MODULES, 671_088_640),
    (LLAMA3_8B, 16, ("attn_q", "attn_v"), 16 * (8192 + 5120) * 32 * 4),
])
def test_the_largest_adapter_is_max_lora_rank_on_every_applied_module(shape, rank, modules, file_bytes) -> None:
    spec = engine_spec(shape, rank, modules, dtype="bfloat16")
    assert spec.largest_adapter_values() == upstream_largest_values(shape, modules, rank)
    assert 4 * spec.largest_adapter_values() == file_bytes
    tensors = 2 * len(modules) * shape.num_layers
    assert spec.largest_adapter_tensors() == tensors
    assert spec.largest_header_bytes() == (64 << 10) + 512 * tensors
    assert spec.largest_adapter_file_bytes() == 8 + spec.largest_header_bytes() + file_bytes
    assert spec.describe_largest_adapter().startswith(f"rank {rank} on {', '.join(TRTLLM_TO_HF[m] for m in modules)} "
                                                      f"of {shape.num_layers} layers: ")


def test_a_module_the_engine_does_not_apply_adds_nothing_and_no_lora_means_no_adapter() -> None:
    """An engine with a fused gated MLP and gate_proj alone ignores gate_proj adapters (they are refused), so they do
    not count; a model without LoRA serves no adapter at all."""
    fused = LoraSpec(True, dtype="float16", max_rank=8, target_modules=("attn_q", "mlp_h_to_4h"), shape=SMOLLM2,
                     fused_mlp=True)
    assert fused.applied_modules == ("attn_q",)
    assert fused.largest_adapter_values() == upstream_largest_values(SMOLLM2, ("attn_q",), 8)
    off = LoraSpec(False, "no plugin")
    assert (off.largest_adapter_values(), off.largest_adapter_tensors(), off.largest_adapter_file_bytes()) == (0, 0, 0)


def test_the_header_bound_holds_a_real_peft_header_with_room(tmp_path, checkpoint_dir) -> None:
    """peft's own file for SmolLM2 at rank 2 on every module: its header is within the bound (and the file within
    the largest adapter's bytes at that rank), with more than twice the room the keys need."""
    import json
    import struct

    from tests.lora_adapters import make_adapter

    folder = make_adapter(checkpoint_dir, tmp_path / "a", r=2, alpha=4, seed=0, targets=[TRTLLM_TO_HF[m] for m in
                                                                                          SUPPORTED_MODULES])
    data = (folder / "adapter_model.safetensors").read_bytes()
    (header,) = struct.unpack("<Q", data[:8])
    spec = checkpoint_lora_spec(json.loads((checkpoint_dir / "config.json").read_text()), {"max_lora_rank": 2}, True)
    assert len(data) <= spec.largest_adapter_file_bytes()
    assert 2 * header < spec.largest_header_bytes() - (64 << 10)
