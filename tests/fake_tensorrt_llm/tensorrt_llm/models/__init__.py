"""MODEL_MAP of the stand-in: HF architecture -> recording model class (TensorRT-LLM 1.1.0 and 1.2.x class names)."""

import json
import os

from tensorrt_llm import record


class _Recording:
    def __init__(self, config):
        self.config = config

    @classmethod
    def from_hugging_face(cls, hf_model_or_dir, dtype="auto", mapping=None, quant_config=None, **kwargs):
        record("from_hugging_face", cls=cls.__name__, model_dir=os.path.basename(str(hf_model_or_dir)), dtype=dtype,
               mapping=mapping.to_json(), quant_config=quant_config.to_json(), kwargs=kwargs)
        return cls({"architecture": cls.__name__, "dtype": dtype, "mapping": mapping.to_json()})

    def save_checkpoint(self, output_dir, save_config=True):
        rank = self.config["mapping"]["rank"]
        record("save_checkpoint", rank=rank, output_dir=os.path.basename(str(output_dir)), save_config=save_config)
        with open(os.path.join(output_dir, f"rank{rank}.safetensors"), "wb") as fh:
            fh.write(b"fake weights")
        if save_config:
            with open(os.path.join(output_dir, "config.json"), "w") as fh:
                json.dump(self.config, fh)


class LLaMAForCausalLM(_Recording):
    pass


class GPTForCausalLM(_Recording):
    pass


class GemmaForCausalLM(_Recording):
    pass


MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM,
    "MistralForCausalLM": LLaMAForCausalLM,
    "GPT2LMHeadModel": GPTForCausalLM,
    "GemmaForCausalLM": GemmaForCausalLM,
}
