"""The predictor's logic: setup (weights -> model repository -> Triton) and streaming generation.

``predict.py`` only declares Cog inputs and delegates here. One :class:`LLMService` owns the
Triton process, the tokenizer and the HTTP client for the lifetime of the Cog worker.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional, TypeVar, Union

from cog_triton.cog_bridge import open_stream
from cog_triton.client import GenerateRequest, TritonClient
from cog_triton.detokenizer import IncrementalDetokenizer
from common.errors import (
    ConfigError,
    IncompleteOutputError,
    InferenceError,
    InputError,
    ManifestError,
    TritonDiedError,
    TritonError,
)
from cog_triton.guided import Guide, GuideChecker
from cog_triton.inputs import PredictInputs
from cog_triton.prompt import PromptTokenizer
from cog_triton.settings import Settings, VerifyMode
from cog_triton.stop import StopSequenceMatcher
from cog_triton.supervisor import Health, State, Supervisor
from cog_triton.weights import fetch_weights
from tensorrtllm_backend.engine import WeightsInfo, find_model_root, inspect_weights
from tensorrtllm_backend.gpus import GPU, visible_gpus
from tensorrtllm_backend.manifest import MANIFEST_NAME, Manifest, check_weights_match, verify_weights
from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver
from tensorrtllm_backend.templates import RenderOptions, guided_decoding_of, render_model_repository

log = logging.getLogger(__name__)

T = TypeVar("T")
SELF_TEST_PROMPT = "Hello"
SELF_TEST_TOKENS = 4

MetricSink = Callable[[str, Union[int, float]], None]


def _run_coroutine_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even if this thread already runs a loop."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(factory())  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="cog-triton-sync")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def reference_limits(settings: Settings, manifest: Optional[Manifest]) -> dict[str, Optional[int]]:
    """Limits of the CPU reference backend: each ``COG_TRITON_REFERENCE_*`` setting that is set wins,
    else the ``limits`` of the archive's build config (reference-backend manifests), else the defaults.

    Returns:
        ``reference_max_batch_size`` (requests), ``reference_max_seq_len`` and
        ``reference_max_input_len`` (tokens; None = derive from the checkpoint), as
        :func:`tensorrtllm_backend.engine.inspect_weights` takes them.
    """
    packed = manifest.build_config.get("limits", {}) if manifest and manifest.backend == "reference" else {}
    explicit = settings.model_fields_set
    batch = settings.reference_max_batch_size
    if "reference_max_batch_size" not in explicit and isinstance(packed.get("max_batch_size"), int):
        batch = packed["max_batch_size"]
    return {
        "reference_max_batch_size": batch,
        "reference_max_seq_len": settings.reference_max_seq_len or packed.get("max_seq_len"),
        "reference_max_input_len": settings.reference_max_input_len or packed.get("max_input_len"),
    }


class LLMService:
    """Weights, model repository, Triton process and generation for one predictor.

    Lifecycle: :meth:`setup` (blocking, seconds to minutes) -> any number of concurrent
    :meth:`generate` calls -> :meth:`shutdown` (also registered with ``atexit``).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.server: Optional[TritonServer] = None
        self.client: Optional[TritonClient] = None
        self.info: Optional[WeightsInfo] = None
        self.tokenizer: Any = None
        self._gpus: list[GPU] = []
        self.prompts: Optional[PromptTokenizer] = None
        self.supervisor: Optional[Supervisor] = None
        self.guides: Optional[GuideChecker] = None  # set when the served model has guided decoding on
        self.guided_off_reason = "setup() has not run"
        self._background: set[asyncio.Task[None]] = set()
        # Prompt formatting and tokenization run here, off the event loop. One thread: a Hugging
        # Face fast tokenizer is not safe to call from several threads at once ("Already borrowed").
        self._prepare_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cog-triton-prepare")
        atexit.register(self.shutdown)

    # ----------------------------------------------------------------- setup
    def setup(self, weights: Union[str, Path, None] = None) -> None:
        """Fetch weights, render the model repository, start Triton, run a self-test.

        Args:
            weights: URL (http, https, file) or local path of a .tar/.tar.gz archive or folder;
                default: COG_TRITON_WEIGHTS, else Cog's COG_WEIGHTS.

        Raises:
            ConfigError: no weights given, bad settings, or unusable weights metadata.
            IncompatibleWeightsError: the engine was built by another TensorRT-LLM version, needs more
                GPUs than are visible, or targets another GPU compute capability.
            WeightsError: download, checksum or extraction failed; ManifestError: a file differs
                from manifest.json.
            TritonStartupError: Triton did not become ready (message has its log tail).
            TritonError: the self-test generation failed.
        """
        started = time.monotonic()
        settings = self.settings
        source = str(weights) if weights not in (None, "") else settings.default_weights()
        if not source:
            raise ConfigError(
                "no weights given: pass setup(weights=...), or set COG_WEIGHTS or COG_TRITON_WEIGHTS to a URL or path "
                "of a .tar/.tar.gz archive or folder holding an engine or a Hugging Face checkpoint"
            )
        self.shutdown()
        fetched = fetch_weights(
            source,
            settings.weights_path,
            sha256=settings.weights_sha256,
            timeout_s=settings.download_timeout_s,
            retries=settings.download_retries,
            deadline_s=settings.download_deadline_s,
            min_rate_bytes_s=settings.download_min_rate_bytes_s,
            rate_grace_s=settings.download_rate_grace_s,
            max_extracted_bytes=settings.max_extracted_bytes,
        )
        log.info("weights ready in %s (%s)", fetched.path, "reused" if fetched.skipped else "fetched")
        manifest = self._verify(find_model_root(settings.weights_path), reused=fetched.skipped)
        info = inspect_weights(
            settings.weights_path,
            tokenizer_dir=settings.path(settings.tokenizer_dir) if settings.tokenizer_dir else None,
            **reference_limits(settings, manifest),
        )
        check_weights_match(info, manifest, self._gpus)
        if info.limits.max_batch_size < settings.max_concurrency:
            log.warning(
                "Cog serves up to %d predictions at once (COG_MAX_CONCURRENCY, cog.yaml concurrency.max), but the "
                "engine batches at most %d requests (max_batch_size): the others wait in the engine's queue; "
                "rebuild the engine with limits.max_batch_size >= %d, or lower the concurrency",
                settings.max_concurrency, info.limits.max_batch_size, settings.max_concurrency,
            )
        log.info(
            "%s %s (%s), world size %d, max_input_len %d, max_seq_len %d, max_batch_size %d",
            "engine" if info.kind == "engine" else "Hugging Face checkpoint",
            info.architecture,
            info.dtype,
            info.world_size,
            info.limits.max_input_len,
            info.limits.max_seq_len,
            info.limits.max_batch_size,
        )
        from transformers import AutoTokenizer  # noqa: PLC0415 - heavy import, only at setup

        self.tokenizer = AutoTokenizer.from_pretrained(str(info.tokenizer_dir), local_files_only=True)
        self.prompts = PromptTokenizer(
            self.tokenizer,
            add_special_tokens=settings.add_special_tokens,
            special_tokens_in_user_text=settings.special_tokens_in_user_text,
        )
        rendered = render_model_repository(self._render_options(), info)
        self._setup_guided_decoding(guided_decoding_of(rendered["tensorrt_llm"]), info)
        installation = locate_tritonserver(
            settings.path(settings.tritonserver) if settings.tritonserver else None,
            settings.path(settings.backend_dir) if settings.backend_dir else None,
            work_dir=settings.path(Path("build")),
        )
        self.server = TritonServer(
            installation,
            LaunchConfig(
                model_repo=settings.model_repo_path,
                http_port=settings.http_port,
                grpc_port=settings.grpc_port,
                metrics_port=settings.metrics_port,
                # Tensor/pipeline parallelism: one rank per GPU under mpirun. check_weights_match
                # made sure the manifest's world size (when there is one) equals the engine's.
                world_size=manifest.world_size if manifest else info.world_size,
                log_verbose=settings.log_verbose,
                mpirun=settings.mpirun,
            ),
            log_file=settings.path(settings.triton_log_file),
            stop_timeout_s=settings.stop_timeout_s,
        )
        self.info = info
        self.client = TritonClient(self.server.grpc_address, token_timeout_s=settings.request_timeout_s)
        self.server.start()
        ready_s = self.server.wait_ready(settings.startup_timeout_s)
        log.info("Triton ready in %.1f s", ready_s)
        self.supervisor = Supervisor(
            self.server,
            ["ensemble", "preprocessing", "tensorrt_llm"],
            startup_timeout_s=settings.startup_timeout_s,
            token_timeout_s=settings.request_timeout_s,
        )
        self.supervisor.start()
        if settings.self_test:
            self._self_test()
        log.info("setup finished in %.1f s", time.monotonic() - started)

    def _verify(self, root: Path, reused: bool = False) -> Optional[Manifest]:
        """Verify the weights in ``root`` against their manifest.json before Triton starts.

        ``reused``: the fetch was skipped; with COG_TRITON_VERIFY_WEIGHTS=fast (the default) files
        unchanged in size and mtime since the last successful full check are not hashed again.

        Raises:
            ManifestError: missing/resized/altered files, or no manifest with require_manifest set.
            IncompatibleWeightsError: other TensorRT-LLM version, too few GPUs, other compute capability.
        """
        self._gpus = visible_gpus()
        trust = reused and self.settings.verify_weights is VerifyMode.FAST
        verification = verify_weights(root, self._gpus, trust_record=trust)
        if verification is None:
            if self.settings.require_manifest:
                raise ManifestError(
                    f"no {MANIFEST_NAME} in {root} and COG_TRITON_REQUIRE_MANIFEST is set: package the weights "
                    "with scripts/build_engine, or unset COG_TRITON_REQUIRE_MANIFEST"
                )
            log.warning(
                "no %s in %s: file integrity and GPU compatibility are not verified (package with scripts/build_engine)",
                MANIFEST_NAME,
                root,
            )
            return None
        manifest = verification.manifest
        log.info(
            "verified %d files of %s (%s backend, world size %d%s) against %s in %.1f s",
            len(manifest.files),
            manifest.name,
            manifest.backend,
            manifest.world_size,
            f", TensorRT-LLM {manifest.tensorrt_llm_version}" if manifest.tensorrt_llm_version else "",
            MANIFEST_NAME,
            verification.seconds,
        )
        return manifest

    def _setup_guided_decoding(self, enabled: bool, info: WeightsInfo) -> None:
        """Structured output is offered when the rendered ``tensorrt_llm`` config turns guided decoding on."""
        self.guides = None
        if not enabled:
            self.guided_off_reason = (
                "its weights have no xgrammar_tokenizer_info.json next to the tokenizer (archives made by "
                "scripts/build_engine include it when the tokenizer supports it)"
                if info.kind == "engine"
                else "the xgrammar package is not installed"
            )
            log.info("guided decoding (structured output) is off: %s", self.guided_off_reason)
            return
        self.guides = GuideChecker(self.tokenizer)
        log.info("guided decoding (structured output) is on (xgrammar)")

    def _guide_fields(self, guide: Optional[Guide]) -> dict[str, str]:
        """GenerateRequest fields for ``guide``, compiled first so that a bad one fails here, not in Triton.

        Raises:
            InputError: the guide does not compile, or the model has guided decoding off.
        """
        if guide is None:
            return {}
        if self.guides is None:
            raise InputError(
                f"{guide.source} asks for structured output, but guided decoding is off for this model: "
                f"{self.guided_off_reason}"
            )
        self.guides.compile(guide)
        return {"guide_type": guide.guide_type, "guide": guide.guide}

    def _check_guided_output(self, inputs: PredictInputs, request: GenerateRequest, token_ids: list[int]) -> None:
        """Fail a guided prediction whose output stopped at the token limit before its document closed.

        Raises:
            IncompleteOutputError: names the limit, the tokens generated and the fix.
        """
        guide = inputs.guide
        if guide is None or self.guides is None or self.guides.is_complete(guide, token_ids):
            return
        limit = f"max_tokens={inputs.max_tokens}"
        if request.max_tokens < inputs.max_tokens:
            limit += f", capped to {request.max_tokens} by the model's maximum sequence length"
        raise IncompleteOutputError(
            f"the output is not a complete {guide.document} (asked for by {guide.source}): generation stopped "
            f"after {len(token_ids)} tokens at the token limit ({limit}) before it was complete; raise max_tokens "
            "or ask for a shorter answer"
        )

    def _render_options(self) -> RenderOptions:
        s = self.settings
        return RenderOptions(
            template_dir=s.template_path,
            model_repo_dir=s.model_repo_path,
            triton_max_batch_size=s.triton_max_batch_size,
            decoupled=True,
            max_queue_delay_microseconds=s.max_queue_delay_microseconds,
            batching_strategy=s.batching_strategy.value,
            batch_scheduler_policy=s.batch_scheduler_policy.value,
            kv_cache_free_gpu_mem_fraction=s.kv_cache_free_gpu_mem_fraction,
            max_tokens_in_paged_kv_cache=s.max_tokens_in_paged_kv_cache,
            enable_kv_cache_reuse=s.enable_kv_cache_reuse,
            enable_chunked_context=s.enable_chunked_context,
            gpu_device_ids=s.gpu_device_ids,
            preprocessing_instance_count=s.preprocessing_instance_count,
            # for text_input sent to the ensemble by other clients; the predictor sends token ids
            add_special_tokens=s.add_special_tokens if s.add_special_tokens is not None else True,
            reference_torch_threads=s.reference_torch_threads,
            tensorrt_llm_parameters=s.tensorrt_llm_parameters,
            guided_decoding=importlib.util.find_spec("xgrammar") is not None,
        )

    def _self_test(self) -> None:
        inputs = PredictInputs.validate(prompt=SELF_TEST_PROMPT, max_tokens=SELF_TEST_TOKENS, temperature=0, seed=0)

        async def run() -> str:
            parts = [part async for part in self.generate(inputs)]
            if self.client is not None:
                await self.client.aclose()
            return "".join(parts)

        started = time.monotonic()
        text = _run_coroutine_sync(run)
        log.info("self-test generated %r in %.2f s", text, time.monotonic() - started)

    # ------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Stop watching and stop Triton (SIGINT, then SIGKILL after the grace period); its shared
        memory is removed. Safe to call repeatedly."""
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.server is not None:
            self.server.stop()

    def health(self) -> Health:
        """Whether the service can serve (for the predictor's healthcheck; see cog_triton.supervisor)."""
        if self.supervisor is None:
            return Health(False, "setup() has not completed")
        return self.supervisor.health()

    # ------------------------------------------------------------ generation
    def prepare(self, inputs: PredictInputs) -> tuple[GenerateRequest, int]:
        """Render and tokenize the prompt (once; cog_triton.prompt) and build the request.

        Returns (request, prompt tokens).

        Raises:
            InputError: the prompt is too long for the model, min_tokens cannot fit, or the chat
                template refuses the input.
        """
        assert self.info is not None and self.prompts is not None
        if inputs.messages is not None:
            prompt = self.prompts.encode_messages(inputs.messages, inputs.system_prompt)
        else:
            prompt = self.prompts.encode(inputs.prompt, inputs.system_prompt, inputs.prompt_template)
        prompt_tokens = len(prompt.ids)
        limits = self.info.limits
        budget = inputs.token_budget(prompt_tokens, limits.max_input_len, limits.max_seq_len)
        guided = self._guide_fields(inputs.guide)
        greedy = inputs.greedy
        request = GenerateRequest(
            input_ids=prompt.ids,
            max_tokens=budget,
            min_tokens=inputs.min_tokens,
            # TensorRT-LLM decodes greedily with top_k=1; temperature 0 and top_p 0 are mapped to that (the
            # C++ backend would treat runtime_top_p <= 0 as "no top-p", utils.cc getSamplingConfigFromTensors).
            temperature=1.0 if greedy else inputs.temperature,
            top_k=1 if greedy else inputs.top_k,
            top_p=1.0 if greedy else inputs.top_p,
            repetition_penalty=inputs.repetition_penalty,
            presence_penalty=inputs.presence_penalty,
            frequency_penalty=inputs.frequency_penalty,
            seed=inputs.seed,
            request_id=f"cog-triton-{uuid.uuid4().hex}",
            **guided,
        )
        return request, prompt_tokens

    async def stream(self, inputs: PredictInputs, metric: Optional[MetricSink] = None) -> Iterator[str]:
        """Prepare ``inputs`` and start generating; return the sync generator coglet streams.

        The prompt is formatted and tokenized in a worker thread (not on the event loop), and
        any input error is raised here, before the first output. See :mod:`cog_triton.cog_bridge`
        for why predict() returns a generator rather than yielding.

        Raises:
            InputError: see :meth:`prepare`.
        """
        started = time.monotonic()
        prepared = await asyncio.get_running_loop().run_in_executor(self._prepare_pool, self.prepare, inputs)
        return await open_stream(self._generate(inputs, prepared, metric, started))

    async def generate(self, inputs: PredictInputs, metric: Optional[MetricSink] = None) -> AsyncIterator[str]:
        """Stream the completion of ``inputs`` as text deltas.

        The deltas concatenate to the full decode of the generated tokens, cut before the first
        stop sequence (which is never emitted). ``metric(name, value)`` receives
        input_token_count, output_token_count (tokens) and time_to_first_token_s (seconds).

        Raises:
            InputError: see :meth:`prepare`.
            TritonDiedError: Triton exited during the request (detected within ~0.5 s).
            InferenceError: Triton rejected the request or stopped sending tokens.
        """
        started = time.monotonic()
        prepared = self.prepare(inputs)
        async for text in self._generate(inputs, prepared, metric, started):
            yield text

    async def _generate(
        self,
        inputs: PredictInputs,
        prepared: tuple[GenerateRequest, int],
        metric: Optional[MetricSink],
        started: float,
    ) -> AsyncIterator[str]:
        request, prompt_tokens = prepared
        if metric:
            metric("input_token_count", prompt_tokens)
        supervisor, client = self.supervisor, self.client
        if supervisor is None or client is None:
            raise TritonError("setup() has not completed: Triton is not running")
        await supervisor.wait_ready()
        task = asyncio.current_task()
        assert task is not None
        watched = supervisor.register(task)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True)
        stops = StopSequenceMatcher(inputs.stop_sequences)
        stopped = False
        first = True
        finished = False
        guided_ids: Optional[list[int]] = [] if inputs.guide is not None else None  # to check the document
        try:
            async for chunk in client.generate_stream(request):
                watched.last = time.monotonic()  # for the no-token timeout (the supervisor checks it)
                ids = chunk.output_ids
                if not ids:
                    continue  # the last response of a request that ended on the end token
                if guided_ids is not None:
                    guided_ids.extend(ids)
                if first:
                    first = False
                    if metric:
                        metric("time_to_first_token_s", round(time.monotonic() - started, 4))
                text, stopped = stops.push(detok.push(ids))
                if text:
                    yield text
                if stopped:
                    break
            if not stopped:
                text, stopped = stops.push(detok.finish())
                if text:
                    yield text
                if not stopped:
                    rest = stops.finish()
                    if rest:
                        yield rest
            finished = not stopped
            if finished and guided_ids is not None:
                await asyncio.to_thread(self._check_guided_output, inputs, request, guided_ids)
        except asyncio.CancelledError:
            if watched.error is None:
                raise  # cancelled by the caller (Cog's cancel)
            task.uncancel()
            raise watched.error from None  # a fault the supervisor found: it names it
        except InferenceError:
            raise  # Triton answered with an error: nothing to wait for
        except TritonError as exc:  # the connection failed: is Triton going down?
            raise await self._died_or(exc) from None
        finally:
            supervisor.unregister(watched)
            if not finished:
                # Cancelled, cut by a stop sequence, or failed: make Triton stop generating too.
                self._stop_in_background(request.request_id)
            if metric:
                metric("output_token_count", detok.num_tokens)
            log.info(
                "generated %d tokens for a %d-token prompt in %.2f s%s",
                detok.num_tokens,
                prompt_tokens,
                time.monotonic() - started,
                " (stop sequence)" if stopped else "",
            )

    async def _died_or(self, exc: TritonError) -> TritonError:
        """After a broken connection: TritonDiedError if Triton exits or faults within 2 s, else ``exc``."""
        server, supervisor = self.server, self.supervisor
        assert server is not None and supervisor is not None
        for _ in range(20):
            if not server.is_alive():
                return TritonDiedError(
                    f"Triton {server.exit_description()} during the prediction; it is being restarted. "
                    f"Last log lines:\n{server.log_tail(20)}"
                )
            if supervisor.state is not State.READY:
                return TritonDiedError(f"{supervisor.counters.last_fault}; the prediction was stopped")
            await asyncio.sleep(0.1)
        return exc

    def _stop_in_background(self, request_id: str) -> None:
        """Send TensorRT-LLM's stop signal for ``request_id`` without waiting (best effort)."""
        client, server = self.client, self.server
        if client is None or server is None or not server.is_alive():
            return

        async def send() -> None:
            try:
                await client.stop(request_id)
            except TritonError as exc:
                log.warning("could not stop request %s in Triton: %s", request_id, exc)

        task = asyncio.get_running_loop().create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
