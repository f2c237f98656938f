"""The folder a fetch writes into: one lock per folder across processes, and the free-space check before writing.

Both fetchers write folders that other processes read and write too: :func:`cog_triton.weights.fetch_weights`
(setup's weights in the Cog worker, an adapter's archive in a stream process) and the LoRA adapter cache
(:mod:`cog_triton.streaming.lora.store`, which evicts and fills its folders under the same lock). So the lock and
the check live here, in the fetching layer both use, rather than in either of them.

The lock is an exclusive ``flock`` on ``.<folder name>.lock`` beside the folder, so it is dropped by the kernel when
its holder dies. Its log records keep the logger name they had when the lock was part of the weights fetcher
(``cog_triton.weights``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from common.errors import FetchDeadlineError, WeightsError

log = logging.getLogger("cog_triton.weights")


#: Waiting for a lock with a deadline polls it: first after this many seconds, then twice as long each time ...
LOCK_POLL_S = 0.02
#: ... up to this many.
LOCK_POLL_MAX_S = 0.5


@contextmanager
def target_lock(target: Path, *, wait: bool = True, until: Optional[float] = None) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``.<target name>.lock`` in ``target``'s parent for the block: the lock
    :func:`cog_triton.weights.fetch_weights` holds while it fetches into ``target``, and every other writer of the
    same folder (the LoRA adapter cache) takes.

    A second process blocks until the first is done (or dies: the kernel drops its lock), or, with ``until`` (a
    ``time.monotonic()`` instant: the fetch's deadline), until then at most. The lock file is removed while still
    locked; a waiter that then gets the lock on the removed file sees that its inode is no longer the path's and
    locks the new file instead, so there is never more than one holder.

    Yields True when held; with ``wait=False``, False (at once) when another process holds it. Where the lock file
    cannot be created for lack of permission or a read-only file system, it yields True unlocked (with a warning):
    nothing can be fetched there anyway, and weights that are already in place are still found and reused.

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
    """The locked file descriptor of ``path``, or None where the lock file cannot be made (see :func:`target_lock`).

    Raises:
        BlockingIOError: ``wait`` is False and another process holds the lock.
        WeightsError, FetchDeadlineError: as :func:`target_lock`.
    """
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


def check_free_space(directory: Path, need: int, what: str) -> None:
    """Fail when the file system of ``directory`` has fewer than ``need`` bytes free for ``what`` (a phrase for the
    message: "the download of <url>"). Not knowing (``statvfs`` fails) passes: a full disk still fails the write.

    Raises:
        WeightsError: fewer than ``need`` bytes are free; the message gives both numbers and the fix.
    """
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # not knowing is no reason to fail; a full disk still fails the write itself
    if free < need:
        raise WeightsError(
            f"not enough free disk space in {directory} for {what}: {need} bytes needed, {free} bytes free; "
            "free some space, or set COG_TRITON_WEIGHTS_DIR to a folder on a larger disk"
        )


__all__ = ("LOCK_POLL_MAX_S", "LOCK_POLL_S", "check_free_space", "target_lock")
