"""The fetched folder on disk: the marker that lets an identical fetch be skipped, and the staging folder that
replaces the target atomically. The folder's lock is :func:`cog_triton.fetch.folders.target_lock` (the LoRA adapter
cache takes it too).

Part of :mod:`cog_triton.weights` (its public face is the package); :mod:`cog_triton.weights.install` and
:mod:`cog_triton.weights.hub` use these helpers.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from common.errors import WeightsError
from common.files import KEEP_NAMES, MARKER_NAME, VERIFIED_NAME

log = logging.getLogger("cog_triton.weights")


#: The marker's format; a marker of another version never matches (the folder is fetched again).
MARKER_VERSION = 1


def read_marker(target: Path) -> Optional[dict[str, Any]]:
    """The marker (:data:`~common.files.MARKER_NAME`) in ``target``, or None when it is missing, unreadable or not
    a marker (no ``files`` list). Never raises."""
    try:
        data = json.loads((target / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    return data


def write_marker(directory: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as the marker of ``directory`` (JSON, sorted keys).

    Raises:
        OSError: it could not be written.
    """
    (directory / MARKER_NAME).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def marker_matches(
    marker: dict[str, Any], key: str, expected_sha: Optional[str], fingerprint: Optional[dict[str, Any]], target: Path
) -> bool:
    """True when ``marker`` records the same fetch (version, source ``key``, the ``expected_sha`` when one is given,
    the local source's ``fingerprint``) and every file it lists is still in ``target`` with its recorded size in
    bytes (a symlink with its recorded target). Never raises: anything unreadable is False."""
    if marker.get("version") != MARKER_VERSION or marker.get("source_key") != key:
        return False
    if expected_sha is not None and marker.get("sha256") != expected_sha:
        return False
    if marker.get("local") != fingerprint:
        return False
    if not isinstance(marker.get("size_bytes"), int):
        return False
    for entry in marker["files"]:
        try:
            rel = PurePosixPath(entry["path"])
            if rel.is_absolute() or ".." in rel.parts:
                return False
            st = os.lstat(target / rel)
            if "link" in entry:
                if not stat.S_ISLNK(st.st_mode) or os.readlink(target / rel) != entry["link"]:
                    return False
            elif not stat.S_ISREG(st.st_mode) or st.st_size != entry["size"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def inventory(root: Path) -> list[dict[str, Any]]:
    """Regular files (with size in bytes) and symlinks (with target) under ``root``, sorted by path: the marker's
    ``files``. The marker, ``.gitkeep`` and verification records are left out.

    Raises:
        OSError: a file vanished while being listed.
    """
    entries: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        names = filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in names:
            if rel_dir == "." and (name == MARKER_NAME or name in KEEP_NAMES) or name == VERIFIED_NAME:
                continue
            full = os.path.join(dirpath, name)
            rel = PurePosixPath(rel_dir, name).as_posix()
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                entries.append({"path": rel, "link": os.readlink(full)})
            elif stat.S_ISREG(st.st_mode):
                entries.append({"path": rel, "size": st.st_size})
    entries.sort(key=lambda e: e["path"])
    return entries


def remove_leftovers(target: Path) -> None:
    """Delete staging folders and partial downloads that an interrupted earlier fetch left beside ``target``.

    Raises:
        OSError: ``target``'s parent cannot be listed.
    """
    prefixes = tuple(f".{target.name}.{what}-" for what in ("staging", "download", "old"))
    for entry in target.parent.iterdir():
        if entry.name.startswith(prefixes):
            log.info("removing leftover %s from an interrupted fetch", entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def replace_directory(staging: Path, target: Path) -> None:
    """Make ``staging`` the new ``target``: two renames, or a move of the contents when renaming fails (a
    ``.gitkeep`` in ``target`` is kept then).

    Raises:
        OSError: neither worked; ``target`` is as it was.
    """
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    if target.is_symlink():
        _replace_contents(staging, target)
        return
    old = target.parent / f".{target.name}.old-{secrets.token_hex(4)}"
    try:
        os.rename(target, old)
    except OSError as exc:
        # e.g. EXDEV for a directory of a lower overlayfs layer, EBUSY for a mount point
        log.info("could not rename %s (%s); replacing its contents in place", target, exc)
        _replace_contents(staging, target)
        return
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _replace_contents(staging: Path, target: Path) -> None:
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    moved_out: list[str] = []
    moved_in: list[str] = []
    try:
        for child in list(target.iterdir()):
            if child.name not in KEEP_NAMES:
                shutil.move(os.fspath(child), os.fspath(old / child.name))
                moved_out.append(child.name)
        for child in list(staging.iterdir()):
            if child.name in KEEP_NAMES and (target / child.name).exists():
                continue
            shutil.move(os.fspath(child), os.fspath(target / child.name))
            moved_in.append(child.name)
    except BaseException:
        for name in moved_in:
            path = target / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for name in moved_out:
            shutil.move(os.fspath(old / name), os.fspath(target / name))
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def copy_directory(source: Path, staging: Path, display: str) -> None:
    """Copy the folder ``source`` into ``staging``, files behind symlinks as files, without its marker and
    verification records (``display``: the source as shown in messages).

    Raises:
        WeightsError: a file could not be read or written, or the folders nest too deeply to copy.
    """
    def ignore(dirpath: str, names: list[str]) -> list[str]:
        ignored = [VERIFIED_NAME] if VERIFIED_NAME in names else []  # vouches for the source's files, not ours
        return ignored + ([MARKER_NAME] if Path(dirpath) == source and MARKER_NAME in names else [])

    try:
        # symlinks=False: linked files are copied (Hugging Face cache snapshots are symlinks to blobs)
        shutil.copytree(source, staging, symlinks=False, ignore=ignore, dirs_exist_ok=True)
    except shutil.Error as exc:
        problems = exc.args[0] if exc.args and isinstance(exc.args[0], list) else [exc]
        shown = "; ".join(str(p[-1]) if isinstance(p, tuple) else str(p) for p in problems[:3])
        raise WeightsError(f"could not copy the weights directory {display}: {shown}") from exc
    except OSError as exc:
        raise WeightsError(f"could not copy the weights directory {display}: {exc}") from exc
    except RecursionError:  # shutil.copytree recurses once per folder level
        raise WeightsError(f"the weights directory {display} nests folders too deeply to copy") from None


__all__ = (
    "MARKER_VERSION", "copy_directory", "inventory", "marker_matches", "read_marker", "remove_leftovers",
    "replace_directory", "write_marker",
)  # fmt: skip
