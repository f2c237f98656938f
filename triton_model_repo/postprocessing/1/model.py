"""`postprocessing` model (Triton Python backend): token ids -> text.

Inputs (tensor names of TensorRT-LLM 1.1.0's inflight_batcher_llm postprocessing):
    TOKENS_BATCH     INT32 [b, beams, tokens]
    SEQUENCE_LENGTH  INT32 [b, beams]   valid tokens per beam
Output:
    OUTPUT           BYTES [b, beams]   UTF-8 text of tokens[:sequence_length]
Parameters: tokenizer_dir (path), skip_special_tokens ("true"/"false").

Each response is decoded on its own, as upstream does: in streaming mode a character split across
two responses (emoji, CJK in byte-level BPE) comes out as U+FFFD here. Clients that need exact
streamed text detokenize ``output_ids`` incrementally (cog_triton.detokenizer does).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer


class TritonPythonModel:
    """Detokenizer step of the ensemble (see the module docstring for tensors)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"], local_files_only=True)
        value = params.get("skip_special_tokens", "true").strip().lower()
        if value not in ("true", "false", "1", "0"):
            raise ValueError(f"parameter skip_special_tokens={value!r} must be true or false")
        self.skip_special_tokens = value in ("true", "1")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1]) if tokens.ndim >= 2 else tokens.reshape(1, 1, -1)
                lengths = lengths.reshape(tokens.shape[0], tokens.shape[1])
                texts = []
                for b in range(tokens.shape[0]):
                    row = []
                    for beam in range(tokens.shape[1]):
                        ids = tokens[b, beam, : max(0, int(lengths[b, beam]))].tolist()
                        row.append(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens).encode("utf-8"))
                    texts.append(row)
                out = np.array(texts, dtype=object)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")))
        return responses
