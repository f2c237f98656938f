"""The fetched folder on disk: the per-target lock, the marker that lets an identical fetch be skipped, and
the staging folder that replaces the target atomically.

Part of :mod:`cog_triton.weights` (its public face is the package).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Iterator, Optional

from common.errors import FetchDeadlineError, WeightsError
from common.files import KEEP_NAMES, MARKER_NAME, VERIFIED_NAME

log = logging.getLogger("cog_triton.weights")


MARKER_VERSION = 1


@contextmanager
def _exclusive_lock(target: Path, until: Optional[float] = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<target name>.lock`` in ``target``'s parent for the block.

    A second process blocks until the first is done (or dies: the kernel drops its lock), or, with ``until`` (a
    ``time.monotonic()`` instant: the fetch's deadline), until then at most. The
    file is removed while still locked; a waiter that then gets the lock on the removed file sees
    that its inode is no longer the path's and locks the new file instead, so there is never more
    than one holder.

    Where the lock file cannot be created for lack of permission or a read-only file system, the
    block runs unlocked (with a warning): nothing can be fetched there anyway, and weights that are
    already in place are still found and reused.

    Raises:
        WeightsError: the lock file cannot be created or locked for another reason.
        FetchDeadlineError: ``until`` came while another process held the lock.
    """
    path = target.parent / f".{target.name}.lock"
    fd = _acquire_lock(path, target, until=until)
    if fd is None:
        yield
        return
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


@contextmanager
def target_lock(target: Path, *, wait: bool = True, until: Optional[float] = None) -> Iterator[bool]:
    """The lock :func:`fetch_weights` holds on ``target`` while it fetches into it, for other writers of the
    same folder (the LoRA adapter cache evicts and fills its folders under it).

    Yields True when held; with ``wait=False``, False (at once) when another process holds it. Where no
    lock file can be made (read-only file system) it yields True unlocked, as fetch_weights does. ``until``: as
    :func:`_exclusive_lock`'s.

    Raises:
        WeightsError: the lock file cannot be created or locked for another reason.
        FetchDeadlineError: ``until`` came while another process held the lock.
    """
    path = target.parent / f".{target.name}.lock"
    try:
        fd = _acquire_lock(path, target, wait=wait, until=until)
    except BlockingIOError:
        yield False
        return
    if fd is None:
        yield True
        return
    try:
        yield True
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


#: Waiting for a lock with a deadline polls it: first after this many seconds, then twice as long each time ...
LOCK_POLL_S = 0.02
#: ... up to this many.
LOCK_POLL_MAX_S = 0.5


def _wait_for_lock(fd: int, target: Path, until: Optional[float]) -> None:
    """Block until ``fd``'s exclusive ``flock`` is held; with ``until``, poll it (``flock`` has no timeout) and give
    up then.

    Raises:
        FetchDeadlineError: ``until`` came first.
    """
    if until is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    pause = LOCK_POLL_S
    while True:
        left = until - time.monotonic()
        if left <= 0:
            raise FetchDeadlineError(f"another process has been fetching into {target} for longer than this fetch's "
                                     "deadline allowed it to wait")
        time.sleep(min(pause, left))
        pause = min(pause * 2, LOCK_POLL_MAX_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            continue


def _acquire_lock(path: Path, target: Path, wait: bool = True, until: Optional[float] = None) -> Optional[int]:
    waited = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                log.warning("cannot create the lock file %s (%s); going on without a lock: weights already in %s "
                            "are reused, new ones cannot be written there", path, exc, target)
                return None
            raise WeightsError(f"could not create the lock file {path} for fetching into {target}: {exc}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise
                if not waited:
                    log.info("another process is fetching weights into %s; waiting for it to finish (lock %s)",
                             target, path)
                    waited = True
                _wait_for_lock(fd, target, until)
            held = os.fstat(fd)
            try:
                current: Optional[os.stat_result] = os.stat(path)
            except FileNotFoundError:
                current = None
        except BlockingIOError:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            raise WeightsError(f"could not lock {path} for fetching into {target}: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            if waited:
                log.info("the other fetch into %s is done; going on", target)
            return fd
        os.close(fd)  # the previous holder removed the file we locked: lock the current one


def _read_marker(target: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads((target / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None
    return data


def _write_marker(directory: Path, data: dict[str, Any]) -> None:
    (directory / MARKER_NAME).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _marker_matches(
    marker: dict[str, Any], key: str, expected_sha: Optional[str], fingerprint: Optional[dict[str, Any]], target: Path
) -> bool:
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


def _inventory(root: Path) -> list[dict[str, Any]]:
    """Regular files (with size in bytes) and symlinks (with target) under ``root``, sorted by path."""
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


def _remove_leftovers(target: Path) -> None:
    """Delete staging folders and partial downloads that an interrupted earlier fetch left beside ``target``."""
    prefixes = tuple(f".{target.name}.{what}-" for what in ("staging", "download", "old"))
    for entry in target.parent.iterdir():
        if entry.name.startswith(prefixes):
            log.info("removing leftover %s from an interrupted fetch", entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _replace_directory(staging: Path, target: Path) -> None:
    """Make ``staging`` the new ``target``: two renames, or a move of the contents when renaming fails."""
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


def _copy_directory(source: Path, staging: Path, display: str) -> None:
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
