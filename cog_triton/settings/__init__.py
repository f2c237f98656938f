"""One typed settings object for cog-triton, read from ``COG_TRITON_*`` environment variables.

Parsing and validation are pydantic-settings': booleans accept only true/false/1/0/yes/no/on/off
(never ``bool(os.getenv(...))``), numbers are range-checked, and a bad value raises
:class:`common.errors.ConfigError` naming the variable, the value and what is allowed.

The settings are grouped by concern, one pydantic model per group (``settings.download.timeout_s``,
``settings.llm.sampler``, ``settings.triton.http_port``), while each keeps its flat variable,
``COG_TRITON_<NAME>``: NAME is the field's ``validation_alias`` where it has one (``download_timeout_s``), else
its name (``http_port``). :func:`variables` lists them; docs/settings.md is generated from them, a section per
group.

The package, a module per concern; this module is its face, and every name other packages use is imported from
here:

* :mod:`~cog_triton.settings.base`: the repository root, the variables' prefix and :class:`Group`;
* the groups: :mod:`~cog_triton.settings.weights` (weights and their download),
  :mod:`~cog_triton.settings.serving` (the model repository, the KV cache, the Triton process, the CPU reference
  backend), :mod:`~cog_triton.settings.llm` (the PyTorch backend's LLM API arguments),
  :mod:`~cog_triton.settings.lora` (LoRA adapters and the engine's LoRA caches), :mod:`~cog_triton.settings.inputs`
  (the fetch rules and images), :mod:`~cog_triton.settings.streaming` (the tokenizer, the stream processes and the
  stream interval), :mod:`~cog_triton.settings.metrics` and :mod:`~cog_triton.settings.predictor`;
* :mod:`~cog_triton.settings.flat`: the source that fills the groups from the flat variables;
* :mod:`~cog_triton.settings.settings_object`: :class:`Settings`, the groups together, the checks across them,
  the typed views other modules take of them (``llm_api_options``, paths) and :func:`variables`;
* :mod:`~cog_triton.settings.docs`: docs/settings.md (``python -m cog_triton.settings > docs/settings.md``).
"""

from cog_triton.settings.base import ENV_PREFIX, REPO_ROOT, Group, resolve
from cog_triton.settings.docs import settings_markdown
from cog_triton.settings.flat import FlatSource
from cog_triton.settings.inputs import FetchSettings, ImageSettings
from cog_triton.settings.llm import CheckpointBackend, GuidedDecodingBackend, LlmSampler, LlmSettings
from cog_triton.settings.lora import AdapterSettings, LoraCacheSettings
from cog_triton.settings.metrics import MetricsSettings
from cog_triton.settings.predictor import DEFAULT_CONCURRENCY, PredictorSettings
from cog_triton.settings.serving import (
    BatchingStrategy, KvCacheSettings, ReferenceSettings, RepositorySettings, SchedulerPolicy, TritonSettings,
)
from cog_triton.settings.settings_object import Settings, variables
from cog_triton.settings.streaming import DEFAULT_STREAM_INTERVAL_MS, StreamSettings, TokenizerSettings
from cog_triton.settings.weights import DownloadSettings, VerifyMode, WeightsSettings

__all__ = [
    "DEFAULT_CONCURRENCY", "DEFAULT_STREAM_INTERVAL_MS", "ENV_PREFIX", "REPO_ROOT", "AdapterSettings",
    "BatchingStrategy", "CheckpointBackend", "DownloadSettings", "FetchSettings", "FlatSource", "Group",
    "GuidedDecodingBackend", "ImageSettings", "KvCacheSettings", "LlmSampler", "LlmSettings", "LoraCacheSettings",
    "MetricsSettings", "PredictorSettings", "ReferenceSettings", "RepositorySettings", "SchedulerPolicy", "Settings",
    "StreamSettings", "TokenizerSettings", "TritonSettings", "VerifyMode", "WeightsSettings", "resolve",
    "settings_markdown", "variables",
]
