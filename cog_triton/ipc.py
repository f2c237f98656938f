"""The channel between the Cog worker and a stream process: typed messages in length-prefixed pickle frames.

One ``socketpair`` per stream process. A frame is a 4-byte little-endian length and that many bytes
of a pickle (protocol 5). Both ends are our own processes, started from the same interpreter, so
pickle carries our exception objects and dataclasses as they are.

Every message is a ``typing.NamedTuple``: named fields at both ends, and, being a tuple, cheap to
build and to pickle. Text, the only message sent per chunk, travels as ``(sid, text)`` pairs in a
:class:`Frame`'s ``texts`` list, so that pickle takes its fast path for plain tuples; the other events
(a few per prediction) are typed. Measured with ``timeit`` on the 2-core development machine (other work
running), one frame of 40 text chunks: the positional tuples used before, ``[(sid, TEXT, text), ...]``,
pickled in 1.4 µs and loaded in 1.7 µs (1,366 bytes); a :class:`Frame` of 40 pairs pickles in 2.5 µs and
loads in 2.3 µs (1,313 bytes); a frame of one chunk 1.1 and 0.9 µs (was 0.2 and 0.1): about 1 µs more per
frame, for the Frame itself, not per chunk. Forty NamedTuple text events instead would have cost 21 µs to
pickle and 8 µs to load (a ``__slots__`` class with ``__reduce__``: 11 and 6), each event taking pickle's
slow path. Serialization is not what limits this path (``marshal`` was no faster and carries no exceptions).

Commands, worker -> stream process (one per frame):

* :class:`Config` once, first: what :mod:`cog_triton.streaming.streamer` builds its generator from.
* :class:`Start`: prepare and stream a prediction's inputs.
* :class:`Cancel`: stop a stream (and tell Triton to stop the request when ``send_stop_request``).
* :class:`StopRequest`: send Triton the stop request of a request another stream process left behind.
* :class:`Reconnect`: Triton was restarted: use a new gRPC channel from the next request on.

Events, stream process -> worker: one :class:`Frame` per turn of the process's event loop, holding many
streams' text (``texts``) and events (``events``). The worker handles a frame's texts before its events:
a stream's :class:`End` or :class:`Failed` is its last message, so its text, in this frame or an earlier
one, is always queued before its end.

* :class:`Ready` once: the process has loaded its tokenizer (or could not: ``error``), with what its chat template says
  about reasoning (the worker maps each prediction's reasoning inputs onto it).
* :class:`Accepted` / :class:`Rejected`: the prediction was prepared and sent to Triton, or refused (an
  input error, which predict() raises).
* :class:`ImageCounts`: a prediction with images: how many, and its prompt's and the images' tokens as the
  engine made them (once, with its first response).
* :class:`FirstToken`: time from the prediction's start to its first token.
* :class:`End` / :class:`Failed`: the stream ended normally (finished or cut by a stop sequence), or failed, with its
  token counts (for a model that thinks, the thinking's among them).
* :class:`Cancelled`: a :class:`Cancel` stopped the stream after ``output_tokens`` tokens (the worker has
  forgotten the stream by then; it only counts them, :mod:`cog_triton.worker.exporter`).
* :class:`Stats`: LoRA adapter counts since the last report; after a request with an adapter, never per token.
* :class:`Timings`: when the prediction's start passed through the process (only with COG_TRITON_TIMING_METRICS).
"""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass, field, make_dataclass
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional, Union

from cog_triton.fetch.adapter_refs import AdapterRef
from cog_triton.reasoning import TemplateInfo
from cog_triton.schema import InputSpec, input_specs

if TYPE_CHECKING:
    from cog_triton.stream_config import GeneratorConfig

# ------------------------------------------------------------------ what a Start carries

#: The guide types the backend maps (utils.cc getGuidedDecodingParamsFromTensors, @c8c6df08 and @19290813).
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
#: response_format choices (OpenAI's response_format.type names; json_schema has its own input).
RESPONSE_FORMATS = ("text", "json_object")


@dataclass(frozen=True)
class Guide:
    """One prediction's guide.

    Attributes:
        guide_type: one of :data:`GUIDE_TYPES` (what ``guided_decoding_guide_type`` carries).
        guide: the schema / regex / grammar text; ``""`` for ``json`` (any JSON), which needs none.
        source: the input that set it ("json_schema", "response_format", "regex" or "grammar").
    """

    guide_type: str
    guide: str
    source: str

    @property
    def document(self) -> str:
        """What a complete output is, in words (for error messages)."""
        return {
            "json": "JSON document",
            "json_schema": "JSON document",
            "regex": "match of the regex",
            "ebnf_grammar": "sentence of the grammar",
        }[self.guide_type]


class _PredictInputsMethods:
    """What :class:`PredictInputs` does besides carrying the inputs (its base class)."""

    __slots__ = ()
    messages: Optional[list[dict[str, Any]]]
    temperature: float
    top_p: float
    top_k: int

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy: temperature 0, top_k 1 or top_p 0."""
        return self.temperature == 0.0 or self.top_k == 1 or self.top_p == 0.0

    @property
    def image_count(self) -> int:
        """Images the prediction carries: ``image_input``'s files and the image parts of ``messages`` (a message's
        content is text, or a list of ``{"type": "text", "text"}`` and ``{"type": "image", "url"}`` parts)."""
        count = len(getattr(self, "image_input", ()) or ())
        for message in self.messages or ():
            content = message.get("content")
            if isinstance(content, list):
                count += sum(1 for part in content if part.get("type") == "image")
        return count


#: The Python type of each JSON Schema type of a Cog input.
_SCHEMA_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}

#: Inputs whose validated value another field carries, so they have no field of their own: replicate/cog-triton's
#: deprecated aliases are folded into ``max_tokens``/``min_tokens``, the structured-output inputs into ``guide``,
#: ``lora_weights`` into ``lora`` (:func:`cog_triton.worker.inputs.validate_inputs`).
FOLDED_INPUTS: dict[str, str] = {
    "max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
    "json_schema": "guide", "response_format": "guide", "regex": "guide", "grammar": "guide",
    "lora_weights": "lora",
}

#: Inputs carried in another type than the schema's (name -> (type, default or field)): what validation parses them
#: into.
CARRIED_AS: dict[str, tuple[Any, Any]] = {
    # a JSON array of {"role", "content"} objects -> the list (None: no conversation, the prompt is used)
    "messages": (Optional[list[dict[str, Any]]], None),
    # "" (the chat template) -> None
    "prompt_template": (Optional[str], None),
    # comma-separated or a JSON array -> the list
    "stop_sequences": (list[str], field(default_factory=list)),
    # none given -> one drawn (``seed_given`` says which)
    "seed": (int, 0),
    # a JSON object -> the dict
    "chat_template_kwargs": (dict[str, Any], field(default_factory=dict)),
    # the files Cog received -> their paths (read and checked in the stream process)
    "image_input": (tuple[str, ...], ()),
}

#: Fields that are no input: what validation derives from the inputs (name, type, default).
DERIVED_FIELDS: tuple[tuple[str, Any, Any], ...] = (
    ("seed_given", bool, True),
    ("guide", Optional[Guide], None),
    ("lora", Optional[AdapterRef], None),
    # reasoning_effort and chat_template_kwargs resolved against the model's chat template (the service, in the
    # worker: cog_triton.reasoning.resolve): the template's keyword arguments, the level applied and its log note
    ("template_kwargs", dict[str, Any], field(default_factory=dict)),
    ("reasoning_applied", str, ""),
    ("reasoning_note", str, ""),
)


def predict_inputs_fields(specs: Mapping[str, InputSpec]) -> list[tuple[str, Any, Any]]:
    """The fields of :class:`PredictInputs` for the inputs ``specs`` declares, in declaration order: one per input
    (less :data:`FOLDED_INPUTS`), typed as the schema types it (or as :data:`CARRIED_AS` says) and defaulting to
    its schema default, then :data:`DERIVED_FIELDS`.

    Raises:
        ValueError: an input's schema type has no Python type here (a new kind of input needs one).
    """
    fields: list[tuple[str, Any, Any]] = []
    for name, spec in specs.items():
        if name in FOLDED_INPUTS:
            continue
        if name in CARRIED_AS:
            fields.append((name, *CARRIED_AS[name]))
            continue
        if spec.type not in _SCHEMA_TYPES:
            raise ValueError(f"input {name} has schema type {spec.type!r}, which PredictInputs cannot carry")
        kind = Optional[_SCHEMA_TYPES[spec.type]] if spec.nullable else _SCHEMA_TYPES[spec.type]
        default = float(spec.default) if spec.type == "number" and spec.default is not None else spec.default
        fields.append((name, kind, default))
    return fields + list(DERIVED_FIELDS)


def predict_inputs_class(specs: Mapping[str, InputSpec]) -> type:
    """A frozen dataclass with :func:`predict_inputs_fields` ``(specs)`` and :class:`_PredictInputsMethods`."""
    return make_dataclass(
        "PredictInputs", predict_inputs_fields(specs), bases=(_PredictInputsMethods,), frozen=True,
        namespace={"__module__": __name__, "__doc__": _PREDICT_INPUTS_DOC},
    )


_PREDICT_INPUTS_DOC = """Validated prediction inputs (made by :func:`cog_triton.worker.inputs.validate_inputs` in the
Cog worker, carried to a stream process by :class:`Start`).

Made from the committed Cog schema (:mod:`cog_triton.schema`, generated from predict.py's ``Input(...)`` list): one
field per input, with its schema default, less the inputs another field carries (:data:`FOLDED_INPUTS`), typed as
validation leaves them (:data:`CARRIED_AS`), then the fields derived from several inputs (:data:`DERIVED_FIELDS`).
So an input declared in predict.py is a field here without code, and the stream process reads it by its name.

Token counts are in tokens; ``seed`` is the user's, or one drawn when the user gave none (``seed_given``
False): the engine uses it unless its sampler takes no seed (TensorRT-LLM 1.2.1's TorchSampler: then a drawn
seed is not sent, and a given one is refused unless decoding is greedy; tensorrtllm_backend.samplers).
The inputs of replicate/cog-triton's predictor are resolved here: ``max_new_tokens`` and
``min_new_tokens`` are folded into ``max_tokens``/``min_tokens``, and ``-1`` ("off") for ``top_k``
and ``min_tokens`` is stored as 0. ``length_penalty`` is sent to the engine (``len_penalty``).
"""

#: The validated inputs of one prediction (see :func:`predict_inputs_class`); pickled by name, so both processes
#: build it from the same committed schema.
PredictInputs = predict_inputs_class(input_specs())


HEADER = struct.Struct("<I")
#: Largest frame accepted, bytes (a Start carries at most a few MB of inputs).
MAX_FRAME_BYTES = 256 << 20


# ------------------------------------------------------------------ commands (worker -> stream process)
class Config(NamedTuple):
    """What the stream process builds its :class:`cog_triton.streaming.generation.Generator` from; the first command."""

    generator: "GeneratorConfig"
    #: The stream interval, milliseconds (COG_TRITON_STREAM_INTERVAL_MS).
    stream_interval_ms: int
    #: Report when each phase of a prediction's start happened (:class:`Timings`; COG_TRITON_TIMING_METRICS).
    timing: bool = False
    #: The stream interval under load (:class:`cog_triton.streaming.coalesce.StreamLoad`): its longest, milliseconds,
    #: and the running streams of this process the base interval serves (0: it never grows).
    stream_interval_max_ms: int = 0
    stream_interval_streams: float = 0.0


def answer_request_id(request_id: str) -> str:
    """The Triton request id of the answer request of prediction ``request_id`` whose thinking its budget ended
    (:mod:`cog_triton.streaming.thinking_generation`): known to both processes, so that the worker can stop it when
    the stream process that sent it dies."""
    return f"{request_id}-answer"


class Start(NamedTuple):
    """Prepare and stream ``inputs`` as stream ``sid``; ``started_at`` is the worker's ``time.monotonic()`` when
    the prediction began (the clock is the same in every process of the host)."""

    sid: int
    request_id: str
    inputs: "PredictInputs"
    started_at: float


class Cancel(NamedTuple):
    """Stop stream ``sid``; ``send_stop_request``: also tell Triton to stop its request (False: Triton is being restarted)."""

    sid: int
    send_stop_request: bool


class StopRequest(NamedTuple):
    """Tell Triton to stop ``request_id``, a request another stream process left behind."""

    request_id: str


class Reconnect(NamedTuple):
    """Triton was restarted: use a new gRPC channel from the next request on."""


Command = Union[Config, Start, Cancel, StopRequest, Reconnect]


# -------------------------------------------------------------------- events (stream process -> worker)
class Ready(NamedTuple):
    """The process is ready (``load_s``: seconds to load its tokenizer), or could not start (``error``); ``template``:
    what its tokenizer's chat template says about reasoning (the worker maps each prediction's reasoning inputs onto
    it: :func:`cog_triton.reasoning.resolve`)."""

    pid: int
    load_s: float = 0.0
    error: str = ""
    template: Optional[TemplateInfo] = None


class Accepted(NamedTuple):
    """Stream ``sid`` was prepared and sent to Triton; its prompt is ``prompt_tokens`` tokens (None for a prediction
    with images: the engine reports its length, :class:`ImageCounts`)."""

    sid: int
    prompt_tokens: Optional[int]


class ImageCounts(NamedTuple):
    """Stream ``sid`` carries ``images`` images; the engine made its prompt ``prompt_tokens`` tokens, of which the
    images fill ``image_tokens`` (sent once, with its first response)."""

    sid: int
    images: int
    prompt_tokens: int
    image_tokens: int


class Rejected(NamedTuple):
    """Preparing stream ``sid`` failed with ``error`` (an input error): predict() raises it."""

    sid: int
    error: BaseException


class FirstToken(NamedTuple):
    """Stream ``sid``'s first token came ``seconds`` after :attr:`Start.started_at`."""

    sid: int
    seconds: float


class End(NamedTuple):
    """Stream ``sid`` ended normally after ``output_tokens`` tokens (finished, or cut by a stop sequence), the first
    ``reasoning_tokens`` of them its thinking (:mod:`cog_triton.streaming.thinking`; 0 for a model that does not
    think); ``thinking_budget_reached``: whether its thinking budget ended the thinking (None: it had no budget)."""

    sid: int
    output_tokens: int
    reasoning_tokens: int = 0
    thinking_budget_reached: Optional[bool] = None


class Failed(NamedTuple):
    """Stream ``sid`` failed with ``error`` after ``output_tokens`` tokens (``reasoning_tokens`` of thinking)."""

    sid: int
    error: BaseException
    output_tokens: int
    reasoning_tokens: int = 0


class Cancelled(NamedTuple):
    """A :class:`Cancel` stopped stream ``sid`` after ``output_tokens`` tokens (``reasoning_tokens`` of thinking)."""

    sid: int
    output_tokens: int
    reasoning_tokens: int = 0


class Stats(NamedTuple):
    """LoRA adapter counts since the last report (``{name: increment}``,
    :meth:`cog_triton.streaming.lora.tasks.Adapters.take_counts`)."""

    counts: dict[str, int]


class Timings(NamedTuple):
    """When stream ``sid``'s start passed through its stream process (``time.monotonic()``, the host's clock):
    its Start read, its prompt prepared (and the request sent to Triton), its first text handed to the frame.
    Sent once, with the first text, only when :attr:`Config.timing` is on."""

    sid: int
    received_at: float
    prepared_at: float
    first_text_at: float


Event = Union[Ready, Accepted, ImageCounts, Rejected, FirstToken, End, Failed, Cancelled, Stats, Timings]


class Frame(NamedTuple):
    """What one turn of a stream process's loop sends: text chunks (``(sid, text)`` pairs, in order) and events
    (in order). The worker handles the texts first (see the module docstring)."""

    texts: list[tuple[int, str]]
    events: list[Event]


def encode(message: Union[Command, Frame]) -> bytes:
    """One frame: header + pickle of ``message``."""
    data = pickle.dumps(message, protocol=5)
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> Any:
    """The message of a frame's body (what :func:`encode` pickled)."""
    return pickle.loads(data)


class FrameReader:
    """Blocking reader of frames from a socket (for a thread).

    Raises (from :meth:`read`):
        EOFError: the other end closed the socket (or the process died).
        ValueError: a frame over :data:`MAX_FRAME_BYTES`.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb", buffering=1 << 16)

    def read(self) -> Any:
        """The next message (a :class:`Frame` from a stream process)."""
        header = self._file.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError("the stream process closed its channel")
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {length} bytes (at most {MAX_FRAME_BYTES})")
        data = self._file.read(length)
        if len(data) < length:
            raise EOFError("the stream process closed its channel inside a frame")
        return decode(data)

    def close(self) -> None:
        self._file.close()


__all__ = (
    "Accepted", "Cancel", "Cancelled", "Command", "Config", "End", "Event", "Failed", "FirstToken", "Frame",
    "ImageCounts",
    "FrameReader", "HEADER", "MAX_FRAME_BYTES", "Ready", "Reconnect", "Rejected", "Start", "Stats", "StopRequest",
    "answer_request_id", "decode", "encode",
)
