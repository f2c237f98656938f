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
* a stopped or cancelled request is never cut short, and none is left behind in the LLM
  (:meth:`TritonPythonModel._abort`). TensorRT-LLM 1.2.1 drops an aborted request that is still waiting for a batch
  slot without any response (``_torch/pyexecutor/executor_request_queue.py`` @007a7508 ``update_waiting_queue``;
  ``py_executor.py`` ``_handle_canceled_requests`` finishes active requests only; ``executor/base_worker.py``
  @7b437aaa ``abort_request`` sends nothing), so its result never ends and its entry in the worker's ``_results``
  stays for the LLM's life (removed only with a final response, ``AwaitResponseHelper.handle_for_worker``); and an
  abort reaches the executor only at its next iteration, through the proxy's request queue and the worker
  (``worker_main`` @cc4777e9), which under load takes longer than a cancellation period. So the LLM always streams
  (the model sees a request's first answer: it has a slot), a request the LLM has answered is aborted there and
  ends with the LLM's own final response (every token it made, however long the abort travels), and a request it
  has not answered is aborted only at its first answer, the client getting a stopped request's final response (no
  tokens) if none comes within ``unanswered_stop_timeout_ms`` (1000 ms by default;
  :data:`DEFAULT_UNANSWERED_STOP_TIMEOUT_MS` has the arithmetic);
* every ``lora_path`` is checked before the LLM sees it (``translate.check_adapter``: it exists, is complete and
  readable, its rank fits), and the LLM reads the model's snapshot of it (``adapters.py``), kept while the id is live
  in the LLM. TensorRT-LLM 1.2.1 loads a new adapter in the executor worker before the ``try`` that turns errors
  into ``RequestError`` (``executor/base_worker.py`` @7b437aaa ``_enqueue_request``), and ``worker_main``
  (``executor/worker.py`` @cc4777e9) treats anything else as critical: the worker stops, and the LLM with it, for
  every request (wrapped after 1.2.1, PR #13517); it may read an id's folder again when its own cache dropped the
  adapter (``_torch/pyexecutor/resource_manager.py`` @d2a5560a ``add_request_peft``), so the folder must stay
  readable while the id is live, whatever the adapter disk cache evicts;
* the LLM is recycled after ``max_adapters_per_llm`` distinct adapters (:meth:`TritonPythonModel._recycle`: running
  requests finish, new ones wait, a new LLM is built): 1.2.1's ``LoraManager.load_from_hf`` appends every new
  adapter's GPU tensors to ``_lora_weights``, a list that never shrinks and that the PyTorch backend never reads
  (``lora_manager.py`` @30e6fb55 and @007e181b; PR #12815, opened on main 2026-04-07 after the release branch was
  cut, adds ``_retain_device_tensors``; no version of the file at 1.2.1's commit 376f7e1b can be read, so it is
  taken to leak: docs/deploy.md has the arithmetic). The count is a metric (:data:`ADAPTERS_METRIC`, with
  :data:`RECYCLES_METRIC`);
* a sampling input the LLM's sampler would ignore is refused (``translate.py``, ``samplers.py``), and the
  log-probabilities returned are always the generated tokens' (a response whose log-prob is keyed by another
  token fails the request);
* a known ``lora_task_id`` sent with a folder that holds another adapter is refused (the LLM API would serve the
  adapter cached under the id); the same adapter in another folder is served under the id's snapshot.
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

Modules beside this file: ``translate.py`` (tensors -> LLM request, and the adapter folder's check), ``adapters.py``
(the adapters of one LLM's life: snapshots and the bound), and, copied here when the repository is rendered
(``tensorrtllm_backend/templates.py`` ``SHARED_MODEL_CODE``), ``parsing.py`` and ``lora.py`` (the CPU reference
model's, whose checks and texts ``translate.py`` reuses), ``triton_glue.py`` (the reference model's too: parameters,
input tensors, responses, errors and logging, as the two models share them) and ``samplers.py``
(``tensorrtllm_backend/samplers.py``: what each sampler applies). Triton imports this file as ``1.model``, so it imports
them relatively (see the reference model's docstring).

Why one module: one concern, hosting the LLM in Triton's Python backend: the three threads,
a request's life from ``execute`` to its final response, the responses, and the LLM's own life (its adapters and its
recycling); the request's meaning is ``translate.py``'s, the adapter folders' bookkeeping ``adapters.py``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

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

from . import triton_glue as glue  # noqa: E402 (after the MPI variables are cleared, as before)
from .adapters import AdapterLife, VerifiedFolders, life_folder, remove_stale_lives  # noqa: E402
from .parsing import RequestError, is_stop_request  # noqa: E402
from .samplers import effective_sampler  # noqa: E402
from .translate import (  # noqa: E402
    NO_LIMIT,
    AdapterFacts,
    SamplerRefusal,
    Submission,
    check_adapter,
    decode_images,
    stop_word_end,
    to_submission,
)

#: How this model's log lines begin.
LOG_TAG = "tensorrt_llm pytorch"
#: The file the renderer writes the LLM's arguments to, beside this one.
LLM_ARGS_FILE = "llm_args.json"
#: upstream llmapi model.py: cancellation_check_period_ms defaults to 100 (ms).
DEFAULT_CANCELLATION_CHECK_PERIOD_MS = 100.0
#: How long finalize waits for aborted requests' last responses, seconds.
FINALIZE_DRAIN_S = 10.0
#: How long a stopped request the LLM has never answered waits for its first answer before the model ends it with no
#: tokens, milliseconds (parameter ``unanswered_stop_timeout_ms``). A request with a batch slot answers at the end of
#: its first executor iteration: the LLM API streams each step's response (``_handle_responses``), and with the
#: overlap scheduler (1.2.1's default) a step's responses leave during the next step, so the first answer comes
#: within two iterations of the request getting its slot, plus the proxy's ZMQ hops (milliseconds). One iteration is
#: at most one forward pass over ``max_num_tokens`` tokens (8192 by default): about 0.3 s for an 8B model on an H100
#: (2 x 8e9 x 8192 = 1.3e14 FLOP at ~5e14 FLOP/s). Silent for 1 s after the stop, a request most likely never had a
#: slot; ending it then loses no token, and nothing is dropped in the LLM (the model aborts it there only at its
#: first answer: :meth:`TritonPythonModel._abort`).
DEFAULT_UNANSWERED_STOP_TIMEOUT_MS = 1000.0
#: ``LoraConfig.max_lora_rank``'s default (``lora_helper.py`` @585c7565).
DEFAULT_MAX_LORA_RANK = 64
#: What ``generate_async`` raises once the LLM is shut down (``llmapi/llm.py`` @4c05a748), also after its executor
#: worker stopped (the proxy's ``_handle_background_error`` shuts it down).
LLM_SHUT_DOWN = "LLM is shutting down"
#: The model's metrics (Triton's /metrics, and the predictor's Prometheus endpoint after its own).
ADAPTERS_METRIC = "cog_triton_llm_lora_adapters"
RECYCLES_METRIC = "cog_triton_llm_recycles"


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
    responded: bool = False  # the LLM answered it at least once: it has a batch slot (event loop)
    abort_on_response: bool = False  # aborted before the LLM answered: abort it in the LLM at its first answer


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
    warning when absent), ``cancellation_check_period_ms`` (default 100), ``unanswered_stop_timeout_ms`` (default
    1000: :data:`DEFAULT_UNANSWERED_STOP_TIMEOUT_MS`), ``max_adapters_per_llm`` (default 0: no bound),
    ``adapter_snapshot_dir`` (default: a temporary folder), ``images`` (default false: image
    requests are refused). The LLM's arguments: ``llm_args.json`` beside this file
    (:meth:`load_llm_args`).
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
        unanswered_ms = glue.param(params, "unanswered_stop_timeout_ms", DEFAULT_UNANSWERED_STOP_TIMEOUT_MS, float)
        if unanswered_ms <= 0:
            raise ValueError(f"parameter unanswered_stop_timeout_ms must be > 0, got {unanswered_ms}")
        self.unanswered_s = unanswered_ms / 1e3
        llm_args = self.load_llm_args(params)
        self.guided_decoding = llm_args.get("guided_decoding_backend") is not None
        self.lora_enabled = llm_args.get("lora_config") is not None
        self.vocab_size = self._vocab_size(llm_args)
        self._init_images(params, llm_args)
        self.sampler = effective_sampler(llm_args)
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
        self._submitted: set = set()  # requests given to the LLM and not ended by it (event loop)
        self._recycling: Optional[asyncio.Event] = None  # set while the LLM is recycled (event loop)
        self._broken: Optional[str] = None  # why the LLM is gone for good (a failed rebuild)
        self.recycles = 0
        self._init_adapters(params, llm_args, args)
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
            self._life.close()
            raise
        self._drained = asyncio.Event()  # set when the last request given to the LLM ends (bound to the loop on use)
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
                          f"lora={'on' if self.lora_enabled else 'off'} sampler={self.sampler} "
                          f"max_adapters_per_llm={self.max_adapters_per_llm or 'unbounded'} "
                          f"unanswered_stop_timeout_ms={unanswered_ms:g}")

    def _init_images(self, params: dict, llm_args: Dict[str, Any]) -> None:
        """Whether image requests are served (parameter ``images``, default false) and the checkpoint's image token.

        Raises:
            ValueError: ``images`` is true and the checkpoint's config.json names no image token.
        """
        self.images = glue.param(params, "images", False, bool)
        self.image_token_id = self._image_token_id(llm_args)
        self.images_off = None if self.images else (
            "its parameter images is false (the predictor serves images only on a checkpoint whose architecture "
            "TensorRT-LLM 1.2.1's PyTorch backend takes them for, with COG_TRITON_IMAGES on)")
        if self.images and self.image_token_id is None:
            raise ValueError("parameter images is true, but the checkpoint's config.json names no image token "
                             "(image_token_index or image_token_id)")

    def _init_adapters(self, params: dict, llm_args: Dict[str, Any], args: dict) -> None:
        """The LoRA adapters' state (parameters ``max_adapters_per_llm``, ``adapter_snapshot_dir``; the LLM's
        ``lora_config.max_lora_rank``, default 64 as ``LoraConfig``'s, lora_helper.py @585c7565), the first LLM life
        and the metrics.

        Raises:
            ValueError: a parameter out of range.
        """
        self.max_adapters_per_llm = glue.param(params, "max_adapters_per_llm", 0, int)
        if self.max_adapters_per_llm < 0:
            raise ValueError("parameter max_adapters_per_llm must be >= 0 (0: no bound), got "
                             f"{self.max_adapters_per_llm}")
        lora_config = llm_args.get("lora_config") if isinstance(llm_args.get("lora_config"), dict) else {}
        self.max_lora_rank = int(lora_config.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK)
        self._lora_paths: Dict[int, str] = {}  # id -> the folder the current LLM was given for it
        self._verified = VerifiedFolders()  # event loop only
        self._life_number = 0
        root = glue.param(params, "adapter_snapshot_dir", "", str)
        self._snapshot_root = Path(root) if root else Path(tempfile.mkdtemp(prefix="trtllm-lora-"))
        self._snapshot_root.mkdir(parents=True, exist_ok=True)
        stale = remove_stale_lives(self._snapshot_root)
        if stale:
            self._log("info", f"removed adapter snapshots of processes that are gone: {', '.join(stale)}")
        self._life = AdapterLife(life_folder(self._snapshot_root, 0), self.max_adapters_per_llm)
        self._adapters_gauge, self._recycles_metric = self._metrics(args)

    def _metrics(self, args) -> tuple:
        """The model's Prometheus metrics in Triton's (python_backend's custom metrics, ``pb_utils.MetricFamily``):
        the distinct LoRA adapters the current LLM has been given (a gauge) and the LLM's recycles (a counter),
        labelled with the model's name and version; (None, None) where the Python backend has no custom metrics."""
        family = getattr(pb_utils, "MetricFamily", None)
        if family is None:
            return None, None
        labels = {"model": str(args.get("model_name", "tensorrt_llm")), "version": str(args.get("model_version", "1"))}
        # The families are kept: python_backend removes a family's metrics when the family object is deleted.
        self._metric_families = (
            family(name=ADAPTERS_METRIC, description="Distinct LoRA adapters the current LLM has been given "
                   "(TensorRT-LLM 1.2.1 keeps each one's tensors until the LLM is recycled)", kind=family.GAUGE),
            family(name=RECYCLES_METRIC, description="Times the LLM was replaced by a new one after "
                   "max_adapters_per_llm distinct LoRA adapters", kind=family.COUNTER))
        return tuple(f.Metric(labels=labels) for f in self._metric_families)

    @staticmethod
    def _vocab_size(llm_args: Dict[str, Any]) -> int:
        """Token ids are checked against the checkpoint's vocab_size (config.json), when it is a local folder."""
        try:
            config = json.loads((Path(str(llm_args["model"])) / "config.json").read_text())
            return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
        except (OSError, ValueError, TypeError, AttributeError):
            return NO_LIMIT

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
            if isinstance(exc, SamplerRefusal):
                self._log("warn", f"request {request_id!r}: {exc.refusal.log_line()}")  # the operator's remedy
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
        """Stop ``inflight`` (from any thread; a stop request, Triton's cancellation, finalize). On the event loop:

        * the LLM has answered it (it has a batch slot): ``RequestOutput.abort()``; the LLM ends it 'cancelled' at the
          executor's next iteration and its final response carries every token made until then, however long the
          abort takes to travel (no timer: an active request is never cut short);
        * the LLM has not answered it yet: it may be waiting for a slot, which TensorRT-LLM 1.2.1 drops on an abort
          without any answer, leaving its entry in the worker's ``_results`` for the LLM's life (see the module
          docstring). So it is not aborted in the LLM now but at its first answer (when it has a slot, whose abort the
          executor answers), and the client gets the final response of a stopped request (its tokens: none) if the
          LLM sends nothing within ``unanswered_stop_timeout_ms`` (:meth:`_end_unanswered`);
        * not given to the LLM yet (held while the LLM is recycled): it ends at once, with no tokens.
        """
        if inflight.abort_requested:
            return
        inflight.abort_requested = True
        loop = self._loop
        if loop is None:
            return

        def abort() -> None:
            if inflight.final_queued:
                return
            output = inflight.output
            if output is None:  # not given to the LLM (held while it is recycled, or its adapter being checked):
                self._queue_final(inflight)  # it ends now, and _generate does not give it to the LLM
                return
            if inflight.responded:
                if not output.finished and not output.aborted():
                    output.abort()
                return
            inflight.abort_on_response = True
            loop.call_later(self.unanswered_s, self._end_unanswered, inflight)

        try:
            loop.call_soon_threadsafe(abort)
        except RuntimeError:  # the loop is closed: nothing left to abort
            pass

    def _end_unanswered(self, inflight: InFlightRequest) -> None:
        """End, for the client, an aborted request the LLM has not answered within ``unanswered_stop_timeout_ms``
        of its abort (event loop): it never got a batch slot, so it has no tokens; it gets the final response of a
        stopped request. Its coroutine stays: when the LLM gives it a slot and answers, it is aborted there and its
        last response removes its worker entry (:meth:`_abort`)."""
        if inflight.final_queued or inflight.responded:
            return
        self._log("info", f"request {inflight.request_id!r} was stopped while waiting for a batch slot: the LLM "
                          f"sent nothing within {self.unanswered_s * 1e3:g} ms of the stop, so it ends now with no "
                          "tokens (it is aborted in the LLM when it gets a slot)")
        self._queue_final(inflight)

    def _queue_final(self, inflight: InFlightRequest) -> None:
        """Queue the final response of a stopped request: its tokens not sent yet (streaming), or prompt and tokens."""
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
        submitted = False
        try:
            while self._recycling is not None:  # held while the LLM is recycled
                await self._recycling.wait()
            SamplingParams, LoRARequest, GuidedDecodingParams = self._api  # noqa: N806 - the LLM API's classes
            kwargs = dict(s.sampling)
            if "guided_decoding" in kwargs:
                kwargs["guided_decoding"] = GuidedDecodingParams(**kwargs["guided_decoding"])
            lora_request = None
            if s.lora is not None:
                task_id, path = s.lora
                snapshot = await self._adapter_for_llm(task_id, path)
                lora_request = LoRARequest(f"lora_{task_id}", task_id, snapshot)
            inputs: Any = s.prompt_ids
            if s.images is not None:
                pictures = await asyncio.get_running_loop().run_in_executor(None, decode_images, s.images)
                inputs = {"prompt": s.text, "multi_modal_data": {"image": pictures}}
            if self._broken is not None:
                raise RequestError(self._broken)
            if inflight.abort_requested:  # stopped before it reached the LLM: nothing to stop there
                if not inflight.final_queued:
                    self._queue_final(inflight)
                return
            try:
                output = self.llm.generate_async(inputs, sampling_params=SamplingParams(**kwargs),
                                                 lora_request=lora_request, streaming=s.llm_streaming)
            except RuntimeError as exc:
                if str(exc) == LLM_SHUT_DOWN and not self._closing and self._broken is None:
                    self._llm_died()
                raise
            if s.images is not None:
                s.prompt_ids = list(output.prompt_token_ids)
                inflight.counts = self._counts(s.prompt_ids)
            inflight.output = output
            self._submitted.add(inflight)
            submitted = True
            ended = False
            interval = s.interval_s
            async for result in output:
                if not inflight.responded:
                    inflight.responded = True  # it has a batch slot: an abort now is answered by the LLM
                    if inflight.abort_on_response:
                        output.abort()  # stopped while it waited for the slot
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
        finally:
            if submitted:
                self._submitted.discard(inflight)
                if not self._submitted:
                    self._drained.set()

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

    # -- LoRA adapters and the LLM's life ------------------------------------------------------------
    async def _verify(self, path: str) -> AdapterFacts:
        """:func:`translate.check_adapter` of ``path`` (read off the event loop), or its remembered result while the
        folder's files are unchanged.

        Raises:
            RequestError: the folder is missing, incomplete or unreadable, or its rank is above the LLM's limit.
        """
        facts = self._verified.cached(path)
        if facts is None:
            facts = await asyncio.get_running_loop().run_in_executor(
                None, check_adapter, path, self.max_lora_rank)
            self._verified.remember(path, facts)
        return facts

    async def _adapter_for_llm(self, task_id: int, path: str) -> str:
        """The folder the LLM is given for ``task_id`` sent with ``path`` (event loop): the id's snapshot in this LLM's
        life (:mod:`adapters`), made when the id is new to it, after the folder is checked; the LLM is recycled first
        when a new id would pass ``max_adapters_per_llm``.

        Raises:
            RequestError: the folder fails its check (:meth:`_verify`); the id was first served with another adapter
                (the LLM API caches adapters by id, ``base_worker.py`` @7b437aaa ``_load_lora_adapter``, and would
                serve the first one); the snapshot cannot be made; the LLM could not be rebuilt.
        """
        facts = await self._verify(path)
        loop = asyncio.get_running_loop()
        while True:
            if self._broken is not None:
                raise RequestError(self._broken)
            life = self._life
            live = life.live.get(task_id)
            if live is not None:
                if live.digest != facts.digest:
                    raise RequestError(
                        f"lora_task_id {task_id} was first served with the adapter in {live.source}, and {path} holds "
                        "another adapter: the LLM caches adapters by their id (LoRARequest.lora_int_id) and would "
                        "serve the first one; give each adapter its own lora_task_id")
                return live.snapshot
            pending = life.pending.get(task_id)
            if pending is not None:
                await asyncio.shield(pending)
                continue
            if life.full():
                if self._recycling is not None:
                    await self._recycling.wait()
                else:
                    await self._recycle(f"adapter {task_id} would be the LLM's distinct adapter number "
                                        f"{len(life.live) + 1}, above max_adapters_per_llm {life.limit}")
                continue
            made: "asyncio.Future[None]" = loop.create_future()
            life.pending[task_id] = made
            try:
                snapshot = await loop.run_in_executor(None, life.snapshot, task_id, path, facts)
                life.add(task_id, snapshot, facts, path)
                with self._lock:
                    self._lora_paths[task_id] = snapshot
                self._adapters_metric(len(life.live))
                self._log("info", f"LoRA adapter {task_id} from {path} given to the LLM as {snapshot} "
                                  f"({len(life.live)} distinct adapter(s) in this LLM's life"
                                  f"{f' of at most {life.limit}' if life.limit else ''})")
                return snapshot
            finally:
                del life.pending[task_id]
                made.set_result(None)

    async def _recycle(self, reason: str) -> None:
        """Replace the LLM with a new one, without cutting a request short (event loop): requests not given to the
        LLM yet wait (:attr:`_recycling`); the ones it has run to their end (drain); then the LLM is shut down, which
        releases what it kept of every adapter (TensorRT-LLM 1.2.1 keeps each distinct adapter's device tensors for
        the LLM's life: the module docstring), its snapshots are removed, and a new LLM is built from the same
        arguments; the waiting requests go on. A new LLM that cannot be built fails the waiting requests and stops
        this model's process, so that the server restarts (the predictor's supervisor restarts Triton on a dead
        stub)."""
        event = self._recycling = asyncio.Event()
        started = time.monotonic()
        try:
            self._log("info", f"recycling the LLM: {reason}; new requests wait while {len(self._submitted)} running "
                              "request(s) finish")
            while self._submitted:
                self._drained.clear()
                await self._drained.wait()
            drained = time.monotonic()
            old, self.llm = self.llm, None
            try:
                old.shutdown()
            except Exception as exc:  # noqa: BLE001 - the new LLM is what matters
                self._log("warn", f"LLM.shutdown() failed while recycling: {exc}")
            del old
            self._life.close()
            with self._lock:
                self._lora_paths.clear()
            self._life_number += 1
            self._life = AdapterLife(life_folder(self._snapshot_root, self._life_number), self.max_adapters_per_llm)
            self._adapters_metric(0)
            from tensorrt_llm import LLM  # noqa: PLC0415

            try:
                self.llm = LLM(**self.llm_args)
            except Exception as exc:  # noqa: BLE001
                self._broken = (f"the LLM could not be rebuilt after recycling ({type(exc).__name__}: {exc}); the "
                                "model's process stops so that the server is restarted")
                self._log("error", self._broken)
                self._give_up()
                return
            self.recycles += 1
            if self._recycles_metric is not None:
                self._recycles_metric.increment(1)
            self._log("info", f"LLM recycled in {time.monotonic() - started:.1f} s (drained in "
                              f"{drained - started:.1f} s); {self.recycles} recycle(s) so far")
        finally:
            self._recycling = None
            event.set()

    def _llm_died(self) -> None:
        """The LLM says it is shutting down, and nobody shut it down: its executor worker stopped (1.2.1 stops it on
        a failure outside its RequestError path, and then every later request fails; the requests it was running
        never end). Nothing in this process can bring it back: the model's process stops, so that the predictor's
        supervisor restarts Triton, which fails the running predictions (or sends again those without a token)."""
        self._broken = ("the LLM's executor stopped (TensorRT-LLM 1.2.1 stops it on an error outside a request's "
                        "error path); the model's process stops so that the server is restarted")
        self._log("error", self._broken)
        self._give_up()

    def _give_up(self) -> None:
        """Stop this process a moment after a failed rebuild (the errors already queued are sent first)."""
        threading.Timer(2.0, os._exit, args=(1,)).start()

    def _adapters_metric(self, count: int) -> None:
        if self._adapters_gauge is not None:
            self._adapters_gauge.set(count)

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
        self._life.close()
        self._adapters_gauge = self._recycles_metric = None  # the metrics before their families (python_backend)
        self._metric_families = ()
        if self._snapshot_root.name.startswith("trtllm-lora-"):  # our own temporary folder
            shutil.rmtree(self._snapshot_root, ignore_errors=True)
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
