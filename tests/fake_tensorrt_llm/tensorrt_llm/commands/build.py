"""Stand-in for ``tensorrt_llm/commands/build.py`` of TensorRT-LLM 1.2.1 (``trtllm-build``): the same argument
parser, then a fake engine instead of a TensorRT build (no GPU here).

The parser is written from the upstream source, flag by flag, so that it accepts what the real
``trtllm-build`` accepts and rejects (argparse exit status 2) what it rejects: an unknown or misspelled
flag (``parse_args``, never ``parse_known_args``), a value outside ``choices``, a non-integer where the real
one has ``type=int``. Sources (NVIDIA/TensorRT-LLM, 1.x line: the "TensorRT LLM" spelling, no auto-parallel
arguments any more, ``LoraConfig`` from ``tensorrt_llm/lora_helper.py``; re-audited for 1.2.1 against the
nearest stored versions: ``commands/build.py`` of the 1.x line and ``plugin/plugin.py`` whose ``PluginConfig``
is a pydantic model, with the same ``cli_plugin_args`` and the same choices built from each field's
``Optional[Literal[...]]``/``bool`` annotation, so no flag or choice our plans use changed; docs/engines.md):

* ``tensorrt_llm/commands/build.py`` ``parse_arguments()``: every flag below but the plugin group;
  ``--kv_cache_type`` is ``enum_type(KVCacheType)``, i.e. ``KVCacheType.from_string``, which upper-cases and
  knows CONTINUOUS, PAGED, DISABLED (``cpp/include/tensorrt_llm/runtime/modelConfig.h``
  ``KVCacheTypeFromString``); ``--log_level`` choices are ``severity_map``'s keys (``tensorrt_llm/logger.py``);
  ``--lora_target_modules`` choices are ``LoraManager.LORA_MODULE_IDS`` (``tensorrt_llm/lora_manager.py``).
* ``tensorrt_llm/plugin/plugin.py`` ``add_plugin_argument()``: one flag per name in ``cli_plugin_args``;
  a ``Optional[Literal[...]]`` field takes its literals with ``None`` spelled ``disable``; a ``bool`` field
  takes ``enable``/``disable``; ``tokens_per_block`` is an ``int``. Field types from ``PluginConfig``
  (``DefaultPluginDtype = Literal["auto", "float16", "float32", "bfloat16", "int32", None]``).
"""

import argparse
import json
import os
import sys

# tensorrt_llm/plugin/plugin.py: DefaultPluginDtype, and the Literal types of the other plugin fields.
DEFAULT_PLUGIN_DTYPE = ("auto", "float16", "float32", "bfloat16", "int32", "disable")
PLUGIN_CHOICES = {
    "bert_attention_plugin": DEFAULT_PLUGIN_DTYPE,
    "gpt_attention_plugin": DEFAULT_PLUGIN_DTYPE,
    "gemm_plugin": ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"),
    "gemm_swiglu_plugin": ("fp8", "disable"),
    "fp8_rowwise_gemm_plugin": DEFAULT_PLUGIN_DTYPE,
    "lora_plugin": DEFAULT_PLUGIN_DTYPE,
    "moe_plugin": DEFAULT_PLUGIN_DTYPE,
    "mamba_conv1d_plugin": DEFAULT_PLUGIN_DTYPE,
    "nccl_plugin": DEFAULT_PLUGIN_DTYPE,
    "low_latency_gemm_plugin": ("fp8", "disable"),
    "low_latency_gemm_swiglu_plugin": ("fp8", "disable"),
    "gemm_allreduce_plugin": ("float16", "bfloat16", "disable"),
}
# cli_plugin_args' "Features": bool fields (enable/disable) of PluginConfig, and the one int field.
PLUGIN_SWITCHES = (
    "dora_plugin", "context_fmha", "bert_context_fmha_fp32_acc", "remove_input_padding", "use_paged_context_fmha",
    "use_fp8_context_fmha", "fuse_fp4_quant", "multiple_profiles", "paged_state", "streamingllm",
    "norm_quant_fusion", "reduce_fusion", "user_buffer", "use_fused_mlp", "pp_reduce_scatter",
)  # fmt: skip
PLUGIN_INTS = ("tokens_per_block",)
KV_CACHE_TYPES = ("CONTINUOUS", "PAGED", "DISABLED")
LOG_LEVELS = ("internal_error", "error", "warning", "info", "verbose")
LORA_MODULES = (
    "attn_qkv", "attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate",
    "cross_attn_qkv", "cross_attn_q", "cross_attn_k", "cross_attn_v", "cross_attn_dense",
    "moe_h_to_4h", "moe_4h_to_h", "moe_gate", "moe_router", "mlp_router", "mlp_gate_up",
)  # fmt: skip


def kv_cache_type(value):
    """``KVCacheType.from_string``: case-insensitive; anything else raises (argparse: invalid value)."""
    if value.upper() not in KV_CACHE_TYPES:
        raise ValueError(f"Invalid KV cache type: {value.upper()}")
    return value.upper()


def parse_arguments():
    parser = argparse.ArgumentParser(prog="trtllm-build")
    for name in ("--checkpoint_dir", "--model_config", "--build_config", "--model_cls_file", "--model_cls_name"):
        parser.add_argument(name, type=str, default=None)
    parser.add_argument("--output_dir", type=str, default="engine_outputs")
    for name in ("--max_batch_size", "--max_input_len", "--max_beam_width", "--max_num_tokens", "--opt_num_tokens",
                 "--max_encoder_input_len"):
        parser.add_argument(name, type=int, default=None)
    parser.add_argument("--max_seq_len", "--max_decoder_seq_len", dest="max_seq_len", type=int, default=None)
    parser.add_argument("--max_prompt_embedding_table_size", "--max_multimodal_len", type=int, default=0)
    parser.add_argument("--kv_cache_type", default=argparse.SUPPRESS, type=kv_cache_type)
    parser.add_argument("--paged_kv_cache", type=str, default=argparse.SUPPRESS)  # deprecated, still parsed
    parser.add_argument("--input_timing_cache", type=str, default=None)
    parser.add_argument("--output_timing_cache", type=str, default="model.cache")
    parser.add_argument("--profiling_verbosity", type=str, default="layer_names_only",
                        choices=["layer_names_only", "detailed", "none"])
    for name in ("--strip_plan", "--weight_sparsity", "--weight_streaming", "--fast_build", "--enable_debug_output",
                 "--dry_run", "--monitor_memory"):
        parser.add_argument(name, default=False, action="store_true")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log_level", type=str, default="info", choices=LOG_LEVELS)
    parser.add_argument("--visualize_network", type=str, default=None)
    logits = parser.add_argument_group("Logits arguments")
    logits.add_argument("--logits_dtype", type=str, default=None, choices=["float16", "float32"])
    for name in ("--gather_context_logits", "--gather_generation_logits", "--gather_all_token_logits"):
        logits.add_argument(name, action="store_true", default=False)
    lora = parser.add_argument_group("LoRA arguments")
    lora.add_argument("--lora_dir", type=str, default=None, nargs="+")
    lora.add_argument("--lora_ckpt_source", type=str, default="hf", choices=["hf", "nemo"])
    lora.add_argument("--lora_target_modules", nargs="+", default=None, choices=LORA_MODULES)
    lora.add_argument("--max_lora_rank", type=int, default=64)
    spec = parser.add_argument_group("Speculative decoding arguments")
    spec.add_argument("--speculative_decoding_mode", default=None, choices=[
        "draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"])
    spec.add_argument("--max_draft_len", type=int, default=0)
    plugins = parser.add_argument_group("Plugin config arguments")
    for name, choices in PLUGIN_CHOICES.items():
        plugins.add_argument(f"--{name}", type=str, default=None, choices=list(choices))
    for name in PLUGIN_SWITCHES:
        plugins.add_argument(f"--{name}", type=str, default=None, choices=["enable", "disable"])
    for name in PLUGIN_INTS:
        plugins.add_argument(f"--{name}", type=int, default=None)
    return parser


LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens")


def main(argv=None):
    from tensorrt_llm import __version__, record  # here, so that tests can load the parser alone

    argv = sys.argv[1:] if argv is None else argv
    args = parse_arguments().parse_args(argv)  # exits 2 on what the real parser rejects
    record("trtllm-build", argv=[a if not os.path.isabs(a) else os.path.basename(a) for a in argv])
    with open(os.path.join(args.checkpoint_dir, "config.json")) as fh:
        checkpoint = json.load(fh)
    os.makedirs(args.output_dir, exist_ok=True)
    build = {k: getattr(args, k) for k in LIMITS}
    with open(os.path.join(args.output_dir, "config.json"), "w") as fh:
        json.dump({"version": __version__, "pretrained_config": checkpoint, "build_config": build}, fh)
    for rank in range(checkpoint["mapping"]["world_size"]):
        with open(os.path.join(args.output_dir, f"rank{rank}.engine"), "wb") as fh:
            fh.write(f"fake engine rank {rank}".encode() * 100)
