"""setup()'s decisions, made before anything starts: :func:`plan_serving` turns what setup found
(:class:`cog_triton.worker.facts.Facts`: the weights' info, their manifest, the visible GPUs, the CPUs, the libraries
installed) and the settings into one :class:`ServingPlan` (which backend serves the weights and with which arguments,
the limits requests are held to, the model repository's values, how Triton is launched, how many stream processes run
and how they stream, what the stream processes build their generator from). Pure: it reads no file, starts nothing
and logs nothing (a checkpoint's files were checked when the facts were gathered:
``Facts.checkpoint_files_refusal``); the service logs :meth:`ServingPlan.describe` (every decision on one line) and
:func:`cog_triton.worker.launch.launch` starts what the plan says.

Only the decisions that need the rendered model repository come after it, in the launch: whether guided decoding is on
(the rendered ``tensorrt_llm`` config says so), whether the model takes ``stream_interval_ms``
(:mod:`tensorrtllm_backend.templates`), and Triton's gRPC address.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

from cog_triton.fetch.rules import FetchRules
from cog_triton.stream_config import GeneratorConfig, ImageLimits, StoreLimits
from cog_triton.settings import Settings
from tensorrtllm_backend.checkpoint import FACTS_VERSION, IMAGE_ARCHITECTURES
from tensorrtllm_backend.engine import ModelLimits, WeightsInfo
from tensorrtllm_backend.lora import DTYPE_BYTES
from tensorrtllm_backend.llmapi_args import PyTorchServing, choose_checkpoint_backend, plan_pytorch_serving
from tensorrtllm_backend.manifest import base_model_of
from tensorrtllm_backend.server import LaunchConfig
from tensorrtllm_backend.templates import RenderOptions

if TYPE_CHECKING:
    from cog_triton.worker.facts import Facts

Backend = Literal["engine", "reference", "pytorch"]


@dataclass(frozen=True)
class ServingPlan:
    """Everything setup decided before launching (see the module docstring).

    Attributes:
        info: the weights as served: for the PyTorch backend its limits, LoRA support and world size replace the
            checkpoint's; for an engine the manifest's base model is named in its LoRA support.
        backend: "engine" (the C++ backend), "reference" (a checkpoint on the CPU reference model) or "pytorch" (a
            checkpoint on TensorRT-LLM's PyTorch backend).
        pytorch: the PyTorch backend's LLM arguments and limits (None for the other backends).
        limits: what each request is held to (tokens; chunked context applied for an engine).
        render: the model repository's values (``llm_args`` for the PyTorch backend).
        launch: how Triton is started (ports, world size, mpirun).
        stream_processes: the stream processes beside the Cog worker.
        interval_ms / interval_max_ms / interval_streams: the stream interval, its longest under load
            (milliseconds) and the running predictions the first serves
            (:class:`cog_triton.streaming.coalesce.StreamLoad`).
        adapter_limits: the LoRA adapter cache and its download bounds (None: adapters are refused).
        warnings: what setup warns about (logged at WARNING).
        images_off: why predictions may carry no images (None: they may; :func:`images_off_reason`).
        generator: what each stream process builds its generator from; the launch fills in what the rendered model
            repository and the started Triton decide (``guided``, ``guided_off_reason``, ``sends_stream_interval``,
            ``grpc_address``).
    """

    info: WeightsInfo
    backend: Backend
    pytorch: Optional[PyTorchServing]
    limits: ModelLimits
    render: RenderOptions
    launch: LaunchConfig
    stream_processes: int
    interval_ms: int
    interval_max_ms: int
    interval_streams: int
    adapter_limits: Optional[StoreLimits]
    generator: GeneratorConfig
    warnings: tuple[str, ...] = ()
    images_off: Optional[str] = None

    @property
    def sampler(self) -> Optional[str]:
        """The PyTorch backend's sampler (:mod:`tensorrtllm_backend.samplers`); None for the others."""
        return self.pytorch.sampler if self.pytorch is not None else None

    def describe(self) -> str:
        """Every decision, on one line, for setup's log."""
        info, limits = self.info, self.limits
        if self.pytorch is not None:
            served = self.pytorch.describe(info)
        else:
            what = "engine" if self.backend == "engine" else "Hugging Face checkpoint on the CPU reference model"
            served = (f"{what} {info.architecture} ({info.dtype}), world size {info.world_size}, max_input_len "
                      f"{limits.max_input_len}, max_seq_len {limits.max_seq_len}, max_batch_size "
                      f"{limits.max_batch_size}, {info.lora.describe()}")
        held = ""
        if limits.executor_max_input_len() != limits.max_input_len:
            held = (f"; prompts are held to {limits.executor_max_input_len()} tokens, not the engine's max_input_len "
                    f"{limits.max_input_len}: {limits.input_limit_reason()}")
        launch = self.launch
        ranks = (f"{launch.world_size} Triton ranks under mpirun" if launch.world_size > 1
                 else "one Triton under mpirun -n 1" if launch.single_rank_mpirun else "one Triton")
        if self.pytorch is not None and info.lora.enabled:
            bound = self.render.max_adapters_per_llm
            kept = bound * info.lora.adapter_values() * DTYPE_BYTES.get(info.lora.dtype, 2)
            held += (f"; the LLM is recycled after {bound} distinct LoRA adapters (COG_TRITON_LLM_MAX_ADAPTERS_PER_LLM; "
                     f"TensorRT-LLM 1.2.1 keeps each one's GPU tensors until then: at most {kept / 1e9:.2f} GB at "
                     f"rank {info.lora.max_rank} on every module)" if bound else
                     "; the LLM is never recycled for LoRA adapters (COG_TRITON_LLM_MAX_ADAPTERS_PER_LLM=0): "
                     "TensorRT-LLM 1.2.1 keeps every distinct adapter's GPU tensors for the LLM's life")
        return (f"plan: {served}{held}; {ranks}; {self.stream_processes} stream process(es), stream interval "
                f"{self.interval_ms:g} ms (up to {self.interval_max_ms:g} ms beyond {self.interval_streams} "
                f"running predictions); LoRA adapters {'on' if self.adapter_limits else 'off'}; images "
                f"{'on' if self.images_off is None else 'off'}")


def adapter_limits(settings: Settings) -> Optional[StoreLimits]:
    """The LoRA adapter disk cache, its download bounds and fetch rules (COG_TRITON_ADAPTER_*,
    COG_TRITON_DOWNLOAD_*, COG_TRITON_FETCH_*); None when adapters are off (COG_TRITON_LORA_ADAPTERS)."""
    adapters, download = settings.adapters, settings.download
    if not adapters.enabled:
        return None
    return StoreLimits(
        root=settings.path(adapters.cache_dir),
        budget_bytes=adapters.cache_bytes,
        max_adapter_bytes=adapters.max_bytes,
        extra_bytes=adapters.extra_bytes,
        max_members=adapters.max_members,
        timeout_s=download.timeout_s,
        retries=download.retries,
        deadline_s=adapters.download_deadline_s,
        min_rate_bytes_s=download.min_rate_bytes_s,
        rate_grace_s=download.rate_grace_s,
        rules=FetchRules.from_settings(settings),
        fetches=settings.predictor.max_concurrency,
    )


def images_off_reason(settings: Settings, backend: Backend, info: WeightsInfo) -> Optional[str]:
    """Why predictions of these weights may carry no images, in words for the refusal; None when they may: a Hugging
    Face checkpoint on the PyTorch backend whose architecture TensorRT-LLM 1.2.1 serves with images
    (:data:`tensorrtllm_backend.checkpoint.IMAGE_ARCHITECTURES`), with ``COG_TRITON_IMAGES`` on."""
    served = ", ".join(sorted(IMAGE_ARCHITECTURES))
    if backend == "engine":
        return ("this model is a prebuilt engine on TensorRT-LLM's C++ backend, which this image serves text only; "
                f"images are served from a Hugging Face checkpoint on the PyTorch backend ({served})")
    if backend == "reference":
        return ("this checkpoint is served by the CPU reference model, which takes text only; images are served on "
                f"the PyTorch backend (a GPU) from a checkpoint of {served}")
    if info.architecture not in IMAGE_ARCHITECTURES:
        return (f"architecture {info.architecture} is served text only (TensorRT-LLM {FACTS_VERSION}'s PyTorch backend "
                "takes no images for it here: its default input processor would drop them); images are served for "
                f"{served}")
    if not settings.images.enabled:
        return "images are switched off on this server (COG_TRITON_IMAGES=false)"
    return None


def render_options(settings: Settings, llm_args: Optional[dict] = None, images: bool = False,
                   xgrammar: bool = False) -> RenderOptions:
    """The model repository's values from the settings (``llm_args``: the PyTorch backend's LLM arguments; ``images``:
    the PyTorch-backend model serves images; ``xgrammar``: the xgrammar package is installed, so guided decoding is
    rendered on)."""
    repo, kv, lora = settings.repository, settings.kv_cache, settings.lora_cache
    add_special_tokens = settings.tokenizer.add_special_tokens
    return RenderOptions(
        template_dir=repo.template_path,
        model_repo_dir=repo.path,
        triton_max_batch_size=repo.max_batch_size,
        decoupled=True,
        max_queue_delay_microseconds=repo.max_queue_delay_microseconds,
        batching_strategy=repo.batching_strategy.value,
        batch_scheduler_policy=repo.batch_scheduler_policy.value,
        kv_cache_free_gpu_mem_fraction=kv.free_gpu_mem_fraction,
        max_tokens_in_paged_kv_cache=kv.max_tokens,
        enable_kv_cache_reuse=kv.enable_reuse,
        enable_chunked_context=kv.enable_chunked_context,
        gpu_device_ids=repo.gpu_device_ids,
        preprocessing_instance_count=repo.preprocessing_instance_count,
        text_ensemble=repo.text_ensemble,
        # for text_input sent to `ensemble` (and ensemble_ids) by other clients; the predictor sends token ids
        add_special_tokens=add_special_tokens if add_special_tokens is not None else True,
        reference_torch_threads=settings.reference.torch_threads,
        tensorrt_llm_parameters=repo.tensorrt_llm_parameters,
        guided_decoding=xgrammar,
        lora_cache_optimal_adapter_size=lora.optimal_adapter_size,
        lora_cache_max_adapter_size=lora.max_adapter_size,
        lora_cache_gpu_memory_fraction=lora.gpu_memory_fraction,
        lora_cache_host_memory_bytes=lora.host_memory_bytes,
        llm_args=llm_args,
        max_adapters_per_llm=settings.llm.max_adapters_per_llm,
        # beside the adapter disk cache's own folder (<cache>/adapters, which it evicts from), on its file system:
        # the model's snapshots are hard links to the cached files
        adapter_snapshot_dir=str(settings.path(settings.adapters.cache_dir) / "llm-snapshots"),
        images=images,
    )


def plan_serving(facts: "Facts", settings: Settings) -> ServingPlan:
    """Decide how the weights of ``facts`` are served (see the module docstring).

    Args:
        facts: what setup found (:func:`cog_triton.worker.facts.gather_facts`): the weights as inspected, their
            verified manifest or None, the GPUs visible, the CPUs, whether xgrammar is installed.
        settings: the service's settings.

    Raises:
        ConfigError: a checkpoint's LLM API arguments are not valid, or COG_TRITON_CHECKPOINT_BACKEND=pytorch with no
            GPU (:func:`tensorrtllm_backend.llmapi_args.plan_pytorch_serving`, ``choose_checkpoint_backend``).
        IncompatibleWeightsError: the PyTorch backend cannot serve the checkpoint on these GPUs.
    """
    info, manifest, gpus = facts.info, facts.manifest, facts.gpus
    base_model = base_model_of(manifest)
    if info.kind == "engine" and base_model:  # for the LoRA refusals' messages
        info = dataclasses.replace(info, lora=dataclasses.replace(info.lora, base_model=base_model))
    pytorch: Optional[PyTorchServing] = None
    backend: Backend = "engine" if info.kind == "engine" else "reference"
    # A checkpoint is served by TensorRT-LLM's PyTorch backend (the LLM API) on a GPU, else by the CPU reference
    # model (COG_TRITON_CHECKPOINT_BACKEND); its arguments are checked here, before Triton starts.
    if info.kind != "engine" and choose_checkpoint_backend(settings.llm.checkpoint_backend.value, gpus) == "pytorch":
        pytorch = plan_pytorch_serving(info, settings.llm_api_options(), gpus, base_model, read_files=False,
                                       files_refusal=facts.checkpoint_files_refusal)
        info = dataclasses.replace(info, limits=pytorch.limits, lora=pytorch.lora, world_size=pytorch.world_size)
        backend = "pytorch"
    warnings = []
    if info.limits.max_batch_size < settings.predictor.max_concurrency:
        warnings.append(
            f"Cog serves up to {settings.predictor.max_concurrency} predictions at once (COG_MAX_CONCURRENCY, "
            f"predict.py's @cog.concurrent), but the engine batches at most {info.limits.max_batch_size} requests (max_batch_size): "
            f"the others wait in the engine's queue; rebuild the engine with limits.max_batch_size >= "
            f"{settings.predictor.max_concurrency}, or lower the concurrency")
    # Chunked context changes the longest prompt the executor takes (ModelLimits.executor_max_input_len); only the
    # C++ backend reads the setting (the reference template has no such parameter). The PyTorch backend's limits
    # already follow its own rule (llmapi_args.pytorch_limits).
    limits = info.limits if pytorch is not None else dataclasses.replace(
        info.limits, enable_chunked_context=settings.kv_cache.enable_chunked_context and info.kind == "engine")
    launch = LaunchConfig(
        model_repo=settings.repository.path,
        http_port=settings.triton.http_port,
        grpc_port=settings.triton.grpc_port,
        metrics_port=settings.triton.metrics_port,
        # An engine's tensor/pipeline parallelism: one server per rank under mpirun (check_weights_match made sure
        # the manifest's world size, when there is one, equals the engine's). A checkpoint's: one server under
        # mpirun -n 1, whose LLM spawns its ranks (tensorrtllm_backend.server's docstring).
        world_size=1 if pytorch else info.world_size if not manifest else manifest.world_size,
        single_rank_mpirun=pytorch is not None and pytorch.world_size > 1,
        log_verbose=settings.triton.log_verbose,
        mpirun=settings.triton.mpirun,
    )
    images_off = images_off_reason(settings, backend, info)
    limits_of_adapters = adapter_limits(settings)
    generator = GeneratorConfig(
        tokenizer_dir=info.tokenizer_dir,
        limits=limits,
        grpc_address="",  # Triton's, once its server is made (the launch)
        token_timeout_s=settings.stream.request_timeout_s,
        add_special_tokens=settings.tokenizer.add_special_tokens,
        special_tokens_in_user_text=settings.tokenizer.special_tokens_in_user_text,
        lora=info.lora,
        adapter_limits=limits_of_adapters,
        backend="pytorch" if backend == "pytorch" else "engine",
        sampler=pytorch.sampler if pytorch is not None else None,
        images_off=images_off,
        image_limits=ImageLimits.from_settings(settings),
    )
    return ServingPlan(
        info=info,
        backend=backend,
        pytorch=pytorch,
        limits=limits,
        render=render_options(settings, pytorch.args if pytorch else None, images=images_off is None,
                              xgrammar=facts.xgrammar),
        launch=launch,
        stream_processes=settings.stream.process_count(facts.cpus),
        interval_ms=settings.stream.interval_ms,
        interval_max_ms=settings.stream.interval_max_ms,
        interval_streams=settings.stream.interval_streams,
        adapter_limits=limits_of_adapters,
        generator=generator,
        warnings=tuple(warnings),
        images_off=images_off,
    )


__all__ = ("ServingPlan", "adapter_limits", "images_off_reason", "plan_serving", "render_options")
