"""The LoRA adapters one LLM of the PyTorch-backend ``tensorrt_llm`` model has been given over its life.

Two facts of TensorRT-LLM 1.2.1 shape this (the sources are in ``model.py``'s docstring):

* the LLM keeps every distinct adapter it has loaded for its whole life: the worker's ``LoraManager`` never forgets
  an id and keeps each adapter's device tensors (``_lora_weights``, which never shrinks), and may read an id's folder
  again whenever the engine's own adapter cache no longer holds it;
* a folder it cannot read stops its executor worker, and the LLM with it, for every request.

So, per LLM life (:class:`AdapterLife`):

* each adapter id the LLM is given maps to one folder the model owns, a **snapshot** of the client's folder in
  ``<snapshot dir>/<life>/<id>`` (hard links to the checked files, or a copy when the client's folder is on another
  file system): the adapter disk cache, or a client, may remove or replace its folder while the id is live, and the
  LLM still reads what was checked. The snapshots are removed when the LLM is recycled or the model unloaded;
* the number of distinct ids is bounded (``max_adapters_per_llm``): past it, the model recycles the LLM
  (``model.py`` :meth:`model.TritonPythonModel._recycle`), which releases everything the old one kept.

Pure file-system work, called off the event loop (blocking: a copy may read many MB).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from .parsing import RequestError
from .translate import ADAPTER_FILES, AdapterFacts, adapter_signature, check_adapter

log = logging.getLogger(__name__)

#: Folders whose check is remembered (path -> facts, valid while the files' signature is unchanged).
VERIFIED_FOLDERS = 1024


@dataclass(frozen=True)
class LiveAdapter:
    """An adapter id the current LLM was given: its snapshot (what the LLM reads), its content digest, and the folder
    it was first served from (for messages)."""

    snapshot: str
    digest: str
    source: str


class VerifiedFolders:
    """:func:`check_adapter` results by folder, reused while the folder's files are unchanged
    (:func:`adapter_signature`: a few ``stat`` calls instead of reading the adapter again). Not thread-safe: the
    event loop's."""

    def __init__(self, limit: int = VERIFIED_FOLDERS) -> None:
        self.limit = limit
        self._facts: "OrderedDict[str, AdapterFacts]" = OrderedDict()

    def cached(self, path: str) -> Optional[AdapterFacts]:
        """The facts of ``path`` when it was checked and is unchanged since, else None."""
        facts = self._facts.get(path)
        if facts is None:
            return None
        if adapter_signature(path) != facts.signature:
            del self._facts[path]
            return None
        self._facts.move_to_end(path)
        return facts

    def remember(self, path: str, facts: AdapterFacts) -> None:
        self._facts[path] = facts
        self._facts.move_to_end(path)
        while len(self._facts) > self.limit:
            self._facts.popitem(last=False)


class AdapterLife:
    """The adapters of one LLM (see the module docstring).

    Args:
        folder: this life's snapshot folder (created; removed by :meth:`close`).
        limit: the most distinct ids one LLM is given (``max_adapters_per_llm``); 0: no bound.
    """

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self.live: Dict[int, LiveAdapter] = {}
        self.pending: Dict[int, object] = {}  # id -> the asyncio future of its snapshot being made (event loop)
        folder.mkdir(parents=True, exist_ok=True)

    def full(self) -> bool:
        """Whether one more distinct id would pass the bound."""
        return self.limit > 0 and len(self.live) + len(self.pending) >= self.limit

    def snapshot(self, task_id: int, path: str, facts: AdapterFacts) -> str:
        """Make ``task_id``'s snapshot of the checked folder ``path`` and return it (blocking). Hard links when the
        file system allows them (no bytes copied; the files stay while the snapshot does, whatever removes the
        original), else a copy, checked again.

        Raises:
            RequestError: the folder changed since it was checked, or cannot be linked or copied.
        """
        target = self.folder / str(task_id)
        staging = self.folder / f".{task_id}.{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            linked = True
            for name in ADAPTER_FILES:
                source = os.path.join(path, name)
                if not os.path.isfile(source):
                    continue
                try:
                    os.link(source, staging / name)
                except OSError:
                    linked = False
                    shutil.copy2(source, staging / name)
            if linked:  # the same inodes: unchanged since the check when size, mtime and inode are
                if adapter_signature(str(staging)) != facts.signature:
                    raise RequestError(f"lora_path {path} changed while it was being checked; send the request again")
            elif check_adapter(str(staging)).digest != facts.digest:
                raise RequestError(f"lora_path {path} changed while it was being copied; send the request again")
            os.rename(staging, target)
        except OSError as exc:
            raise RequestError(f"lora_path {path} could not be prepared for the LLM ({exc})") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return str(target)

    def add(self, task_id: int, snapshot: str, facts: AdapterFacts, source: str) -> LiveAdapter:
        live = LiveAdapter(snapshot, facts.digest, source)
        self.live[task_id] = live
        return live

    def close(self) -> None:
        """Remove this life's snapshots (the LLM that read them is gone)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def life_folder(root: Path, number: int) -> Path:
    """The snapshot folder of this process's LLM life ``number`` under ``root``."""
    return root / f"{os.getpid()}-{number}"


def remove_stale_lives(root: Path) -> Tuple[str, ...]:
    """Remove the snapshot folders under ``root`` of processes that no longer run (a Triton that was killed); return
    their names."""
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return ()
    for entry in entries:
        pid, _, _ = entry.name.partition("-")
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (another model's)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return tuple(removed)


__all__ = ["AdapterLife", "LiveAdapter", "VERIFIED_FOLDERS", "VerifiedFolders", "life_folder", "remove_stale_lives"]
