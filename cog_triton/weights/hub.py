"""``hf://owner/repo[@revision]`` weights: a Hugging Face checkpoint fetched from the Hub into the weights folder.

Part of :mod:`cog_triton.weights` (its public face is the package; :func:`cog_triton.weights.fetch_weights`
hands an ``hf://`` source to :func:`fetch_hub`).

What is fetched: only the files a checkpoint needs, at one commit (the revision is resolved once, with
``HfApi.model_info``, and every file is then fetched at that commit, so a branch that moves meanwhile cannot
mix two versions):

* ``config.json`` (required), ``generation_config.json``, the quantization files ``hf_quant_config.json`` and
  ``quant_cfg.json`` (ModelOpt) and ``dtypes.json``;
* the weights as safetensors: the shards ``model.safetensors.index.json`` names (and the index), or without an
  index every top-level ``*.safetensors``. Duplicates in other formats (``*.bin``, ``*.pt``, ``*.pth``,
  ``*.gguf``, ``consolidated.*`` not named by the index, sub-folders such as ``original/``) are not fetched; a
  repository without safetensors weights is refused;
* the tokenizer files (:data:`TOKENIZER_FILES`, ``*.tiktoken``) and chat templates, at the top level;
* the Hugging Face processor's files (:data:`tensorrtllm_backend.checkpoint.PROCESSOR_FILES`:
  ``preprocessor_config.json``, ``processor_config.json``, ``video_preprocessor_config.json``,
  ``chat_template.json``), at the top level: TensorRT-LLM's ``LLM`` loads the processor of a multimodal architecture
  when it loads the model, even to serve text (``tensorrtllm_backend.checkpoint``, which refuses such a checkpoint
  without them);
* only when the operator allows a checkpoint's own code (``code=True``: ``COG_TRITON_LLM_TRUST_REMOTE_CODE``), the
  repository's top-level ``*.py`` files (the modules its ``auto_map`` entries name). Without it none is fetched,
  and a checkpoint whose files name code is refused at setup.

How (huggingface_hub 2.4.0, read in ``.venv/lib/python3.11/site-packages/huggingface_hub``):
``HfApi.model_info`` (``GET /api/models/{repo}/revision/{revision}``: the commit ``sha``, ``gated``), then
``HfApi.list_repo_tree`` (``GET /api/models/{repo}/tree/{commit}?recursive=True``: every file and its size),
then each of those files with ``hf_hub_download(revision=<commit>, local_dir=<staging>)``, four at a time (as
``snapshot_download`` would, but in threads that keep the caller's fetch rules) (``HEAD`` then
``GET /{repo}/resolve/{commit}/{file}``,
reading ``X-Repo-Commit``, ``ETag``/``X-Linked-Etag`` and ``Content-Length``/``X-Linked-Size``). The endpoint is
``HF_ENDPOINT`` (huggingface_hub's own setting; tests point it at a local stand-in of the Hub). The same calls
exist in huggingface_hub 0.x (read in 0.36.0, the line the GPU image's transformers 4.x requires: ``hf_api.py``,
``file_download.py``), which does them over requests instead of httpx; their failures differ by class between the
majors and are classified once by :func:`cog_triton.fetch.hub_errors.classify_hub_error`, so every message below reads
the same under 0.x, 1.x and 2.x (``tests/test_weights_hub_0x.py`` runs this module's tests under 0.36).

The token is huggingface_hub's own lookup (``HF_TOKEN``, else the token file of ``huggingface-cli login``): it is
never read into this module's messages or logs, and any text of the Hub's that is quoted in an error has it
removed (:func:`_scrub`).

Nothing half-written is left: everything lands in a staging folder beside the target (with huggingface_hub's
own cache in a temporary folder beside it, so the user's ``~/.cache/huggingface`` is not written), is checked
(every file present with the size the tree listing gave), and only then replaces the target by rename, with
the same marker as the other sources (:mod:`cog_triton.weights.cache`): a later fetch of the same ``hf://``
text whose files are intact is skipped without asking the Hub. A branch or tag is therefore not looked up
again once fetched; pin a commit (``@<40 hex>``) or change the text to fetch anew.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Callable, Optional

from cog_triton.fetch.folders import check_free_space, target_lock
from cog_triton.fetch.hub_errors import HubFailure, classify_hub_error
from cog_triton.weights.cache import (
    MARKER_VERSION,
    inventory,
    marker_matches,
    read_marker,
    remove_leftovers,
    replace_directory,
    write_marker,
)
from cog_triton.weights.sources import HubRef
from common.errors import DownloadError, FetchRefusedError, WeightsError
from common.files import KEEP_NAMES
from tensorrtllm_backend.checkpoint import PROCESSOR_FILES

log = logging.getLogger("cog_triton.weights")

CONFIG_NAME = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: Top-level files a checkpoint may have besides its weights and tokenizer (the quantization files are read by
#: the PyTorch backend's ModelConfig.from_pretrained: see tensorrtllm_backend.checkpoint).
METADATA_FILES = ("config.json", "generation_config.json", "hf_quant_config.json", "quant_cfg.json", "dtypes.json")
#: Tokenizer and chat-template files (transformers' AutoTokenizer and chat templates), top level only.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
)  # fmt: skip
TOKENIZER_PATTERNS = ("*.tiktoken",)
#: The repository's own code, fetched only with ``code=True``: top-level Python modules.
CODE_PATTERNS = ("*.py",)
#: Free disk kept beyond the checkpoint's own size when checking for room, bytes.
FREE_SPACE_SLACK_BYTES = 64 << 20


@dataclass(frozen=True)
class HubFetch:
    """What :func:`fetch_hub` left in the target folder.

    Attributes:
        commit: the commit the revision resolved to (40 hex).
        files: the fetched files (paths relative to the target), sorted.
        size_bytes: their total size in bytes.
        skipped: an earlier identical fetch was found intact and reused (no request was made).
    """

    commit: Optional[str]
    files: tuple[str, ...]
    size_bytes: int
    skipped: bool


def fetch_hub(ref: HubRef, target: Path, source_key: str, *, timeout_s: float = 60.0,
              token: Optional[str] = None, code: bool = False, until: Optional[float] = None) -> HubFetch:
    """Fetch the checkpoint ``ref`` names into ``target`` (see the module docstring), under the target's lock.

    Args:
        source_key: the marker key of this source (:attr:`cog_triton.weights.sources.Source.key`).
        timeout_s: seconds to wait for each of the Hub's answers (metadata calls and the ``HEAD`` of each file).
        token: a Hugging Face token for this fetch only (``cog train``'s hf_token input); None: huggingface_hub's
            own lookup (``HF_TOKEN``, the login token file).
        code: also fetch the repository's top-level ``*.py`` files (the operator allowed remote code); a fetch
            without them is not reused for one with them (the marker key differs).
        until: the fetch's deadline (a ``time.monotonic()`` instant), which bounds the wait for another process's
            fetch into ``target``; the Hub calls are held to it by the caller's guard (``hub_guard(..., deadline)``,
            :mod:`cog_triton.fetch.deadline`).

    Raises:
        WeightsError: the repository, revision or files are not there, the repository is gated or private and no
            usable token is set, it holds no ``config.json`` or no safetensors weights, there is no room on disk, or
            the files cannot be written. DownloadError (a WeightsError): the Hub could not be reached, the
            connection broke, it answered with an error, ``HF_ENDPOINT`` answers but is not a Hub, or
            ``HF_HUB_OFFLINE`` is set. FetchDeadlineError (a DownloadError): the deadline passed (the guard's, or
            ``until`` while waiting for the lock). Messages name the reference, and never hold the token.
    """
    if code:
        source_key += "+code"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WeightsError(f"could not prepare {target}: {exc}") from exc
    with target_lock(target, until=until):
        marker = read_marker(target)
        if marker is not None and marker_matches(marker, source_key, None, None, target):
            log.info("weights from %s already present in %s (%d files, commit %s); skipping the fetch",
                     ref.text, target, len(marker["files"]), (marker.get("hub") or {}).get("commit"))
            files = tuple(entry["path"] for entry in marker["files"])
            return HubFetch((marker.get("hub") or {}).get("commit"), files, int(marker["size_bytes"]), True)
        return _fetch_into(ref, target, source_key, timeout_s, token, code)


def _fetch_into(ref: HubRef, target: Path, source_key: str, timeout_s: float, token: Optional[str],
                code: bool) -> HubFetch:
    started = time.monotonic()
    log.info("fetching the checkpoint %s from the Hugging Face Hub into %s", ref.text, target)
    try:
        remove_leftovers(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
        hub_cache = Path(tempfile.mkdtemp(prefix=f".{target.name}.download-", dir=target.parent))
    except OSError as exc:
        raise WeightsError(f"could not prepare {target}: {exc}") from exc
    try:
        commit, files, size = _download(ref, staging, hub_cache, timeout_s, token, code)
        shutil.rmtree(staging / ".cache", ignore_errors=True)  # huggingface_hub's local_dir metadata
        try:
            for name in KEEP_NAMES:
                if (target / name).is_file() and not (staging / name).exists():
                    shutil.copy2(target / name, staging / name)
            write_marker(staging, {
                "version": MARKER_VERSION,
                "source": ref.text,
                "source_key": source_key,
                "sha256": None,
                "size_bytes": size,
                "local": None,
                "hub": {"repo_id": ref.repo_id, "revision": ref.revision, "commit": commit},
                "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "files": inventory(staging),
            })
            os.chmod(staging, stat.S_IMODE(target.stat().st_mode) if target.is_dir() else 0o755)
            replace_directory(staging, target)
        except OSError as exc:
            raise WeightsError(f"could not move the new weights into {target}: {exc}") from exc
    finally:
        shutil.rmtree(hub_cache, ignore_errors=True)
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log.info("checkpoint %s (commit %s) ready in %s: %d files, %d bytes, %.1f s",
             ref.text, commit, target, len(files), size, time.monotonic() - started)
    return HubFetch(commit, tuple(files), size, False)


def select_files(listing: dict[str, int], shards: Optional[list[str]], display: str, code: bool = False) -> list[str]:
    """The files of ``listing`` (path -> size in bytes, the repository's tree) that a checkpoint needs.

    Args:
        shards: the weight files ``model.safetensors.index.json`` names (None: the repository has no index).
        display: the reference, for messages.
        code: also the top-level ``*.py`` files (:data:`CODE_PATTERNS`).

    Raises:
        WeightsError: no ``config.json``, no safetensors weights, or the index names a file the repository lacks.
    """
    top = {path for path in listing if "/" not in path}
    if CONFIG_NAME not in top:
        raise WeightsError(
            f"{display} has no config.json at its top level, so it is not a Hugging Face checkpoint; found "
            f"{_sample(sorted(top))}"
        )
    if shards is not None:
        missing = sorted(set(shards) - set(listing))
        if missing:
            raise WeightsError(f"{display}: {SAFETENSORS_INDEX} names {_sample(missing)}, which the repository lacks")
        weights = [SAFETENSORS_INDEX, *sorted(set(shards))]
    else:
        weights = sorted(path for path in top if path.endswith(".safetensors"))
    if not any(path.endswith(".safetensors") for path in weights):
        others = sorted(p for p in listing if p.endswith((".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")))
        raise WeightsError(
            f"{display} has no safetensors weights (*.safetensors at its top level or in {SAFETENSORS_INDEX}); "
            f"found {_sample(others) if others else 'no weight files'}. The PyTorch backend and this image load "
            "safetensors: give a repository or revision with safetensors weights"
        )
    wanted = [p for p in METADATA_FILES if p in top]
    wanted += [p for p in TOKENIZER_FILES if p in top]
    wanted += sorted(p for p in top if any(fnmatch(p, pattern) for pattern in TOKENIZER_PATTERNS))
    wanted += [p for p in PROCESSOR_FILES if p in top]
    if code:
        wanted += sorted(p for p in top if any(fnmatch(p, pattern) for pattern in CODE_PATTERNS))
    return sorted(set(wanted) | set(weights))


def _sample(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "nothing"


def _lookup_token() -> Optional[str]:
    from huggingface_hub import get_token  # noqa: PLC0415 - only for hf:// sources

    try:
        return get_token()
    except Exception:  # noqa: BLE001 - e.g. an OIDC exchange that fails: no usable token
        return None


def _scrub(text: str, token: Optional[str] = None) -> str:
    """``text`` without the Hugging Face token(s) that may be sent (``token`` and huggingface_hub's own), at most
    300 characters."""
    for secret in (token, _lookup_token()):
        if secret:
            text = text.replace(secret, "<token>")
    return text[:300]


@dataclass(frozen=True)
class _Session:
    """What every Hub call of one fetch uses: the client, the endpoint (None: huggingface_hub's default), the token
    (None: huggingface_hub's own lookup), the seconds to wait for each answer, and where files land."""

    api: Any  # huggingface_hub.HfApi
    hf_hub_download: Callable[..., str]
    endpoint: Optional[str]
    token: Optional[str]
    timeout_s: float
    staging: Path
    hub_cache: Path

    def download(self, repo_id: str, path: str, commit: str) -> str:
        """Fetch the file ``path`` of ``repo_id`` at ``commit`` into the staging folder; return where it landed.

        Raises:
            whatever huggingface_hub raises (classified by the caller).
        """
        return self.hf_hub_download(repo_id, path, revision=commit, local_dir=self.staging, cache_dir=self.hub_cache,
                                    endpoint=self.endpoint, etag_timeout=self.timeout_s, token=self.token)


def _download(ref: HubRef, staging: Path, hub_cache: Path, timeout_s: float,
              token: Optional[str] = None, code: bool = False) -> tuple[str, list[str], int]:
    """Resolve, list, choose and fetch the files into ``staging``; return (commit, files, total bytes).

    Raises:
        WeightsError, DownloadError: as :func:`fetch_hub`; huggingface_hub's failures classified once
            (:func:`_failure_error`).
        FetchRefusedError: the fetch rules refused a connection.
    """
    import huggingface_hub  # noqa: PLC0415 - only for hf:// sources

    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None
    session = _Session(huggingface_hub.HfApi(endpoint=endpoint, token=token), huggingface_hub.hf_hub_download,
                       endpoint, token, timeout_s, staging, hub_cache)
    display = ref.text
    has_token = bool(token or _lookup_token())
    token_note = ("a Hugging Face token is set, but it has no access to it" if has_token
                  else "no Hugging Face token is set (HF_TOKEN)")
    try:
        commit = _resolve_commit(session, ref, has_token)
        listing, files, size = _choose_files(session, ref, commit, code)
        _fetch_files(session, ref, commit, files)
    except (WeightsError, FetchRefusedError):
        raise
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's, its HTTP stack's and the disk's: classified once
        raise _failure_error(classify_hub_error(exc), display, ref, staging, token, token_note) from None
    _check_fetched(staging, files, listing, display)
    return commit, files, size


def _resolve_commit(session: _Session, ref: HubRef, has_token: bool) -> str:
    """The commit (40 hex) ``ref``'s revision names now (``HfApi.model_info``).

    Raises:
        WeightsError: the answer has no commit id, or the repository is gated and no token is set; huggingface_hub's
            errors as they come.
    """
    display = ref.text
    info = session.api.model_info(ref.repo_id, revision=ref.revision, timeout=session.timeout_s)
    commit = str(info.sha or "")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise WeightsError(f"the Hub answered {display} without a commit id (sha {commit[:60]!r}); is HF_ENDPOINT "
                           "a Hugging Face Hub?")
    if info.gated and not has_token:
        raise WeightsError(
            f"{display} is a gated repository ({info.gated!r} approval) and no Hugging Face token is set: accept "
            f"its license on the Hub with your account, then set HF_TOKEN to a token of that account"
        )
    return commit


def _choose_files(session: _Session, ref: HubRef, commit: str, code: bool) -> tuple[dict[str, int], list[str], int]:
    """(the repository's listing: path -> bytes, the files to fetch (:func:`select_files`, the index fetched first
    when there is one), their total bytes), once there is room for them beside the staging folder.

    Raises:
        WeightsError: :func:`select_files`'s and :func:`_index_shards`' refusals, or not enough free disk space;
            huggingface_hub's errors as they come.
    """
    from huggingface_hub.hf_api import RepoFile  # noqa: PLC0415 - only for hf:// sources

    display = ref.text
    listing = {
        entry.path: int(entry.size or 0)
        for entry in session.api.list_repo_tree(ref.repo_id, revision=commit, recursive=True)
        if isinstance(entry, RepoFile)
    }
    shards: Optional[list[str]] = None
    if SAFETENSORS_INDEX in listing:
        shards = _index_shards(Path(session.download(ref.repo_id, SAFETENSORS_INDEX, commit)), display)
    files = select_files(listing, shards, display, code)
    size = sum(listing[path] for path in files)
    check_free_space(session.staging.parent, size + FREE_SPACE_SLACK_BYTES, f"the checkpoint {display}")
    log.info("fetching %d files (%d bytes) of %s at commit %s: %s", len(files), size, display, commit,
             _sample(files, 12))
    return listing, files, size


def _fetch_files(session: _Session, ref: HubRef, commit: str, files: list[str]) -> None:
    """Fetch ``files`` of ``ref`` at ``commit`` into the staging folder, four at a time, as snapshot_download would.

    Each task runs in a copy of this context, so that the fetch rules in force here
    (:func:`cog_triton.fetch.guard.hub_guard`, a context variable) hold in its threads too (snapshot_download's own
    thread pool would start them without it).

    Raises:
        the first failed file's error (huggingface_hub's, or FetchRefusedError).
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="hub-fetch") as pool:
        pending = [pool.submit(contextvars.copy_context().run, session.download, ref.repo_id, path, commit)
                   for path in files]
        for task in pending:
            task.result()


def _failure_error(failure: HubFailure, display: str, ref: HubRef, staging: Path, token: Optional[str],
                   token_note: str) -> WeightsError:
    """The error of a failed fetch (:func:`cog_triton.fetch.hub_errors.classify_hub_error`), the same text under
    huggingface_hub 0.x, 1.x and 2.x: WeightsError for what the repository lacks or the disk refused, DownloadError
    for a Hub that could not be reached or answered with an error (or whose file CDN did). The failure's texts come
    redacted (no signed URL); the token is scrubbed here too."""
    kind = failure.kind
    server = f" ({_scrub(failure.server_message, token)})" if failure.server_message else ""
    if kind == "revision":
        return WeightsError(f"{display}: revision {ref.revision!r} was not found in {ref.repo_id} (give a branch, tag "
                            "or commit of it)")
    if kind == "gated":
        return WeightsError(f"{display} is a gated repository and {token_note}: accept its license on the Hub with "
                            "your account, then set HF_TOKEN to a token of that account")
    if kind == "repository":
        return WeightsError(f"{display}: repository {ref.repo_id} was not found, or it is private and {token_note}")
    if kind == "file":
        return WeightsError(f"{display}: a file listed in the repository was not found at its commit{server}")
    if kind == "offline":
        return DownloadError(f"{display} cannot be fetched: HF_HUB_OFFLINE is set, which forbids reaching the Hub")
    if kind == "http":
        who = "the Hub" if failure.from_hub else f"the Hub's file storage ({failure.answered_by})"
        return DownloadError(f"{display} could not be fetched: {who} answered HTTP {failure.status or '?'}{server}")
    if kind == "not_a_hub":
        return DownloadError(f"{display} could not be fetched: the answer lacks the headers of a Hugging Face Hub "
                             f"(X-Repo-Commit, ETag); is HF_ENDPOINT a Hugging Face Hub? "
                             f"({_scrub(failure.detail, token)})")
    if kind == "unreachable":
        return DownloadError(f"{display} could not be fetched: the Hub could not be reached "
                             f"({_scrub(failure.detail, token)})")
    if kind == "transport":
        return DownloadError(f"{display} could not be fetched: the connection to the Hub failed "
                             f"({_scrub(failure.detail, token)})")
    if kind == "local":
        return WeightsError(f"{display} could not be written to {staging}: {_scrub(failure.text, token)}")
    return DownloadError(f"{display} could not be fetched: {_scrub(failure.detail, token)}")


def _index_shards(path: Path, display: str) -> list[str]:
    """The weight files a ``model.safetensors.index.json`` names (its ``weight_map`` values).

    Raises:
        WeightsError: not JSON, or no ``weight_map`` of file names.
    """
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{display}: {SAFETENSORS_INDEX} is not readable JSON ({exc})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(f"{display}: {SAFETENSORS_INDEX} has no weight_map of tensor names to files")
    shards = sorted(set(weight_map.values()))
    bad = [s for s in shards if s.startswith("/") or ".." in s.split("/")]
    if bad:
        raise WeightsError(f"{display}: {SAFETENSORS_INDEX} names files outside the repository: {_sample(bad)}")
    return shards


def _check_fetched(staging: Path, files: list[str], listing: dict[str, int], display: str) -> None:
    """Every chosen file is in ``staging`` with the size the tree listing gave.

    Raises:
        WeightsError: naming the first files that are missing or of another size.
    """
    problems = []
    for path in files:
        try:
            size = (staging / path).stat().st_size
        except OSError:
            problems.append(f"{path} (missing)")
            continue
        if size != listing[path]:
            problems.append(f"{path} ({size} bytes, the Hub lists {listing[path]})")
    if problems:
        raise WeightsError(f"{display} was not fetched whole: {_sample(problems)}")


__all__ = ("HubFetch", "fetch_hub", "select_files")
