"""QuantAlgo and quantize_and_export of the stand-in (TensorRT-LLM 1.1.0 and 1.2.x names and keywords)."""

import enum
import json
import os

from tensorrt_llm import record


class QuantAlgo(str, enum.Enum):
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    FP8 = "FP8"
    NVFP4 = "NVFP4"
    INT8 = "INT8"


def quantize_and_export(*, model_dir, device, calib_dataset, dtype, qformat, kv_cache_dtype, calib_size,
                        batch_size, calib_max_seq_length, awq_block_size, output_dir, tp_size, pp_size, cp_size,
                        seed, tokenizer_max_seq_length, num_medusa_heads=None, num_medusa_layers=None,
                        max_draft_len=None, medusa_hidden_act=None, medusa_model_dir=None, quant_medusa_head=None,
                        auto_quantize_bits=None, device_map="auto", quantize_lm_head=False):
    params = dict(locals())
    kwargs = {k: v for k, v in params.items() if v is not None and k not in ("device_map", "quantize_lm_head")}
    kwargs["model_dir"], kwargs["output_dir"] = os.path.basename(model_dir), os.path.basename(output_dir)
    record("quantize_and_export", kwargs=kwargs)
    os.makedirs(output_dir, exist_ok=True)
    mapping = {"world_size": tp_size * pp_size, "tp_size": tp_size, "pp_size": pp_size}
    with open(os.path.join(output_dir, "config.json"), "w") as fh:
        json.dump({"architecture": "quantized", "dtype": dtype, "qformat": qformat, "mapping": mapping}, fh)
