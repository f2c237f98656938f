"""`preprocessing` model (Triton Python backend): the prompt's token ids, and stop/bad word lists.

Inputs (per request, batch dimension first; tensor names of TensorRT-LLM 1.1.0's
inflight_batcher_llm preprocessing, text subset, plus INPUT_IDS):
    QUERY               BYTES [b, 1]   prompt text, UTF-8; tokenized here (optional)
    INPUT_IDS           INT32 [b, n]   prompt token ids tokenized by the client (optional; exactly one
                                       of QUERY and INPUT_IDS is given)
    REQUEST_OUTPUT_LEN  INT32 [b, 1]   tokens to generate (passed through)
    BAD_WORDS_DICT      BYTES [b, n]   optional; strings never to generate
    STOP_WORDS_DICT     BYTES [b, n]   optional; strings that end generation
    END_ID / PAD_ID     INT32 [b, 1]   optional; default from the tokenizer (eos / pad, else eos)
Outputs:
    INPUT_ID            INT32 [b, L]   prompt token ids (right-padded with pad id when b > 1)
    REQUEST_INPUT_LEN   INT32 [b, 1]   unpadded prompt length in tokens
    REQUEST_OUTPUT_LEN  INT32 [b, 1]
    BAD_WORDS_IDS / STOP_WORDS_IDS INT32 [b, 2, W]  TensorRT-LLM word lists: row 0 the words'
                        token ids concatenated (padded with 0), row 1 the cumulative end offset of
                        each word (padded with -1); W >= 1.
    OUT_END_ID / OUT_PAD_ID INT32 [b, 1]
Parameters: tokenizer_dir (path), add_special_tokens ("true"/"false", for QUERY only: INPUT_IDS are
used exactly as given).

This model only tokenizes, so its process keeps torch from being imported: installed torch is hidden from
transformers (a None entry in ``sys.modules``, for which ``importlib.util.find_spec("torch")`` returns None, read as
"not installed" by ``is_torch_available()`` of transformers 5 and of the image's 4.57.1). Otherwise transformers 5
imports torch with its configuration modules and 4.57.1 when AutoTokenizer loads. Measured on the 2-core development
machine (scripts/serve, the stub's CPU time and RSS once ready): 3.1 CPU-s and 122 MB per instance, against 7.5 CPU-s
and 361 MB with torch imported. transformers' advice that models are unavailable without torch is true of this
process and is not logged.
"""

import json
import logging
import sys


class _NoModelsAdvice(logging.Filter):
    """Drops transformers' import-time advice that, without torch, models are unavailable (both majors' text)."""

    def filter(self, record):
        return "Models won't be available" not in record.getMessage()


sys.modules.setdefault("torch", None)
logging.getLogger("transformers").addFilter(_NoModelsAdvice())

import numpy as np  # noqa: E402 - after torch is hidden
import triton_python_backend_utils as pb_utils  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _parse_bool(name, value):
    value = str(value).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"parameter {name}={value!r} must be true or false")


def to_word_list(tokenizer, rows):
    """Encode ``rows`` (one list of strings per batch item) into an INT32 [b, 2, W] word list."""
    flat, offsets = [], []
    for words in rows:
        ids, ends = [], []
        for word in words:
            if not word:
                continue
            encoded = tokenizer.encode(word, add_special_tokens=False)
            if not encoded:
                continue
            ids.extend(encoded)
            ends.append(len(ids))
        flat.append(ids)
        offsets.append(ends)
    width = max(1, max((len(x) for x in flat), default=0))
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (ids, ends) in enumerate(zip(flat, offsets)):
        out[i, 0, : len(ids)] = ids
        out[i, 1, : len(ends)] = ends
    return out


def prompt_ids(tokenizer, queries, input_ids, add_special_tokens, vocab_size):
    """The prompt token ids of each batch item: ``input_ids`` rows as given, else ``queries`` tokenized.

    Args:
        queries: one prompt string per batch item, or None.
        input_ids: INT32 array [b, n] of client-tokenized prompts, or None.
        vocab_size: ids must lie in [0, vocab_size).

    Raises:
        ValueError: both or neither given, an empty prompt, or an id outside the vocabulary.
    """
    if (queries is None) == (input_ids is None):
        raise ValueError("give exactly one of text_input (text to tokenize) and input_ids (token ids)")
    if input_ids is not None:
        rows = [[int(t) for t in row] for row in np.asarray(input_ids).reshape(np.asarray(input_ids).shape[0], -1)]
        for row in rows:
            bad = [t for t in row if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"input_ids must be token ids in [0, {vocab_size}); got {bad[:5]}")
    else:
        rows = [tokenizer.encode(q, add_special_tokens=add_special_tokens) for q in queries]
    if any(len(ids) == 0 for ids in rows):
        raise ValueError("the prompt has zero tokens; send a non-empty text_input or input_ids")
    return rows


class TritonPythonModel:
    """Tokenizer step of the ensemble (see the module docstring for tensors)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"], local_files_only=True)
        self.add_special_tokens = _parse_bool("add_special_tokens", params.get("add_special_tokens", "true"))
        tok = self.tokenizer
        self.vocab_size = len(tok)
        self.default_end_id = tok.eos_token_id if tok.eos_token_id is not None else 0
        self.default_pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.default_end_id

    @staticmethod
    def _strings(request, name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        array = tensor.as_numpy()
        return [[s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in row] for row in array.reshape(array.shape[0], -1)]

    @staticmethod
    def _ints(request, name, batch, default):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return np.full((batch, 1), default, dtype=np.int32)
        return tensor.as_numpy().reshape(batch, 1).astype(np.int32)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as exc:  # one bad request never fails the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
        return responses

    def _one(self, request):
        query_rows = self._strings(request, "QUERY")
        ids_tensor = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS")
        encoded = prompt_ids(
            self.tokenizer,
            None if query_rows is None else [row[0] for row in query_rows],
            None if ids_tensor is None else ids_tensor.as_numpy(),
            self.add_special_tokens,
            self.vocab_size,
        )
        batch = len(encoded)
        end_id = self._ints(request, "END_ID", batch, self.default_end_id)
        pad_id = self._ints(request, "PAD_ID", batch, self.default_pad_id)
        width = max(len(ids) for ids in encoded)
        input_ids = np.empty((batch, width), dtype=np.int32)
        for i, ids in enumerate(encoded):
            input_ids[i, :] = pad_id[i, 0]
            input_ids[i, : len(ids)] = ids
        input_len = np.array([[len(ids)] for ids in encoded], dtype=np.int32)
        output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy().reshape(batch, 1)
        bad_words = self._strings(request, "BAD_WORDS_DICT") or [[] for _ in range(batch)]
        stop_words = self._strings(request, "STOP_WORDS_DICT") or [[] for _ in range(batch)]
        tensors = [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", input_len),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.astype(np.int32)),
            pb_utils.Tensor("BAD_WORDS_IDS", to_word_list(self.tokenizer, bad_words)),
            pb_utils.Tensor("STOP_WORDS_IDS", to_word_list(self.tokenizer, stop_words)),
            pb_utils.Tensor("OUT_END_ID", end_id),
            pb_utils.Tensor("OUT_PAD_ID", pad_id),
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)
