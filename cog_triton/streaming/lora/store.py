"""The local disk cache of LoRA adapters, shared by every stream process of the predictor.

An adapter is fetched once per source into ``<root>/adapters/<source key>/`` and reused from there:

* ``https://`` / ``http://`` archives with the weights' fetcher, :func:`cog_triton.weights.fetch_weights`
  (bounded: timeouts, retries, a deadline, a minimum rate, a byte cap on the download and on what the
  archive unpacks to; verified: Content-Length, tar/zip member rules; locked: one fetch per folder across
  processes with ``flock``, the folder replaced by an atomic rename; and skipped when its marker shows the
  same source already in place, so a cached adapter is never downloaded twice).
* ``hf://owner/repo[@revision]`` with ``huggingface_hub.hf_hub_download`` (its retries, resume and
  ``HF_TOKEN``; huggingface_hub 0.x, 1.x or 2.x), the two files' sizes checked first (their ``HEAD``), under the
  same folder lock, staged beside the folder and renamed into place.

Both are held to the fetch rules (:attr:`StoreLimits.rules`, :mod:`cog_triton.fetch.rules`): the reference is
checked first (scheme, host and Hub owner allow-lists, an IP-literal host), then every connection of the
download and its redirects (the address actually connected to); a refusal is a :class:`LoraAdapterError`
naming the rule, and nothing is sent to a refused address.

**What one adapter may cost** (:func:`adapter_cap`): its download and everything its archive unpacks to are held
to the smaller of ``max_adapter_bytes`` and the largest adapter the model serves
(:meth:`tensorrtllm_backend.lora.LoraSpec.largest_adapter_file_bytes`: rank max_lora_rank on the engine's modules at
its sizes, as a float32 file) plus ``extra_bytes`` for its other files, refused before anything beyond it is read;
an archive may have at most ``max_members`` members, counted before anything is written, and unpacking it counts
against the fetch's deadline (:func:`cog_triton.weights.fetch_weights`). adapter_config.json is read as data
(:mod:`cog_triton.streaming.lora.peft_config`) and adapter_model.safetensors is hashed a chunk at a time, never held
whole (the converter reads it a module at a time: :mod:`cog_triton.streaming.lora.convert`).

**A refused adapter leaves nothing in the cache**: a folder that is not a PEFT adapter, or whose adapter is refused
(:meth:`AdapterStore.get`, and :meth:`AdapterStore.discard` after a conversion refused it), is removed at once.

**Eviction.** The cache is bounded by ``budget_bytes`` (LRU): after each fetch, the folders used least recently
(the folder's mtime, set on every use) are removed until the rest fits. Each folder's size is counted once, when it
is first read, and kept in it (:data:`SIZE_RECORD`), so that eviction reads one small file per cached adapter,
whatever the adapters' archives held (an eviction used to walk every file of every folder). The candidates, oldest
first, are skipped when they are the folder just used (``keep``) or being fetched (their lock is held):
:meth:`AdapterStore._evictable` is the one place that decides, where a folder in use by a running request can be
kept too (its id pinned while live). Removal renames the folder away first (:meth:`AdapterStore._remove`), so a
reader never sees half a folder; a reader whose folder vanished fetches it again (once).

Every adapter read from the cache is identified by its content: the sha256 of ``adapter_config.json`` and
``adapter_model.safetensors`` (:attr:`LocalAdapter.sha256`), whatever URL it came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.errors import FetchDeadlineError, FetchRefusedError, LoraAdapterError, WeightsError
from common.files import CHUNK_BYTES
from cog_triton.fetch.deadline import FetchDeadline
from cog_triton.fetch.folders import target_lock
from cog_triton.fetch.guard import hub_guard
from cog_triton.stream_config import StoreLimits
from cog_triton.fetch.hub_errors import HubFailure, classify_hub_error
from cog_triton.fetch.adapter_refs import WHAT, AdapterRef, check_adapter_allowed
from cog_triton.streaming.lora.peft_config import CONFIG_MAX_BYTES, parse_config
from cog_triton.weights import fetch_weights
from tensorrtllm_backend.lora import LoraSpec

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
#: Written into an hf:// folder once both files are in place (the http(s) fetcher writes its own marker).
HF_MARKER = ".cog-triton-hf.json"
#: The setting of an adapter's deadline (its messages name it).
DEADLINE_SETTING = "COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S"
#: Written into each cached folder once it is read: the bytes of its files (a decimal number), for eviction.
SIZE_RECORD = ".cog-triton-bytes"


def adapter_cap(limits: StoreLimits, spec: Optional[LoraSpec]) -> tuple[int, str]:
    """The most bytes one adapter may download and unpack to, and why (for messages: the settings that set it and
    how to raise it): the smaller of ``limits.max_adapter_bytes`` and, when ``spec`` serves LoRA, the largest
    adapter it serves plus ``limits.extra_bytes``."""
    setting = f"COG_TRITON_ADAPTER_MAX_BYTES={limits.max_adapter_bytes}"
    if spec is None or not spec.enabled or spec.shape is None:
        return limits.max_adapter_bytes, setting
    servable = spec.largest_adapter_file_bytes() + limits.extra_bytes
    if servable >= limits.max_adapter_bytes:
        return limits.max_adapter_bytes, setting
    return servable, (f"the largest adapter this model serves, {spec.describe_largest_adapter()}, plus "
                      f"{limits.extra_bytes} bytes for its other files (COG_TRITON_ADAPTER_EXTRA_BYTES)")


def _adapter_words(exc: WeightsError) -> str:
    """A weights fetcher's message with the adapter's settings in place of the weights' ones."""
    message = exc.message.replace("COG_TRITON_MAX_EXTRACTED_BYTES", "COG_TRITON_ADAPTER_MAX_BYTES")
    return message.replace("COG_TRITON_DOWNLOAD_DEADLINE_S", DEADLINE_SETTING)


@dataclass(frozen=True)
class LocalAdapter:
    """An adapter read from the cache.

    Attributes:
        ref: what the request named.
        config: the parsed adapter_config.json, its values checked (:func:`cog_triton.streaming.lora.peft_config.
            parse_config`).
        weights_path: adapter_model.safetensors in the cache (read by the converter a module at a time).
        weights_bytes: its size.
        sha256: hex sha256 over adapter_config.json's bytes then adapter_model.safetensors' bytes.
        folder: the cached folder holding the two files (the PyTorch backend's LLM API loads it as it is).
    """

    ref: AdapterRef
    config: dict
    weights_path: Path
    weights_bytes: int
    sha256: str
    folder: Optional[Path] = None


class AdapterStore:
    """Fetches adapters into the disk cache and reads them (thread- and process-safe; blocking).

    Args:
        limits: the cache and download bounds.
        spec: what the served model accepts, which bounds what one adapter may cost (:func:`adapter_cap`); None: only
            the settings do.
    """

    def __init__(self, limits: StoreLimits, spec: Optional[LoraSpec] = None) -> None:
        self.limits = limits
        self.cap_bytes, self.cap_reason = adapter_cap(limits, spec)
        self.folder = limits.root / "adapters"
        # Since the last take_counts(): "disk_hits" (found in the cache), "fetches" (downloaded into it).
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    def take_counts(self) -> dict[str, int]:
        """The cache hits and downloads since the last call (``disk_hits``, ``fetches``), and start again."""
        with self._counts_lock:
            counts, self._counts = dict(self._counts), Counter()
        return counts

    def get(self, ref: AdapterRef, deadline_at: Optional[float] = None) -> LocalAdapter:
        """The adapter ``ref`` names, fetched when it is not cached (blocking: up to the download deadline).

        Args:
            deadline_at: when the fetch's deadline ends (a ``time.monotonic()`` instant; default: ``deadline_s``
                from now).

        Raises:
            LoraAdapterError: the fetch rules refuse it (its URL, Hub owner, a redirect or an address it resolves
                to), it could not be fetched (unreachable, HTTP error, over :attr:`cap_bytes` or the member limit,
                corrupt archive, the deadline passed while downloading or unpacking it), or it is not a PEFT LoRA
                adapter (no adapter_config.json / adapter_model.safetensors, or a config value of the wrong type or
                out of range); a refused adapter's folder is removed.
        """
        check_adapter_allowed(ref, self.limits.rules)
        if deadline_at is None:
            deadline_at = time.monotonic() + self.limits.deadline_s
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LoraAdapterError(f"cannot create the adapter cache {self.folder}: {exc}") from exc
        target = self.folder / ref.key
        for attempt in (1, 2):
            started = time.monotonic()
            if ref.kind == "hf":
                downloaded = self._fetch_hf(ref, target, deadline_at)
            else:
                downloaded = self._fetch_url(ref, target, deadline_at)
            with self._counts_lock:
                self._counts["fetches" if downloaded else "disk_hits"] += 1
            try:
                os.utime(target)  # last use, for the LRU
                adapter = self._read(ref, target)
                _folder_bytes(target)  # counted once, here, for eviction
            except FileNotFoundError:
                if attempt == 2:
                    raise LoraAdapterError(f"lora_weights {ref.display}: the cached adapter vanished twice while "
                                           "being read (the adapter cache is smaller than one adapter?)") from None
                log.info("adapter %s was evicted while being read; fetching it again", ref.display)
                continue
            except LoraAdapterError:
                self.discard(ref)
                raise
            log.info("adapter %s ready (sha256 %s, %d bytes) in %.2f s", ref.display, adapter.sha256[:12],
                     adapter.weights_bytes, time.monotonic() - started)
            self.evict(keep=target)
            return adapter
        raise AssertionError("unreachable")

    def touch(self, ref: AdapterRef) -> None:
        """Mark ``ref``'s folder used now (for the LRU), when a process serves it from memory.

        Raises:
            OSError: the folder is gone.
        """
        os.utime(self.folder / ref.key)

    def discard(self, ref: AdapterRef) -> None:
        """Remove ``ref``'s folder from the cache: its adapter was refused (a refused adapter leaves nothing behind).
        Left alone while another process fetches into it (that fetch ends the same way)."""
        if self._remove(self.folder / ref.key):
            log.info("adapter %s was refused: removed from the adapter cache", ref.display)

    # ------------------------------------------------------------------ fetching
    def _fetch_url(self, ref: AdapterRef, target: Path, deadline_at: float) -> bool:
        """Fetch ``ref`` into ``target`` unless it is there; True when it was downloaded."""
        limits = self.limits
        try:
            result = fetch_weights(
                ref.source, target, timeout_s=limits.timeout_s, retries=limits.retries, deadline_s=limits.deadline_s,
                min_rate_bytes_s=limits.min_rate_bytes_s, rate_grace_s=limits.rate_grace_s,
                max_extracted_bytes=self.cap_bytes, max_download_bytes=self.cap_bytes, limit_reason=self.cap_reason,
                max_members=limits.max_members, members_setting="COG_TRITON_ADAPTER_MAX_MEMBERS",
                unpack_in_deadline=True, allow_zip=True, rules=limits.rules, what=WHAT, deadline_at=deadline_at,
            )
        except FetchRefusedError as exc:
            raise LoraAdapterError(f"lora_weights {ref.display} is refused: {exc.message}") from None
        except WeightsError as exc:
            raise LoraAdapterError(f"lora_weights {ref.display} could not be fetched: {_adapter_words(exc)}") \
                from None
        return not result.skipped

    def _fetch_hf(self, ref: AdapterRef, target: Path, deadline_at: float) -> bool:
        """Download ``ref`` from the Hub into ``target`` unless it is there; True when it was downloaded."""
        deadline = FetchDeadline(self.limits.deadline_s, at=deadline_at, what=f"the fetch of {ref.display}",
                                 setting=DEADLINE_SETTING)
        try:
            with target_lock(target, until=deadline_at):
                return self._fetch_hf_locked(ref, target, deadline)
        except FetchDeadlineError as exc:
            ours = deadline.error().message
            message = exc.message if exc.message.startswith(ours) else f"{ours}: {exc.message}"
            raise LoraAdapterError(f"lora_weights {ref.display} could not be fetched: {message}") from None
        except LoraAdapterError:
            if deadline.passed():  # whatever the Hub client made of a connection the watchdog ended
                raise LoraAdapterError(f"lora_weights {ref.display} could not be fetched: "
                                       f"{deadline.error().message}") from None
            raise

    def _fetch_hf_locked(self, ref: AdapterRef, target: Path, deadline: FetchDeadline) -> bool:
        """:meth:`_fetch_hf` with the folder's lock held; every Hub call under the fetch rules and ``deadline``."""
        if (target / HF_MARKER).is_file() and all((target / name).is_file() for name in ADAPTER_FILES):
            return False
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
        try:
            with deadline, hub_guard(self.limits.rules, WHAT, deadline):
                commit = _hf_download(ref, staging, self.limits, self.cap_bytes, self.cap_reason)
            (staging / HF_MARKER).write_text(json.dumps({"source": ref.source, "commit": commit}) + "\n")
            if target.exists():
                old = target.parent / f".{target.name}.old-{secrets.token_hex(4)}"
                os.rename(target, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    # ------------------------------------------------------------------ reading
    def _read(self, ref: AdapterRef, target: Path) -> LocalAdapter:
        """Read the adapter in ``target`` (or in its only visible subfolder).

        Raises:
            FileNotFoundError: the folder vanished (evicted by another process).
            LoraAdapterError: the files are not a PEFT LoRA adapter.
        """
        if not target.is_dir():
            raise FileNotFoundError(target)
        root = target
        if not (root / ADAPTER_CONFIG).is_file():
            visible = [p for p in target.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
            if len(visible) == 1 and visible[0].is_dir():
                root = visible[0]
        config_path, weights_path = root / ADAPTER_CONFIG, root / ADAPTER_WEIGHTS
        if not config_path.is_file() or not weights_path.is_file():
            found = sorted(str(p.relative_to(target)) for p in target.rglob("*")
                           if p.is_file() and not p.name.startswith(".") and ".cache" not in p.parts)[:10]
            bin_hint = (" (adapter_model.bin is a pickle, which is not loaded: save the adapter with safetensors, "
                        "the default of peft's save_pretrained)") if (root / "adapter_model.bin").is_file() else ""
            raise LoraAdapterError(
                f"lora_weights {ref.display} is not a PEFT LoRA adapter: it needs {ADAPTER_CONFIG} and "
                f"{ADAPTER_WEIGHTS} at its top level (or in its only folder){bin_hint}; found: "
                f"{', '.join(found) or 'no files'}"
            )
        size = config_path.stat().st_size
        if size > CONFIG_MAX_BYTES:
            raise LoraAdapterError(f"lora_weights {ref.display}: {ADAPTER_CONFIG} has {size} bytes; at most "
                                   f"{CONFIG_MAX_BYTES} are allowed")
        with open(config_path, "rb") as fh:
            config_bytes = fh.read(CONFIG_MAX_BYTES + 1)
        config = parse_config(config_bytes, ref.display)
        digest = hashlib.sha256(config_bytes)
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        weights_bytes = 0
        with open(weights_path, "rb") as fh:  # a chunk at a time: never the whole file in memory
            while count := fh.readinto(buffer):
                digest.update(view[:count])
                weights_bytes += count
        return LocalAdapter(ref=ref, config=config, weights_path=weights_path, weights_bytes=weights_bytes,
                            sha256=digest.hexdigest(), folder=root)

    # ------------------------------------------------------------------ eviction
    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use as mtime, bytes, folder) of every cached adapter: one ``stat`` and one small read per adapter
        (its :data:`SIZE_RECORD`), whatever its folder holds."""
        out = []
        if not self.folder.is_dir():
            return out
        for entry in self.folder.iterdir():
            if entry.name.startswith("."):  # locks, staging and folders being removed
                continue
            try:
                if not entry.is_dir():
                    continue
                used = entry.stat().st_mtime
                size = _folder_bytes(entry)
            except OSError:
                continue
            out.append((used, size, entry))
        return out

    def _evictable(self, folder: Path, keep: Optional[Path]) -> bool:
        """Whether eviction may take ``folder``, beyond its lock (:meth:`_remove` leaves a folder being fetched): not
        the folder just used. The one place that says which cached adapters stay whatever their age."""
        return keep is None or folder != keep

    def evict(self, keep: Optional[Path] = None) -> list[Path]:
        """Remove the least recently used adapters until the cache fits ``budget_bytes``; never ``keep``, nor
        one being fetched, nor anything while another process evicts. Returns the folders removed."""
        removed: list[Path] = []
        with target_lock(self.folder / ".evict", wait=False) as held:
            if not held:
                return removed
            entries = sorted(self.entries(), key=lambda e: e[0])
            total = sum(size for _, size, _ in entries)
            for _, size, folder in entries:
                if total <= self.limits.budget_bytes:
                    break
                if not self._evictable(folder, keep) or not self._remove(folder):
                    continue
                total -= size
                removed.append(folder)
                log.info("adapter cache over its budget of %d bytes: evicted %s (%d bytes)",
                         self.limits.budget_bytes, folder.name, size)
        return removed

    def _remove(self, folder: Path) -> bool:
        """Remove ``folder`` (renamed away under its lock first, so no reader sees half of it); False when another
        process is fetching into it, or it is gone."""
        with target_lock(folder, wait=False) as free:
            if not free:
                return False
            old = folder.parent / f".{folder.name}.old-{secrets.token_hex(4)}"
            try:
                os.rename(folder, old)
            except OSError:
                return False
        shutil.rmtree(old, ignore_errors=True)
        return True


def _folder_bytes(folder: Path) -> int:
    """The bytes of the files in ``folder``: its :data:`SIZE_RECORD`, else counted (every file under it, links not
    followed) and recorded there. A cached folder holds what one adapter archive unpacked to, at most
    ``max_members`` files, so counting it once is bounded.

    Raises:
        OSError: the folder is gone.
    """
    record = folder / SIZE_RECORD
    try:
        return int(record.read_text())
    except (OSError, ValueError):
        pass
    total, pending = 0, [str(folder)]
    while pending:
        with os.scandir(pending.pop()) as scan:
            for entry in scan:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    try:
        partial = folder / f".{SIZE_RECORD}.{secrets.token_hex(4)}"
        partial.write_text(str(total))
        os.replace(partial, record)
    except OSError:
        pass  # counted again next time
    return total


def _hf_download(ref: AdapterRef, staging: Path, limits: StoreLimits, cap_bytes: int, cap_reason: str) -> str:
    """Download the adapter's two files from the Hub into ``staging``; return the commit.

    Each file's size and commit come first from its ``HEAD`` (``get_hf_file_metadata`` of its ``hf_hub_url``: the
    same call in huggingface_hub 0.x, 1.x and 2.x; 2.x's ``hf_hub_download(dry_run=True)`` does that too, but 0.x
    has no ``dry_run``), so an adapter over ``cap_bytes`` (why: ``cap_reason``) is refused before any body is
    downloaded.

    Raises:
        LoraAdapterError: refused by the fetch rules, no such repository, revision or file, too large, or the
            download failed; the same text under each major of huggingface_hub (:mod:`cog_triton.fetch.hub_errors`).
    """
    import huggingface_hub  # noqa: PLC0415 - only for hf:// references

    current = ADAPTER_FILES[0]
    try:
        infos = []
        for current in ADAPTER_FILES:
            url = huggingface_hub.hf_hub_url(ref.repo_id, current, revision=ref.revision)
            infos.append(huggingface_hub.get_hf_file_metadata(url, timeout=limits.timeout_s))
        size = sum(info.size or 0 for info in infos)
        if size > cap_bytes:
            raise LoraAdapterError(
                f"lora_weights {ref.display} has {size} bytes of adapter files, more than the {cap_bytes} allowed "
                f"({cap_reason})"
            )
        for current in ADAPTER_FILES:
            huggingface_hub.hf_hub_download(ref.repo_id, current, revision=ref.revision, local_dir=staging,
                                            etag_timeout=limits.timeout_s)
        return str(infos[0].commit_hash)
    except FetchRefusedError as exc:
        raise LoraAdapterError(f"lora_weights {ref.display} is refused: {exc.message}") from None
    except LoraAdapterError:
        raise
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's, its HTTP stack's and the disk's: classified once
        failure = classify_hub_error(exc)
        if failure.kind == "other" and not isinstance(exc, ValueError):
            raise
        raise _hf_failure(ref, failure, current) from None


def _hf_failure(ref: AdapterRef, failure: HubFailure, filename: str) -> LoraAdapterError:
    """The error of a failed Hub download of ``filename`` (the file being fetched when it failed)."""
    if failure.kind == "file":
        return LoraAdapterError(f"lora_weights {ref.display} is not a PEFT LoRA adapter: the repository has no "
                                f"{filename} (it needs {' and '.join(ADAPTER_FILES)})")
    if failure.kind == "revision":
        return LoraAdapterError(f"lora_weights {ref.display}: revision {ref.revision!r} not found")
    if failure.kind in ("repository", "gated"):
        return LoraAdapterError(f"lora_weights {ref.display}: repository {ref.repo_id} not found, or private (set "
                                "HF_TOKEN)")
    reason = {
        "offline": "HF_HUB_OFFLINE is set, which forbids reaching the Hub",
        "http": f"the Hub answered HTTP {failure.status or '?'}",
        "not_a_hub": "the answer lacks the headers of a Hugging Face Hub (is HF_ENDPOINT a Hugging Face Hub?)",
        "unreachable": "the Hub could not be reached",
        "transport": "the connection to the Hub failed",
        "local": "it could not be written here",
    }.get(failure.kind, "")
    detail = failure.detail[:300]
    return LoraAdapterError(f"lora_weights {ref.display} could not be downloaded: "
                            + (f"{reason} ({detail})" if reason else detail))


__all__ = ("ADAPTER_CONFIG", "ADAPTER_FILES", "ADAPTER_WEIGHTS", "SIZE_RECORD", "AdapterStore", "LocalAdapter",
           "StoreLimits", "adapter_cap")
