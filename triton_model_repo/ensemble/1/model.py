"""`ensemble` (Triton Python backend, decoupled): upstream's text-in, text-out contract over our pipeline.

TensorRT-LLM 1.2.1's Triton clients (triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py @2a9abd95,
genai-perf's TensorRT-LLM mode, the HTTP generate examples) call a model named ``ensemble`` and read ``text_output``.
The predictor does not use this model: it calls ``ensemble_ids`` and detokenizes once in its stream process.

Contract (names, dtypes and shapes of triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt @2a9abd95;
per request, batch dimension b first):
    text_input          BYTES [b, 1]   prompt, UTF-8; tokenized by ``preprocessing`` (add_special_tokens as set)
    max_tokens          INT32 [b, 1]   tokens to generate
    stream              BOOL  [b, 1]   optional, default false: one response per engine response, else one per row
    bad_words / stop_words BYTES [b, n] optional; strings, as upstream's preprocessing encodes them
    exclude_input_in_output, end_id, pad_id, top_k, top_p, temperature, length_penalty, repetition_penalty,
    min_tokens, presence_penalty, frequency_penalty, seed, return_log_probs, beam_width, num_return_sequences
    (only where the rendered ``tensorrt_llm`` declares it: the C++ backend), lora_task_id / lora_weights /
    lora_config, guided_decoding_guide_type / guided_decoding_guide: passed to ``tensorrt_llm`` under the names of
    upstream's ensemble step (``top_k`` -> ``runtime_top_k``, ``length_penalty`` -> ``len_penalty``, ``stream`` ->
    ``streaming``), so the engine validates them and its errors come back as they are.
Outputs of each response:
    text_output         BYTES [s]      s = 1, or the beam width: the text of this response (see below); one
                                       dimension, as upstream's postprocessing sends it (its client reads
                                       ``text_output[0]`` as the string)
    batch_index         INT32 [1, 1]   the row of the request this response belongs to
    sequence_index      INT32 [1, 1]   which of num_return_sequences (0 without)
    cum_log_probs       FP32  [1, s]   with return_log_probs, as ``tensorrt_llm`` sent them
    output_log_probs    FP32  [1, s, n]

Behaviour, and where it deviates from upstream's postprocessing (postprocessing/1/model.py @2e2327b9, which decodes
each response's ids on its own with ``batch_decode``):
    * Streaming (beam width 1): ``text_output`` is the new text of the response, decoded incrementally per row and
      sequence (:class:`IncrementalText`): a character split over tokens comes out whole once its last byte
      arrives, and a token's leading space is kept, so the concatenation of a request's texts equals one decode of
      all its ids. Upstream decodes each token alone, emitting U+FFFD halves and (for sentencepiece tokenizers)
      dropping leading spaces. A response whose text is still incomplete (half a character) is not sent.
    * The engine's last response of a request that ends on the end token carries no ids (``output_ids`` [1, 1, 0]);
      upstream's reshape fails on it. Here it only ends the row: any held-back text is sent, then the final flag.
    * Not streaming, or beam width > 1 (TensorRT-LLM then returns whole beams each time): the whole text of each
      beam, as upstream; with exclude_input_in_output false the engine returns the prompt too, and so does the text.
    * Responses of one request leave in the engine's order: one coroutine reads one row's stream and sends. Upstream
      with several postprocessing instances returned them in completion order (tensorrtllm_backend #614).
    * A batch of b rows is sent to ``tensorrt_llm`` as b requests, and each response carries its ``batch_index``.
    * The client's request id goes to ``tensorrt_llm`` (so TensorRT-LLM's ``stop`` with that id reaches it, as
      through upstream's ensemble); a cancelled request is stopped there with a ``stop`` request. Rows of one
      request, and requests without an id, get ids of their own (``<id>/<row>``, ``ensemble-<n>``).
    * An input this model does not declare is refused by Triton before it runs ("unexpected inference input").
    * ``tensorrt_llm``'s errors come back as the engine wrote them (as through upstream's ensemble), with the
      inputs they name under ``tensorrt_llm``'s names also named as the client sent them (``bad_words_list`` ->
      ``bad_words``, ``runtime_top_k`` -> ``top_k``, ...): the PyTorch backend's default sampler refuses
      ``bad_words_list`` ("leave it out"), which an ``ensemble`` client never sent by that name.

Parameters: tokenizer_dir (path), skip_special_tokens ("true"/"false", upstream's postprocessing parameter; default
true).

Cost: one more Python backend stub (a tokenizer, no torch: see preprocessing/1/model.py) and, per token, one decode of
a window of a few tokens; only requests to this model pay it (``COG_TRITON_TEXT_ENSEMBLE=false`` leaves the model out).
"""

import asyncio
import concurrent.futures
import itertools
import json
import logging
import re
import sys


class _NoModelsAdvice(logging.Filter):
    """Drops transformers' import-time advice that, without torch, models are unavailable."""

    def filter(self, record):
        return "Models won't be available" not in record.getMessage()


sys.modules.setdefault("torch", None)  # this process only decodes: see preprocessing/1/model.py
logging.getLogger("transformers").addFilter(_NoModelsAdvice())

import numpy as np  # noqa: E402 - after torch is hidden

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton
    pb_utils = None

#: This model's inputs that go to ``tensorrt_llm`` as they are, by the name of upstream's ensemble step there.
#: (text_input, max_tokens, bad_words, stop_words, end_id and pad_id go through ``preprocessing``.)
LLM_INPUTS = {
    "exclude_input_in_output": "exclude_input_in_output",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "beam_width": "beam_width",
    "num_return_sequences": "num_return_sequences",
    "stream": "streaming",
    "lora_task_id": "lora_task_id",
    "lora_weights": "lora_weights",
    "lora_config": "lora_config",
    "guided_decoding_guide_type": "guided_decoding_guide_type",
    "guided_decoding_guide": "guided_decoding_guide",
}
#: Inputs that are one tensor for the whole request, not one row per batch item (allow_ragged_batch in the config).
WHOLE_REQUEST_INPUTS = frozenset({"lora_weights", "lora_config"})
#: ``preprocessing``'s inputs from this model's, and the outputs read back (preprocessing/config.pbtxt).
PREPROCESSING_INPUTS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
                        "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
PREPROCESSING_OUTPUTS = ("INPUT_ID", "REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN", "BAD_WORDS_IDS", "STOP_WORDS_IDS",
                         "OUT_END_ID", "OUT_PAD_ID")
#: ``tensorrt_llm`` inputs whose errors a client of this model could not act on by their name: the name of the input
#: the client sent instead (:func:`_client_names`).
CLIENT_NAMES = {
    **{llm: ours for ours, llm in LLM_INPUTS.items() if llm != ours and llm != "streaming"},
    "bad_words_list": "bad_words", "stop_words_list": "stop_words", "request_output_len": "max_tokens",
}
_CLIENT_NAME_PATTERN = re.compile(r"\b(" + "|".join(sorted(CLIENT_NAMES, key=len, reverse=True)) + r")\b")
REPLACEMENT_CHAR = "\ufffd"
_ids = itertools.count(1)


class IncrementalText:
    """The text of a stream of token ids, a delta per push, equal in sum to one decode of all ids.

    The prefix/read-offset method (as vLLM's and TGI's detokenizers and transformers' ``TextStreamer``): each push
    decodes the ids since the previous push together with the ones before it (context for leading-space markers and
    multi-byte sequences) and emits what the new ids added; text ending in U+FFFD (an incomplete character) waits for
    more ids. Ids are token ids (int); a push decodes O(ids of two pushes) tokens, never the whole sequence.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window (ids)
        self._read = 0  # ids up to here have been emitted as text

    def _decode(self, ids) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, ids) -> str:
        """Add ``ids`` (a sequence of int); returns the text they complete ("" while a character is incomplete)."""
        self._ids.extend(int(i) for i in ids)
        before = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) <= len(before) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before):]

    def finish(self) -> str:
        """The text not yet emitted (an incomplete last character decodes as U+FFFD, as in one full decode)."""
        before = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(before):]


def _client_names(message: str) -> str:
    """``tensorrt_llm``'s error ``message`` with the inputs it names under ``tensorrt_llm``'s names (e.g. the PyTorch
    backend's "bad_words_list cannot be applied here: leave it out") named as this model's client sent them too:
    "... (tensorrt_llm's bad_words_list is this request's bad_words)". The message is kept as the engine wrote it."""
    named = dict.fromkeys(_CLIENT_NAME_PATTERN.findall(message))
    if not named:
        return message
    notes = (f"tensorrt_llm's {llm} is this request's {CLIENT_NAMES[llm]}" for llm in named)
    return f"{message} ({'; '.join(notes)})"


def _bool_param(params, name, default):
    value = params.get(name, {}).get("string_value", "").strip().lower()
    if not value:
        return default
    if value in ("true", "1", "yes", "t", "y"):
        return True
    if value in ("false", "0", "no", "f", "n"):
        return False
    raise ValueError(f"parameter {name}={value!r} must be true or false")


def _bytes(texts):
    return np.array([t.encode("utf-8") for t in texts], dtype=object)


class TritonPythonModel:
    """Text in, text out (see the module docstring)."""

    def initialize(self, args):
        from transformers import AutoTokenizer  # noqa: PLC0415 - after torch is hidden

        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"], local_files_only=True)
        self.skip_special_tokens = _bool_param(params, "skip_special_tokens", True)
        self.declared = {t["name"] for t in config["input"]}
        # Triton 24.10's BLS ResponseIterator (async_exec(decoupled=True)) is a blocking iterator: each next() runs on
        # this pool. Bounded: tensorrt_llm generates for at most max_batch_size requests at once, and a waiting
        # request only holds a thread while it waits.
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4 * max(1, int(config.get("max_batch_size", 1))), thread_name_prefix="ensemble-bls")

    async def execute(self, requests):
        await asyncio.gather(*(self._serve(request) for request in requests))
        return None

    async def _serve(self, request):
        sender = request.get_response_sender()
        try:
            await self._generate(request, sender)
        except Exception as exc:  # noqa: BLE001 - one bad request never fails the others
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"ensemble: {exc}")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def _generate(self, request, sender):
        given = {name: pb_utils.get_input_tensor_by_name(request, name) for name in self.declared}
        given = {name: tensor.as_numpy() for name, tensor in given.items() if tensor is not None}
        rows = given["text_input"].shape[0]
        pre = pb_utils.InferenceRequest(
            model_name="preprocessing",
            inputs=[pb_utils.Tensor(PREPROCESSING_INPUTS[n], a) for n, a in given.items() if n in PREPROCESSING_INPUTS],
            requested_output_names=list(PREPROCESSING_OUTPUTS),
        )
        answer = await pre.async_exec()
        if answer.has_error():
            raise ValueError(answer.error().message())
        prepared = {name: pb_utils.get_output_tensor_by_name(answer, name).as_numpy() for name in PREPROCESSING_OUTPUTS}
        streaming = bool(given.get("stream", np.zeros((rows, 1), bool))[0].reshape(-1)[0])
        base_id = request.request_id() or f"ensemble-{next(_ids)}"
        finals = []
        results = await asyncio.gather(
            *(self._row(row, rows, base_id, given, prepared, streaming, sender, finals) for row in range(rows)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        for index, response in enumerate(finals):  # not streaming: one response per row, the last one final
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if index == len(finals) - 1 else 0
            sender.send(response, flags=flags)
        if streaming or not finals:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _llm_request(self, row, rows, request_id, given, prepared):
        length = int(prepared["REQUEST_INPUT_LEN"][row].reshape(-1)[0])
        tensors = [
            pb_utils.Tensor("input_ids", prepared["INPUT_ID"][row:row + 1, :length]),
            pb_utils.Tensor("input_lengths", prepared["REQUEST_INPUT_LEN"][row:row + 1]),
            pb_utils.Tensor("request_output_len", prepared["REQUEST_OUTPUT_LEN"][row:row + 1]),
            pb_utils.Tensor("end_id", prepared["OUT_END_ID"][row:row + 1]),
            pb_utils.Tensor("pad_id", prepared["OUT_PAD_ID"][row:row + 1]),
        ]
        if "stop_words" in given:
            tensors.append(pb_utils.Tensor("stop_words_list", prepared["STOP_WORDS_IDS"][row:row + 1]))
        if "bad_words" in given:
            tensors.append(pb_utils.Tensor("bad_words_list", prepared["BAD_WORDS_IDS"][row:row + 1]))
        for name, array in given.items():
            if name in LLM_INPUTS:
                value = array if name in WHOLE_REQUEST_INPUTS or array.shape[0] != rows else array[row:row + 1]
                tensors.append(pb_utils.Tensor(LLM_INPUTS[name], value))
        outputs = ["output_ids", "sequence_length"]
        if "return_log_probs" in given and bool(given["return_log_probs"].reshape(-1)[0]):
            outputs += ["cum_log_probs", "output_log_probs"]
        if "num_return_sequences" in given:
            outputs.append("sequence_index")
        return pb_utils.InferenceRequest(model_name="tensorrt_llm", inputs=tensors, requested_output_names=outputs,
                                         request_id=request_id)

    async def _row(self, row, rows, base_id, given, prepared, streaming, sender, finals):
        request_id = base_id if rows == 1 else f"{base_id}/{row}"
        texts = {}  # sequence index -> IncrementalText
        stream = await self._llm_request(row, rows, request_id, given, prepared).async_exec(decoupled=True)
        async for response in self._responses(stream):
            if sender.is_cancelled():
                await self._stop(request_id)
                return
            if response.has_error():
                raise ValueError(_client_names(response.error().message()))
            ids_tensor = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids_tensor is None:  # the empty final response
                continue
            ids = ids_tensor.as_numpy()  # [1, beams, n]
            lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy().reshape(-1)
            seq = pb_utils.get_output_tensor_by_name(response, "sequence_index")
            seq = 0 if seq is None else int(seq.as_numpy().reshape(-1)[0])
            beams = ids.shape[1]
            if streaming and beams == 1:
                text = texts.setdefault(seq, IncrementalText(self.tokenizer, self.skip_special_tokens))
                delta = text.push(ids[0, 0, : int(lengths[0])])
                if delta:
                    sender.send(self._response([delta], row, seq, response))
            else:
                whole = [self.tokenizer.decode(ids[0, b, : int(lengths[b])].tolist(),
                                               skip_special_tokens=self.skip_special_tokens) for b in range(beams)]
                out = self._response(whole, row, seq, response)
                if streaming:
                    sender.send(out)
                else:
                    finals.append(out)
        for seq, text in texts.items():  # the held-back end of each sequence (also after an end-token response)
            rest = text.finish()
            if rest:
                sender.send(self._response([rest], row, seq, None))

    async def _responses(self, iterator):
        """The responses of a BLS ``ResponseIterator``, each ``next`` on :attr:`pool`."""
        loop = asyncio.get_running_loop()
        end = object()
        while True:
            response = await loop.run_in_executor(self.pool, next, iterator, end)
            if response is end:
                return
            yield response

    @staticmethod
    def _response(texts, row, seq, llm_response):
        tensors = [
            pb_utils.Tensor("text_output", _bytes(texts)),
            pb_utils.Tensor("batch_index", np.array([[row]], dtype=np.int32)),
            pb_utils.Tensor("sequence_index", np.array([[seq]], dtype=np.int32)),
        ]
        if llm_response is not None:
            for name in ("cum_log_probs", "output_log_probs"):
                tensor = pb_utils.get_output_tensor_by_name(llm_response, name)
                if tensor is not None:
                    tensors.append(pb_utils.Tensor(name, tensor.as_numpy()))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    async def _stop(self, request_id):
        """TensorRT-LLM's stop signal for ``request_id`` (a request with that id and ``stop=true``)."""
        stop = pb_utils.InferenceRequest(
            model_name="tensorrt_llm",
            inputs=[pb_utils.Tensor("input_lengths", np.array([[1]], np.int32)),
                    pb_utils.Tensor("request_output_len", np.array([[1]], np.int32)),
                    pb_utils.Tensor("stop", np.array([[True]], bool))],
            requested_output_names=["output_ids"],
            request_id=request_id,
        )
        async for _ in self._responses(await stop.async_exec(decoupled=True)):
            pass

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
