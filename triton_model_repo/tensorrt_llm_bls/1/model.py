"""`tensorrt_llm_bls` model (Triton Python backend, decoupled): the ensemble's pipeline in Python.

Per request: ``preprocessing`` (BLS call) -> ``tensorrt_llm`` (decoupled BLS call, streamed) ->
incremental detokenization here. Inputs are the ensemble's (text_input BYTES [1, 1], max_tokens
INT32 [1, 1], optional sampling tensors; names of TensorRT-LLM 1.1.0's tensorrt_llm_bls).
Outputs per response: text_output BYTES [1, 1] (the new text since the previous response; a
multi-byte character split across tokens is held back until complete), output_ids INT32 [1, 1, n]
and sequence_length INT32 [1, 1] (the new tokens). With stream=false one response carries all.
"""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer

# cog_triton/detokenizer.py, copied beside this file when the model repository is rendered.
from detokenizer import IncrementalDetokenizer

# ensemble input name -> (tensorrt_llm input name)
_SAMPLING = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "beam_width": "beam_width",
}


class TritonPythonModel:
    """BLS pipeline; each request runs in its own thread so requests stream concurrently."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.llm_name = params.get("tensorrt_llm_model_name") or "tensorrt_llm"
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"], local_files_only=True)
        self.skip_special_tokens = params.get("skip_special_tokens", "true").strip().lower() in ("true", "1")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self._serve, args=(request,), daemon=True)
            thread.start()
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return None

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)

    def _serve(self, request):
        sender = request.get_response_sender()
        try:
            self._pipeline(request, sender)
        except Exception as exc:  # the request fails, the model keeps serving
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {exc}")))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _pipeline(self, request, sender):
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
        pre_inputs = [pb_utils.Tensor("QUERY", get("text_input").as_numpy().reshape(1, 1))]
        pre_inputs.append(pb_utils.Tensor("REQUEST_OUTPUT_LEN", get("max_tokens").as_numpy().reshape(1, 1).astype(np.int32)))
        for src, dst in (("bad_words", "BAD_WORDS_DICT"), ("stop_words", "STOP_WORDS_DICT"), ("end_id", "END_ID"), ("pad_id", "PAD_ID")):
            tensor = get(src)
            if tensor is not None:
                pre_inputs.append(pb_utils.Tensor(dst, tensor.as_numpy().reshape(1, -1)))
        pre = pb_utils.InferenceRequest(
            model_name="preprocessing",
            inputs=pre_inputs,
            requested_output_names=["INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS", "OUT_END_ID", "OUT_PAD_ID"],
        ).exec()
        if pre.has_error():
            raise RuntimeError(pre.error().message())
        out = {t.name(): t.as_numpy() for t in pre.output_tensors()}
        stream_tensor = get("stream")
        streaming = bool(stream_tensor.as_numpy().reshape(-1)[0]) if stream_tensor is not None else False
        llm_inputs = [
            pb_utils.Tensor("input_ids", out["INPUT_ID"].astype(np.int32)),
            pb_utils.Tensor("input_lengths", out["REQUEST_INPUT_LEN"].astype(np.int32)),
            pb_utils.Tensor("request_output_len", out["REQUEST_OUTPUT_LEN"].astype(np.int32)),
            pb_utils.Tensor("end_id", out["OUT_END_ID"].astype(np.int32)),
            pb_utils.Tensor("pad_id", out["OUT_PAD_ID"].astype(np.int32)),
            pb_utils.Tensor("stop_words_list", out["STOP_WORDS_IDS"].astype(np.int32)),
            pb_utils.Tensor("bad_words_list", out["BAD_WORDS_IDS"].astype(np.int32)),
            pb_utils.Tensor("streaming", np.array([[streaming]], dtype=bool)),
        ]
        for src, dst in _SAMPLING.items():
            tensor = get(src)
            if tensor is not None:
                llm_inputs.append(pb_utils.Tensor(dst, tensor.as_numpy().reshape(1, 1)))
        responses = pb_utils.InferenceRequest(
            model_name=self.llm_name, inputs=llm_inputs, requested_output_names=["output_ids", "sequence_length"]
        ).exec(decoupled=True)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=self.skip_special_tokens)
        sent = False
        for response in responses:
            if response.has_error():
                raise RuntimeError(response.error().message())
            tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if "output_ids" not in tensors:
                continue  # the empty final response
            n = int(tensors["sequence_length"].reshape(-1)[0])
            new = tensors["output_ids"].reshape(-1)[:n].tolist()
            sender.send(self._response(detok.push(new), new))
            sent = True
        tail = detok.finish()
        if tail or not sent:
            sender.send(self._response(tail, []))

    @staticmethod
    def _response(text, new_ids):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=object)),
                pb_utils.Tensor("output_ids", np.array([[new_ids]], dtype=np.int32).reshape(1, 1, len(new_ids))),
                pb_utils.Tensor("sequence_length", np.array([[len(new_ids)]], dtype=np.int32)),
            ]
        )
