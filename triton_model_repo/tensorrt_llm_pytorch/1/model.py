"""The ``tensorrt_llm`` model over TensorRT-LLM's PyTorch backend (Triton Python backend, decoupled).

It serves a Hugging Face checkpoint with the LLM API (``tensorrt_llm.LLM``, TensorRT-LLM 1.2.1) behind the
same tensors as the C++ ``tensorrtllm`` backend's model (``../config.pbtxt``; ``translate.py`` maps them), so
the ensemble, the predictor and the tests see one contract for both backends. The LLM's arguments are the
JSON object in ``llm_args.json`` beside this file (written by the renderer,
``tensorrtllm_backend/templates.py``), passed through ``update_llm_args_with_extra_dict`` as upstream's
Triton ``llmapi`` model passes its ``model.yaml``.

How the LLM is hosted follows upstream's ``llmapi`` model (NVIDIA/TensorRT-LLM
``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py`` @b35ac1b6, the 1.2.0rc2 tree; the same shape
@044a90d2): an event-loop thread builds ``LLM(**args)`` and runs one coroutine per request that calls
``generate_async`` and iterates its result (the result's queue is bound to the loop it was made on:
``executor/result.py`` @a678b91a); a response thread calls ``response_sender.send``; cancellation is checked
every ``cancellation_check_period_ms`` (default 100, upstream's); a failed ``LLM(...)`` fails ``initialize``
with its error (passed back from the loop thread); ``finalize`` drains and shuts the LLM down.

Several GPUs (tensor or pipeline parallelism): one ``tritonserver`` serves, and the LLM spawns its own worker
processes for ``tensor_parallel_size`` x ``pipeline_parallel_size`` ranks (``MpiPoolSession`` when its process is
not one of several MPI ranks: ``llmapi/llm.py`` @4c05a748 ``BaseLLM.__init__``), which is how the ``llmapi``
model's docs launch it (tensorrtllm_backend ``docs/llmapi.md`` @08ed112e: ``launch_triton_server.py
--model_repo=...``, i.e. ``mpirun -n 1 tritonserver``; one server per rank under ``srun`` is only for several
nodes). As upstream's later model does (@044a90d2, at import), the per-rank MPI variables a ``tritonserver``
started under ``mpirun`` passes down (:data:`INHERITED_MPI_VARIABLES`, :data:`INHERITED_MPI_PREFIXES`) are
removed from this process before ``tensorrt_llm`` is imported, so that its MPI starts afresh and spawns the
workers. Unlike that model:

* ``streaming`` is passed to ``generate_async`` as a keyword: upstream passes it third, positionally, where
  the signature has ``lora_request`` (``llmapi/llm.py`` @4c05a748), so its requests never stream (fixed
  upstream after 1.2.1, PR #14079);
* the request's token ids go in (``generate_async(list[int], ...)``, ``prompt_inputs``) and each response
  carries the new ids (``CompletionOutput.token_ids_diff``) as ``output_ids``, not text;
* every send and every ``is_cancelled()`` of a request happen on the response thread: upstream's
  cancellation thread sends a CANCELLED error while the response thread may be sending that request's
  final response (in the Python backend the final response frees the sender's state: python_backend
  ``src/python_be.cc`` ``ResponseSendDecoupled``; racing it crashed Triton 2.51 in this project's benchmark,
  see benchmarks/standin);
* a ``finalize`` that never waits without a bound (upstream waits for every ongoing request, polling each second);
* every stopped or cancelled request ends within one cancellation period of its abort: TensorRT-LLM 1.2.1
  drops an aborted request that is still waiting for a batch slot without any response
  (``_torch/pyexecutor/executor_request_queue.py`` @007a7508 ``update_waiting_queue``; ``py_executor.py``
  ``_handle_canceled_requests`` finishes active requests only; ``executor/base_worker.py`` @7b437aaa
  ``abort_request`` sends nothing), so its ``async for`` would never end; the model then ends it itself
  (:meth:`TritonPythonModel._end_unanswered`), with the final response a stopped request gets;
* a sampling input the LLM's sampler would ignore is refused (``translate.py``, ``samplers.py``), and the
  log-probabilities returned are always the generated tokens' (a response whose log-prob is keyed by another
  token fails the request);
* a known ``lora_task_id`` sent with a folder that holds another adapter is refused (the LLM API would serve the
  adapter cached under the id);
* images: an image request (``text_input`` with ``image_bytes``, ``translate.py``) is given to the LLM as a text
  prompt with ``multi_modal_data`` (TensorRT-LLM 1.2.1 takes images only so); its images are decoded in a worker
  thread, off the event loop; its stop words are matched over the prompt ids the LLM's input processor made
  (``RequestOutput.prompt_token_ids``); and each of its responses carries ``prompt_tokens`` and ``image_tokens``
  (the prompt's ids holding the checkpoint's image token, ``image_token_index`` / ``image_token_id`` of its
  config.json, or an id past the vocabulary, where TensorRT-LLM's input processors put the image's positions for
  some models). The model's ``images`` parameter says whether it serves images; when it does not, they are
  refused (a text-only checkpoint's default input processor would drop them: ``inputs/registry.py``).

What a client sees, as from the C++ backend (the conformance tests run each against both models:
tests/test_conformance.py):

* streaming: each response carries only the new ids, the prompt never; the end token is never returned, and
  a request that ends on it gets a last response with no ids (the PyTorch sampler adds the end token to the
  request's tokens before it checks it, ``_torch/pyexecutor/sampler.py`` @28edbcdb, so the model drops it);
  non-streaming: one response, prompt + generated unless ``exclude_input_in_output``;
* ``stop`` (a request with the same request id and ``stop=true``): the latest request with that id is aborted
  (``RequestOutput.abort()``) and ends with a normal final response; the stop request gets one empty
  successful final response, a request without an id an error (the C++ texts; upstream's ``llmapi`` model
  answers a CANCELLED error instead);
* Triton's cancellation (the client closed the stream) aborts the generation;
* the C++ backend's validation texts (``parsing.py``), stop words over prompt + output, the guide checks
  ("GuidedDecoder is not setup" when the LLM has no ``guided_decoding_backend``), the requested-outputs check.

Where the PyTorch backend differs and the model shows it as it is (marked so in the conformance tests): the
prompt limits and the ``max_seq_len`` reduction are the LLM's (its texts: ``llmapi/llm.py`` ``_check_arguments``,
``executor/base_worker.py`` ``_deduce_max_tokens``); there is no queue limit (``TorchLlmArgs`` has no
``max_queue_size``); LoRA adapters come as folders (``lora_path``), not converted tensors.

Modules beside this file: ``translate.py`` (tensors -> LLM request), ``parsing.py`` and ``lora.py`` (links to
the CPU reference model's, whose checks and texts ``translate.py`` reuses), ``triton_glue.py`` (a link to the
reference model's too: parameters, input tensors, responses, errors and logging, as the two models share them),
``samplers.py`` (a link to ``tensorrtllm_backend/samplers.py``: what each sampler applies). Triton loads this file
by its path, so it loads ``triton_glue.py`` by its path as well, which makes the folder the package
:data:`PACKAGE` to import the others.

Why one module (about 770 lines): one concern, hosting the LLM in Triton's Python backend: the three threads,
a request's life from ``execute`` to its final response, and the responses; the request's meaning is
``translate.py``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import itertools
import json
import os
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

#: Per-rank variables of an ``mpirun``-started process that a Triton Python backend stub inherits, removed before
#: ``tensorrt_llm`` starts MPI here (upstream llmapi model.py @044a90d2, at import; not in 1.2.1's model): MPI then
#: starts as a singleton and the LLM spawns its workers. Configuration variables (``OMPI_MCA_*`` other than
#: ``orte_``, ``PMIX_MCA_*``) are kept.
INHERITED_MPI_VARIABLES = (
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_APP_CTX_NUM_PROCS",
    "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21", "PMIX_SERVER_URI3",
    "PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR", "PMIX_SECURITY_MODE", "PMIX_GDS_MODULE", "PMIX_BFROPS_MODULE",
    "PMIX_PTL_MODULE", "PMIX_VERSION", "PMIX_HOSTNAME",
    "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_SPAWNED", "PMI_APPNUM",
)
INHERITED_MPI_PREFIXES = ("OMPI_MCA_orte_", "ORTE_")


def clear_inherited_mpi_environment(environ: "os._Environ[str] | Dict[str, str]" = os.environ) -> List[str]:
    """Remove :data:`INHERITED_MPI_VARIABLES` and variables starting with :data:`INHERITED_MPI_PREFIXES` from
    ``environ``; return the names removed (sorted)."""
    names = sorted(name for name in list(environ)
                   if name in INHERITED_MPI_VARIABLES or name.startswith(INHERITED_MPI_PREFIXES))
    for name in names:
        del environ[name]
    return names


_CLEARED_MPI_VARIABLES = clear_inherited_mpi_environment()

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton
    pb_utils = None

#: The package this folder's modules are imported as.
PACKAGE = "tensorrt_llm_pytorch"
#: How this model's log lines begin.
LOG_TAG = "tensorrt_llm pytorch"
#: The file the renderer writes the LLM's arguments to, beside this one.
LLM_ARGS_FILE = "llm_args.json"
#: upstream llmapi model.py: cancellation_check_period_ms defaults to 100 (ms).
DEFAULT_CANCELLATION_CHECK_PERIOD_MS = 100.0
#: How long finalize waits for aborted requests' last responses, seconds.
FINALIZE_DRAIN_S = 10.0


# Triton loads this file by its path: the glue beside it is loaded so too, then makes this folder the package PACKAGE.
_glue_file = Path(__file__).resolve().parent / "triton_glue.py"
_glue_spec = importlib.util.spec_from_file_location(f"{PACKAGE}.triton_glue", _glue_file)
glue = importlib.util.module_from_spec(_glue_spec)
_glue_spec.loader.exec_module(glue)
_package = glue.sibling_package(PACKAGE, __file__)
_translate = importlib.import_module(f"{_package}.translate")
_parsing = importlib.import_module(f"{_package}.parsing")
_samplers = importlib.import_module(f"{_package}.samplers")

RequestError = _parsing.RequestError
Submission = _translate.Submission
to_submission = _translate.to_submission
is_stop_request = _parsing.is_stop_request
stop_word_end = _translate.stop_word_end


error_response = glue.error_response
token_response = glue.token_response


# ------------------------------------------------------------------------------------------------
# A request's life, and what its threads pass one another
# ------------------------------------------------------------------------------------------------


def _token_log_prob(entry: Any, token: int) -> float:
    """A generated token's log-probability from one ``CompletionOutput.logprobs`` entry (a float, or the
    PyTorch backend's ``{token_id: Logprob}`` dict, keyed by the tokens the sampler reports).

    Raises:
        RequestError: the entry holds no value for ``token`` (TorchSampler reports the arg-max token's when
            sampling: such requests are refused before, so this means the LLM did something unforeseen).
    """
    if isinstance(entry, dict):
        if token not in entry:
            raise RequestError(f"the LLM reported the log-probability of token(s) {sorted(entry)[:4]}, not of the "
                               f"generated token {token}")
        value = entry[token]
        return float(getattr(value, "logprob", value))
    return float(entry)


@dataclass(eq=False)
class InFlightRequest:
    """A request between ``execute`` and its final response.

    One response thread (of :data:`RESPONSE_THREADS`) makes every ``sender.send`` and ``is_cancelled()`` call of a
    request (upstream's llmapi model asks is_cancelled() from a thread of its own: with Triton 2.51's Python
    backend, calls on one sender from two threads at 128 streams made tritonserver die of SIGSEGV on the GPU
    host); the event loop owns ``output``
    and ``tokens``; ``abort_requested`` may be set from any thread (a stop request, a cancellation)."""

    number: int
    request_id: str
    sender: Any
    submission: Any
    output: Any = None
    tokens: List[int] = field(default_factory=list)
    log_probs: List[float] = field(default_factory=list)
    cum_log_prob: Optional[float] = None
    abort_requested: bool = False
    cancel_seen: bool = False
    final_sent: bool = False
    task: Any = None  # the asyncio task running _generate (event loop)
    final_queued: bool = False  # its final response (or error) is queued (event loop)
    queued: int = 0  # tokens queued for sending so far (event loop)
    counts: Any = None  # an image request's prompt_tokens and image_tokens tensors, sent with each response
    next_at: float = 0.0  # stream_interval_ms: when held tokens may leave (event loop; monotonic seconds)
    answered: bool = False  # a response was sent (the response thread's: first responses go first)


@dataclass(slots=True, eq=False)
class QueuedTokens:
    """Tokens of one response of a request, queued by the event loop for the request's response thread (one item
    per response). The response thread joins the items of a request that wait together into the first of them (an
    item and its lists are that thread's alone once taken from the queue).

    A slotted dataclass: made in half the time of a ``typing.NamedTuple`` (whose ``__new__`` is a Python function)
    and read faster (Python 3.11); queueing and sending one cost what the tuples it replaced did."""

    request: InFlightRequest
    tokens: List[int]
    log_probs: Optional[List[float]]  # None: the request asked for no log-probabilities
    cum_log_prob: Optional[float]
    final: bool


@dataclass(slots=True, eq=False)
class QueuedError:
    """A request's error response, its final one: queued by the event loop (the request failed) or by finalize."""

    request: InFlightRequest
    response: Any


class TritonPythonModel:
    """The PyTorch-backend ``tensorrt_llm`` model (decoupled; see the module docstring).

    Model parameters (string values): ``exclude_input_in_output`` (default false, with the C++ backend's
    warning when absent), ``cancellation_check_period_ms`` (default 100), ``images`` (default false: image requests
    are refused). The LLM's arguments: ``llm_args.json`` beside this file (:meth:`load_llm_args`).
    """

    # -- hooks (a stand-in or a test may override them) ---------------------------------------------
    def load_llm_args(self, params: dict) -> Dict[str, Any]:
        """The LLM's keyword arguments: the JSON object in ``llm_args.json`` beside this file.

        Raises:
            ValueError: the file is missing, not JSON, not an object, or has no ``model``.
        """
        path = Path(__file__).resolve().parent / LLM_ARGS_FILE
        try:
            args = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{path} is missing: the renderer writes the LLM's arguments there "
                             "(tensorrtllm_backend/templates.py RenderOptions.llm_args)") from None
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(args, dict) or not args.get("model"):
            raise ValueError(f"{path} must hold a JSON object with the LLM's arguments, \"model\" among them; "
                             f"got {str(args)[:200]}")
        return args

    def _log(self, level: str, message: str) -> None:
        glue.log(LOG_TAG, level, message)

    # -- Triton API -------------------------------------------------------------------------------
    def initialize(self, args) -> None:
        cfg = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise ValueError("the tensorrt_llm PyTorch-backend model needs model_transaction_policy { decoupled: true }")
        params = cfg.get("parameters", {})
        started = time.monotonic()
        self.serving = False
        self._closing = False
        exclude = glue.param(params, "exclude_input_in_output", None, bool)
        if exclude is None:
            # the C++ backend constructor's wording (model_instance_state.cc)
            self._log("warn", "exclude_input_in_output is not specified, will be set to false")
            exclude = False
        self.exclude_input_in_output = exclude
        period_ms = glue.param(params, "cancellation_check_period_ms", DEFAULT_CANCELLATION_CHECK_PERIOD_MS, float)
        if period_ms <= 0:
            raise ValueError(f"parameter cancellation_check_period_ms must be > 0, got {period_ms}")
        self.cancel_period_s = period_ms / 1e3
        llm_args = self.load_llm_args(params)
        self.guided_decoding = llm_args.get("guided_decoding_backend") is not None
        self.lora_enabled = llm_args.get("lora_config") is not None
        self.vocab_size = self._vocab_size(llm_args)
        self.images = glue.param(params, "images", False, bool)
        self.image_token_id = self._image_token_id(llm_args)
        self.images_off = None if self.images else (
            "its parameter images is false (the predictor serves images only on a checkpoint whose architecture "
            "TensorRT-LLM 1.2.1's PyTorch backend takes them for, with COG_TRITON_IMAGES on)")
        if self.images and self.image_token_id is None:
            raise ValueError("parameter images is true, but the checkpoint's config.json names no image token "
                             "(image_token_index or image_token_id)")
        self.sampler = _samplers.effective_sampler(llm_args)
        if _CLEARED_MPI_VARIABLES:
            self._log("info", f"removed inherited MPI variables before starting the LLM: {', '.join(_CLEARED_MPI_VARIABLES)}")
        # tensorrt_llm is imported only now (upstream's later model defers it so that CUDA_VISIBLE_DEVICES can be set
        # first, @044a90d2), which also lets a test put its stand-in on the path before.
        from tensorrt_llm import SamplingParams  # noqa: PLC0415
        from tensorrt_llm.executor.request import LoRARequest  # noqa: PLC0415
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict  # noqa: PLC0415
        from tensorrt_llm.sampling_params import GuidedDecodingParams  # noqa: PLC0415

        self._api = (SamplingParams, LoRARequest, GuidedDecodingParams)
        self.llm_args = update_llm_args_with_extra_dict({}, llm_args)
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._in_flight: Dict[int, InFlightRequest] = {}
        self._by_request_id: Dict[str, InFlightRequest] = {}  # the latest request with each Triton request id
        self._lora_paths: Dict[int, str] = {}
        # id -> (folder, adapter_digest) of the adapter first served under it; folder -> digest (event loop only)
        self._lora_identity: Dict[int, Tuple[str, Optional[str]]] = {}
        self._lora_digests: Dict[str, Optional[str]] = {}
        # One queue and thread per partition of the requests (request number % RESPONSE_THREADS): each request's
        # sends and is_cancelled() calls stay on one thread, in order.
        self._queues: List["queue.SimpleQueue[Any]"] = [queue.SimpleQueue() for _ in range(RESPONSE_THREADS)]
        self._closing = False
        # Set before the LLM starts its threads (see GIL_SWITCH_INTERVAL_S); finalize() puts the previous one back.
        self._previous_switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        try:
            self.llm = self._start_engine()
        except BaseException:
            sys.setswitchinterval(self._previous_switch_interval)  # a failed load leaves the process as it was
            raise
        self._response_threads = [
            threading.Thread(target=self._response_loop, args=(i,), name=f"trtllm-pytorch-responses-{i}", daemon=True)
            for i in range(RESPONSE_THREADS)
        ]
        for thread in self._response_threads:
            thread.start()
        self.serving = True
        self._log("info", f"LLM ready in {time.monotonic() - started:.1f} s with {json.dumps(llm_args, default=str)}; "
                          f"exclude_input_in_output={exclude} cancellation check every {period_ms:g} ms "
                          f"guided_decoding={'on' if self.guided_decoding else 'off'} "
                          f"lora={'on' if self.lora_enabled else 'off'} sampler={self.sampler}")

    @staticmethod
    def _vocab_size(llm_args: Dict[str, Any]) -> int:
        """Token ids are checked against the checkpoint's vocab_size (config.json), when it is a local folder."""
        try:
            config = json.loads((Path(str(llm_args["model"])) / "config.json").read_text())
            return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
        except (OSError, ValueError, TypeError, AttributeError):
            return _translate.NO_LIMIT

    @staticmethod
    def _image_token_id(llm_args: Dict[str, Any]) -> Optional[int]:
        """The checkpoint's image token (config.json ``image_token_index``, Gemma 3 and LLaVA's name, or
        ``image_token_id``, Qwen2-VL's), or None."""
        try:
            config = json.loads((Path(str(llm_args["model"])) / "config.json").read_text())
        except (OSError, ValueError, TypeError):
            return None
        for key in ("image_token_index", "image_token_id"):
            value = config.get(key) if isinstance(config, dict) else None
            if isinstance(value, int):
                return value
        return None

    def _start_engine(self):
        """Build the LLM on the event-loop thread and return it; raise its error when it fails (never hang while
        the thread runs and never after it died)."""
        built: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_exit = None

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                from tensorrt_llm import LLM  # noqa: PLC0415

                llm = LLM(**self.llm_args)
            except BaseException as exc:  # noqa: BLE001 - handed to initialize
                built.set_exception(exc)
                loop.close()
                return
            self._loop = loop
            self._loop_exit = asyncio.Event()
            built.set_result(llm)
            try:
                loop.run_until_complete(self._loop_exit.wait())
            finally:
                loop.close()

        self._loop_thread = threading.Thread(target=run, name="trtllm-pytorch-event-loop", daemon=True)
        self._loop_thread.start()
        while True:
            try:
                llm = built.result(timeout=1.0)
                break
            except concurrent.futures.TimeoutError:
                if not self._loop_thread.is_alive() and not built.done():
                    raise RuntimeError("the event-loop thread ended without building the LLM") from None
            except Exception as exc:
                self._log("error", f"LLM(...) failed: {type(exc).__name__}: {exc}")
                raise RuntimeError(f"the PyTorch backend's LLM could not be built: {type(exc).__name__}: {exc}") from exc
        return llm

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._accept(request, sender)
            except Exception as exc:  # noqa: BLE001 - never fail the whole batch
                self._log("error", f"could not handle a request: {traceback.format_exc()}")
                self._send_now(sender, error_response(f"could not handle the request: {type(exc).__name__}: {exc}"))
        return None

    @staticmethod
    def _send_now(sender, response) -> None:
        """The one and only response of a request that never reached the LLM (sent from Triton's thread)."""
        try:
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - the client is gone
            pass

    def _accept(self, request, sender) -> None:
        get = glue.input_arrays(request)
        request_id = request.request_id() if hasattr(request, "request_id") else ""
        if not getattr(self, "serving", False) or self._closing:
            self._send_now(sender, error_response("the model is not serving (it is unloading)"))
            return
        try:
            is_stop = is_stop_request(get)
        except RequestError as exc:
            self._send_now(sender, error_response(str(exc)))
            return
        if is_stop:  # the C++ backend's handleStopRequest, before any other input is read
            self._handle_stop_request(request_id, sender)
            return
        missing = glue.missing_output_error(request)
        if missing is not None:
            self._send_now(sender, error_response(missing))
            return
        number = next(self._numbers)
        try:
            with self._lock:
                known = dict(self._lora_paths)
            submission = to_submission(get, vocab_size=self.vocab_size,
                                       exclude_input_in_output=self.exclude_input_in_output,
                                       guided_decoding=self.guided_decoding, lora_enabled=self.lora_enabled,
                                       known_paths=known, sampler=self.sampler, request_number=number,
                                       images_off=self.images_off)
        except RequestError as exc:
            self._send_now(sender, error_response(str(exc)))
            return
        for warning in submission.warnings:
            self._log("warn", warning)
        inflight = InFlightRequest(number, request_id, sender, submission)
        with self._lock:
            self._in_flight[number] = inflight
            if request_id:
                self._by_request_id[request_id] = inflight
        asyncio.run_coroutine_threadsafe(self._generate(inflight), self._loop)

    def _handle_stop_request(self, request_id: str, sender) -> None:
        """Abort the latest request with this Triton request id (the C++ backend keeps one entry per id, replaced by
        a later request with the same id and dropped when that one ends: ``mTritonRequestIdToRequestIds``); answer
        one empty successful final response (``handleStopRequest`` / ``sendEnqueueResponse``), or the C++ error
        without an id."""
        if not request_id:
            self._send_now(sender, error_response("Trying to stop a request but request ID is not provided"))
            return
        with self._lock:
            latest = self._by_request_id.get(request_id)
            targets = [latest] if latest is not None else []
        for inflight in targets:
            self._abort(inflight)
        self._log("info", f"stop request for id {request_id!r}: {len(targets)} running request(s) stopped")
        try:
            glue.send_empty_final(sender)
        except Exception as exc:  # noqa: BLE001
            self._log("warn", f"could not answer a stop request: {exc}")

    def _abort(self, inflight: InFlightRequest) -> None:
        """Abort ``inflight``'s generation (from any thread): ``RequestOutput.abort()`` on the event loop, and
        :meth:`_end_unanswered` one cancellation period later."""
        if inflight.abort_requested:
            return
        inflight.abort_requested = True
        loop = self._loop
        if loop is None:
            return

        def abort() -> None:
            if inflight.output is not None and not inflight.output.finished and not inflight.output.aborted():
                inflight.output.abort()
            loop.call_later(self.cancel_period_s, self._end_unanswered, inflight)

        try:
            loop.call_soon_threadsafe(abort)
        except RuntimeError:  # the loop is closed: nothing left to abort
            pass

    def _end_unanswered(self, inflight: InFlightRequest) -> None:
        """End an aborted request the LLM has not answered one cancellation period after its abort (event loop):
        TensorRT-LLM 1.2.1 answers an aborted request that was still waiting for a batch slot never (see the module
        docstring). Its coroutine is cancelled and it gets the final response of a stopped request (its tokens so
        far: none while it waited)."""
        if inflight.final_queued:
            return
        self._log("warn", f"request {inflight.request_id!r} was aborted and the LLM sent no final response within "
                          f"{self.cancel_period_s * 1e3:g} ms (TensorRT-LLM 1.2.1 drops an aborted request still waiting "
                          "for a batch slot without one): ended here")
        if inflight.task is not None:
            inflight.task.cancel()
        s = inflight.submission
        if s.streaming:
            self._queue_new(inflight, final=True)
        else:
            prefix = [] if s.exclude_input_in_output else list(s.prompt_ids)
            self._queue(inflight, prefix + inflight.tokens, final=True, all_tokens=True)

    # -- the event loop ---------------------------------------------------------------------------
    async def _generate(self, inflight: InFlightRequest) -> None:
        s = inflight.submission
        inflight.task = asyncio.current_task()
        try:
            SamplingParams, LoRARequest, GuidedDecodingParams = self._api  # noqa: N806 - the LLM API's classes
            kwargs = dict(s.sampling)
            if "guided_decoding" in kwargs:
                kwargs["guided_decoding"] = GuidedDecodingParams(**kwargs["guided_decoding"])
            lora_request = None
            if s.lora is not None:
                task_id, path = s.lora
                await self._check_adapter_identity(task_id, path)
                lora_request = LoRARequest(f"lora_{task_id}", task_id, path)
            inputs: Any = s.prompt_ids
            if s.images is not None:
                pictures = await asyncio.get_running_loop().run_in_executor(None, _translate.decode_images, s.images)
                inputs = {"prompt": s.text, "multi_modal_data": {"image": pictures}}
            output = self.llm.generate_async(inputs, sampling_params=SamplingParams(**kwargs),
                                             lora_request=lora_request, streaming=s.llm_streaming)
            if s.images is not None:
                s.prompt_ids = list(output.prompt_token_ids)
                inflight.counts = self._counts(s.prompt_ids)
            if s.lora is not None:
                with self._lock:
                    self._lora_paths[s.lora[0]] = s.lora[1]
            inflight.output = output
            if inflight.abort_requested:  # stopped or cancelled before the LLM had it
                output.abort()
            ended = False
            interval = s.interval_s
            async for result in output:
                new, ended = self._new_tokens(inflight, result)
                if s.streaming:
                    final = result.finished or ended
                    if final:
                        self._queue_new(inflight, final=True)
                    elif new:
                        # stream_interval_ms: held until the interval passed (checked as responses come: held
                        # tokens wait at most one step more), the first at once
                        if not interval or inflight.queued == 0:
                            self._queue_new(inflight, final=False)
                        else:
                            now = time.monotonic()
                            if now >= inflight.next_at:
                                inflight.next_at = now + interval
                                self._queue_new(inflight, final=False)
                if ended:
                    output.abort()  # a stop word: the C++ executor ends the request there
                    break
            if not s.streaming:
                prefix = [] if s.exclude_input_in_output else list(s.prompt_ids)
                self._queue(inflight, prefix + inflight.tokens, final=True, all_tokens=True)
        except Exception as exc:  # noqa: BLE001 - RequestError, the LLM's ValueError / RuntimeError
            if inflight.final_queued:
                return
            inflight.final_queued = True
            self._log("warn", f"request {inflight.request_id!r} failed: {type(exc).__name__}: {exc}")
            self._queue_of(inflight).put(QueuedError(inflight, error_response(str(exc))))

    def _counts(self, prompt_ids: List[int]) -> list:
        """``prompt_tokens`` and ``image_tokens`` [1, 1] INT32 of an image request whose prompt the LLM made
        ``prompt_ids``."""
        import numpy as np  # noqa: PLC0415 - Triton's stub has it

        # the image's features fill the positions of the image token, or of ids past the vocabulary: TensorRT-LLM's
        # multimodal ids (Qwen2-VL's input processor writes vocab_size + 1 there, modeling_qwen2vl.py _postprocess;
        # registry.py find_mm_token_positions takes ids >= vocab_size as multimodal)
        image_id, vocab = self.image_token_id, self.vocab_size
        image = sum(1 for token in prompt_ids if token == image_id or token >= vocab)
        return [pb_utils.Tensor("prompt_tokens", np.asarray([[len(prompt_ids)]], dtype=np.int32)),
                pb_utils.Tensor("image_tokens", np.asarray([[image]], dtype=np.int32))]

    async def _digest(self, path: str) -> Optional[str]:
        """``adapter_digest(path)``, computed once per folder, off the event loop."""
        if path not in self._lora_digests:
            digest = await asyncio.get_running_loop().run_in_executor(None, _translate.adapter_digest, path)
            self._lora_digests.setdefault(path, digest)
        return self._lora_digests[path]

    async def _check_adapter_identity(self, task_id: int, path: str) -> None:
        """Refuse ``task_id`` with a folder holding another adapter than the one first served under that id (event
        loop). The LLM API caches adapters by id and silently serves the cached one (``base_worker.py`` @7b437aaa
        ``_load_lora_adapter``; ``lora_manager.py`` @30e6fb55): one id must mean one adapter. The same adapter in
        another folder (same :func:`adapter_digest`) is served.

        Raises:
            RequestError: naming the id, both folders and the fix.
        """
        digest = await self._digest(path)
        if digest is None:
            return  # not a folder: LoRARequest refuses it with upstream's text
        first_path, first_digest = self._lora_identity.setdefault(task_id, (path, digest))
        if first_path == path or first_digest == digest:
            return
        raise RequestError(
            f"lora_task_id {task_id} was first served with the adapter in {first_path}, and {path} holds another "
            "adapter: the LLM caches adapters by their id (LoRARequest.lora_int_id) and would serve the first one; "
            "give each adapter its own lora_task_id")

    def _new_tokens(self, inflight: InFlightRequest, result) -> tuple[List[int], bool]:
        """The ids this response adds (the end token dropped, cut after a stop word), and whether a stop word
        ended the request."""
        s = inflight.submission
        completion = result.outputs[0]
        new = list(completion.token_ids_diff)
        entries = list(completion.logprobs_diff) if s.return_log_probs else []
        if result.finished and s.end_id is not None and new and new[-1] == s.end_id \
                and completion.finish_reason == "stop" and completion.stop_reason is None:
            new = new[:-1]  # the end token is never returned (C++ executor); the PyTorch sampler keeps it
        ended = False
        if s.stop_words and new:
            end = stop_word_end(list(s.prompt_ids) + inflight.tokens + new, len(new), s.stop_words)
            if end is not None:
                new = new[: end - len(s.prompt_ids) - len(inflight.tokens)]
                ended = True
        inflight.tokens.extend(new)
        if s.return_log_probs:
            inflight.log_probs.extend(_token_log_prob(e, t) for e, t in zip(entries, new))
            inflight.cum_log_prob = float(sum(inflight.log_probs))
        return new, ended

    def _queue_new(self, inflight: InFlightRequest, final: bool) -> None:
        """Queue a streaming request's tokens not queued yet (possibly none, for a final response)."""
        start = inflight.queued
        if start == 0 and inflight.submission.interval_s:
            inflight.next_at = time.monotonic() + inflight.submission.interval_s
        inflight.queued = len(inflight.tokens)
        self._queue(inflight, inflight.tokens[start:], final=final)

    def _queue(self, inflight: InFlightRequest, tokens: List[int], final: bool, all_tokens: bool = False) -> None:
        """Queue one response of ``inflight`` for its response thread. ``tokens`` is handed over: a list made for this
        response (a slice, a sum), which the response thread may extend."""
        if inflight.final_queued:
            return
        inflight.final_queued = final
        s = inflight.submission
        log_probs = None
        if s.return_log_probs:
            held = inflight.log_probs
            log_probs = list(held) if all_tokens else held[len(held) - len(tokens):]
        self._queue_of(inflight).put(QueuedTokens(inflight, tokens, log_probs, inflight.cum_log_prob, final))

    def _queue_of(self, inflight: InFlightRequest) -> "queue.SimpleQueue[Any]":
        return self._queues[inflight.number % RESPONSE_THREADS]

    # -- the response thread ----------------------------------------------------------------------
    def _response_loop(self, index: int) -> None:
        """Send what the event loop queued for partition ``index`` of the requests, in order per request, and check
        their cancellation. Each ``send`` is a round trip to Triton's process (about 140 us on an H200 host: one
        thread sent at most ~7,000 responses/s, measured with scripts/benchmark --engine pytorch at 128 x 100
        tokens/s: 0.56 of the engine's rate), so :data:`RESPONSE_THREADS` threads send at once. Whatever is
        waiting when the thread comes round is sent as one response per request: the new tokens of several
        steps together, as a streamed response of the C++ backend also carries all tokens since its last one;
        the final response is sent as made (it may hold no new tokens, as the C++ backend's may). An idle thread
        sends each step's tokens at once (time to first token unchanged)."""
        responses = self._queues[index]
        last_check = time.monotonic()
        while True:
            try:
                item = responses.get(timeout=self.cancel_period_s)
            except queue.Empty:
                item = None
            now = time.monotonic()
            if now - last_check >= self.cancel_period_s:
                last_check = now
                self._check_cancelled(index)
            if item is None:
                continue
            if item is _SHUTDOWN:
                return
            batch = [item]
            while len(batch) < MAX_MERGED_ITEMS:
                try:
                    more = responses.get_nowait()
                except queue.Empty:
                    break
                if more is _SHUTDOWN:
                    self._send_merged(batch)
                    return
                batch.append(more)
            self._send_merged(batch)

    def _send_merged(self, batch: List[Any]) -> None:
        """Send ``batch`` (:class:`QueuedTokens` and :class:`QueuedError` items in queue order), the tokens of each
        request joined into one response."""
        merged: Dict[int, QueuedTokens] = {}  # request number -> the item its later ones join, in order
        order: List[QueuedTokens] = []
        for item in batch:
            inflight = item.request
            if type(item) is QueuedError:  # after the tokens queued before it
                pending = merged.pop(inflight.number, None)
                if pending is not None:
                    order = [entry for entry in order if entry is not pending]
                    self._send(inflight, token_response(pending.tokens, pending.log_probs, pending.cum_log_prob,
                                                        inflight.counts), pending.final)
                self._send(inflight, item.response, True)
                continue
            entry = merged.get(inflight.number)
            if entry is None or entry.final or item.final:
                # The final response stays as the LLM made it (the C++ backend's shapes: a request ending on the
                # end token, or stopped, ends with a response of no new tokens).
                merged[inflight.number] = item
                order.append(item)
            else:
                entry.tokens.extend(item.tokens)
                if item.log_probs is not None:
                    entry.log_probs = (entry.log_probs or []) + item.log_probs
                entry.cum_log_prob = item.cum_log_prob
        # A request's first response goes before the others waiting here (time to first token; each request's own
        # responses stay in order).
        order.sort(key=lambda entry: entry.request.answered)
        for entry in order:
            self._send(entry.request, token_response(entry.tokens, entry.log_probs, entry.cum_log_prob,
                                                     entry.request.counts), entry.final)

    def _send(self, inflight: InFlightRequest, response, final: bool) -> None:
        if inflight.final_sent:
            return
        inflight.answered = True
        try:
            inflight.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as exc:  # noqa: BLE001 - a client that went away
            self._log("warn", f"could not send a response of request {inflight.request_id!r}: {exc}")
            final = True
            self._abort(inflight)
        if final:
            inflight.final_sent = True
            with self._lock:
                self._in_flight.pop(inflight.number, None)
                if self._by_request_id.get(inflight.request_id) is inflight:
                    del self._by_request_id[inflight.request_id]

    def _check_cancelled(self, index: int) -> None:
        """Ask Triton about every request of partition ``index`` without its final response (on the thread that
        alone sends them)."""
        with self._lock:
            in_flight = [inflight for inflight in self._in_flight.values()
                         if not inflight.cancel_seen and inflight.number % RESPONSE_THREADS == index]
        for inflight in in_flight:
            try:
                cancelled = bool(inflight.sender.is_cancelled())
            except Exception:  # noqa: BLE001
                cancelled = False
            if cancelled and not inflight.final_sent:
                inflight.cancel_seen = True
                self._log("info", f"request {inflight.request_id!r} cancelled by the client after "
                                  f"{len(inflight.tokens)} tokens")
                self._abort(inflight)

    # -- unloading --------------------------------------------------------------------------------
    def finalize(self) -> None:
        if not getattr(self, "serving", False):
            return
        self._closing = True
        with self._lock:
            in_flight = list(self._in_flight.values())
        for inflight in in_flight:
            self._abort(inflight)
        deadline = time.monotonic() + FINALIZE_DRAIN_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self._in_flight:
                    break
            time.sleep(0.05)
        with self._lock:
            left = list(self._in_flight.values())
        for inflight in left:
            unloaded = error_response("the model was unloaded before the request finished")
            self._queue_of(inflight).put(QueuedError(inflight, unloaded))
        for responses in self._queues:
            responses.put(_SHUTDOWN)
        for thread in self._response_threads:
            thread.join(FINALIZE_DRAIN_S)
        try:
            self.llm.shutdown()
        except Exception as exc:  # noqa: BLE001
            self._log("warn", f"LLM.shutdown() failed: {exc}")
        if self._loop is not None and self._loop_exit is not None:
            try:
                self._loop.call_soon_threadsafe(self._loop_exit.set)
            except RuntimeError:
                pass
        self._loop_thread.join(FINALIZE_DRAIN_S)
        self.serving = False
        sys.setswitchinterval(getattr(self, "_previous_switch_interval", sys.getswitchinterval()))
        self._log("info", "finalized")


_SHUTDOWN = object()
#: Threads sending responses (each owns the requests whose number is its index modulo this; the engine stand-in
#: of scripts/benchmark sends from 4 threads too). Sends of one request are never made from two threads: with
#: Triton 2.51's Python backend, a request's sender used from two threads made tritonserver die of SIGSEGV.
RESPONSE_THREADS = 4
#: The interpreter's thread switch interval in this model's stub process, seconds (CPython's default: 0.005). The
#: stub runs the event loop that hosts the LLM, the response threads and the LLM API's own threads; each ``send`` is
#: a round trip to Triton's process made without the GIL, and a thread coming back from it waits for the GIL until
#: the thread holding it is forced to switch, up to this interval. Timestamps inside the model (H200, 256 streams at
#: a 10 ms step, the LLM's stream_interval 8, benchmarks/results/2026-11-28-h200-i32-si) put the time to first token
#: there: a request's coroutine started 6-18 ms (p50) after execute() had it, and its first response waited 38 ms
#: (p50) in its response thread's queue. With 0.5 ms: direct time to first token p50 79-113 ms in four runs against
#: 119-148 ms in three with 5 ms, p99 and tokens/s unchanged (0.94-0.95 of the engine's rate either way); 2 ms gave
#: half of that, 0.2 ms no more. The same interval in the Cog worker made its time to first token worse (two runs):
#: only this process sets it.
GIL_SWITCH_INTERVAL_S = 0.0005
#: The most queued items a response thread takes at once (each request's among them become one response).
MAX_MERGED_ITEMS = 4096
