"""Fetch model weights into a local folder: download, verify, safely unpack, and skip when unchanged.

:func:`fetch_weights` accepts an http(s) URL, a ``file://`` URL or a local path, pointing to a
``.tar`` / ``.tar.gz`` (``.tgz``; bzip2 and xz work too) archive or to a directory, and leaves its
contents in ``target_dir``:

* One fetch at a time per target: the whole fetch holds an exclusive lock (``flock``) on
  ``.<target name>.lock`` beside the target; a second fetch waits, then finds the marker and skips.
* HTTP downloads are streamed with httpx into a temporary file next to the target, hashed while
  they stream, checked against ``Content-Length``, and retried (tenacity, exponential backoff with
  jitter) on connection errors, timeouts, truncated bodies, transfers below the minimum rate and
  5xx answers; 4xx answers are not retried. A retry resumes where the previous attempt stopped
  (``Range``, validated with ``If-Range`` against the ETag or Last-Modified) when the server
  allows it, and starts from byte 0 otherwise; the sha256 covers every byte either way. The whole
  download, retries included, has a deadline.
* The archive's sha256 is checked when one is given.
* Zip archives are accepted where the caller allows them (``allow_zip``: LoRA adapters), unpacked with
  :mod:`zipfile` under the same member rules and byte limit (symlink members are refused; CRCs are checked).
* A download may be capped in bytes (``max_download_bytes``): a larger ``Content-Length`` or body fails it.
* Archives are unpacked with :mod:`tarfile` (compression detected from the content, ``"r:*"``)
  under the rules of tarfile's ``"data"`` extraction filter, enforced by our own code on every
  Python (the filter is missing before 3.10.12 / 3.11.4): modes lose setuid, setgid, sticky and
  group/other write bits, files get owner read+write, directory modes and all owners in the archive
  are ignored (nothing is ever chowned). A per-member check names the offending member: absolute
  paths, ``..`` components, paths deeper than :data:`MAX_MEMBER_DEPTH` components or longer than
  :data:`MAX_MEMBER_PATH_BYTES`, links that resolve outside the target, device files, FIFOs and
  sparse files are refused with :class:`~common.errors.ArchiveError`.
* The unpacked size is bounded (see :func:`fetch_weights`, ``max_extracted_bytes``): every
  member's declared size and every byte written count, and free disk space is checked before the
  extraction and before each file.
* Everything is unpacked (or copied) into a staging folder beside ``target_dir`` which then
  replaces ``target_dir`` by rename, so a failed fetch leaves the previous weights in place.
* A marker file (:data:`MARKER_NAME`) records what was fetched; the next identical fetch whose
  files are all still present with their recorded sizes is skipped. Verification records
  (:data:`~common.files.VERIFIED_NAME`) in an archive or a copied folder are dropped: only this
  machine's own hashing writes them.

URLs are never logged or put into error messages with their userinfo or query string (see
:func:`redact_url`); the records of httpx's and httpcore's own logs (request lines, and at DEBUG
level the response headers with a redirect's ``Location``) are redacted the same way.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import json
import logging
import lzma
import os
import posixpath
import re
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, BinaryIO, Iterator, Optional, Union
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from common.errors import ArchiveError, ChecksumError, DownloadError, ManifestError, WeightsError
from common.files import CHUNK_BYTES, KEEP_NAMES, MARKER_NAME, VERIFIED_NAME, sha256_file
from tensorrtllm_backend.manifest import MANIFEST_NAME, Manifest

log = logging.getLogger(__name__)

MARKER_VERSION = 1
#: Progress is logged when this fraction of the download has arrived since the last line ...
PROGRESS_FRACTION = 0.10
#: ... or when this many seconds have passed since it.
PROGRESS_INTERVAL_S = 5.0
#: First retry waits about this long (seconds, plus jitter); each further one twice as long.
RETRY_INITIAL_BACKOFF_S = 1.0
#: Longest wait between two attempts (seconds).
RETRY_MAX_BACKOFF_S = 30.0
#: Default deadline of a whole download, all attempts and the waits between them (seconds; 0: none).
DEFAULT_DOWNLOAD_DEADLINE_S = 6 * 3600.0
#: Default lowest transfer rate (bytes per second; 0: no minimum) ...
DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S = 100_000
#: ... measured over consecutive windows of this many seconds, the first from the start of each attempt.
DEFAULT_DOWNLOAD_RATE_GRACE_S = 60.0
#: Without manifest.json and without an explicit limit, the unpacked files may total this many
#: times the archive's size ...
EXTRACT_RATIO = 20
#: ... or this many bytes, whichever is more.
EXTRACT_FLOOR_BYTES = 1 << 30
#: With manifest.json (at the archive root or in its only folder): the sizes of the files it lists,
#: plus manifest.json itself, plus this many bytes.
MANIFEST_SLACK_BYTES = 1 << 20
#: A manifest.json larger than this (bytes) is not read to set the limit.
MANIFEST_MAX_BYTES = 64 << 20
#: Members nested deeper than this many path components are refused ...
MAX_MEMBER_DEPTH = 64
#: ... and so are member paths and link targets longer than this many bytes (UTF-8; Linux's PATH_MAX).
MAX_MEMBER_PATH_BYTES = 4096
#: Member names in error messages are cut to this many characters.
SHOWN_NAME_CHARS = 120

SUPPORTED_KINDS = ".tar, .tar.gz/.tgz (also .tar.bz2, .tar.xz) or a directory"

_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_FILTER_ERRORS: tuple[type[BaseException], ...] = (
    (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()  # type: ignore[attr-defined]
)
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# userinfo of an absolute URL ("//user:password@") and any query string ("?X-Amz-Signature=..."),
# also in relative URLs such as a redirect's Location, as they appear in log text and bytes reprs
_URL_USERINFO_RE = re.compile(r"(?<=//)[^/?#\s'\"<>@]+@")
_URL_QUERY_RE = re.compile(r"\?[^\s'\"<>)\]]+")
_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_COMPRESSION_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
_UNSUPPORTED_MAGIC = (
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an (empty) zip archive"),
    (b"(\xb5/\xfd", "zstd-compressed"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
)

SourceLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class WeightsResult:
    """What :func:`fetch_weights` left in the target directory.

    Attributes:
        path: the target directory (absolute).
        source: the source as given, with userinfo and query string removed from URLs.
        sha256: hex sha256 of the archive (as downloaded / as on disk); ``None`` for a directory.
        size_bytes: size of the archive in bytes; for a directory, the total bytes of its files.
        skipped: ``True`` when an earlier identical fetch was found intact and reused.
    """

    path: Path
    source: str
    sha256: Optional[str]
    size_bytes: int
    skipped: bool


def redact_url(url: str) -> str:
    """Return ``url`` without userinfo (``user:password@``), query string and fragment.

    Used for every log line and error message that names a URL, so that credentials and signed
    query parameters (for example pre-signed S3 URLs) never leak.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_text(text: str) -> str:
    """``text`` with the userinfo of every absolute URL and every query string (``?...``) removed.

    For free text that may hold URLs, such as httpx's and httpcore's log messages (a redirect's
    ``Location`` header, absolute or relative) and exception messages.
    """
    return _URL_QUERY_RE.sub("?<redacted>", _URL_USERINFO_RE.sub("", text))


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    retries: int
    deadline_s: float
    min_rate_bytes_s: float
    rate_grace_s: float
    max_extracted_bytes: Optional[int]
    max_download_bytes: Optional[int] = None
    allow_zip: bool = False


def fetch_weights(
    source: SourceLike,
    target_dir: Union[str, "os.PathLike[str]"],
    *,
    sha256: Optional[str] = None,
    timeout_s: float = 60.0,
    retries: int = 3,
    deadline_s: float = DEFAULT_DOWNLOAD_DEADLINE_S,
    min_rate_bytes_s: float = DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S,
    rate_grace_s: float = DEFAULT_DOWNLOAD_RATE_GRACE_S,
    max_extracted_bytes: Optional[int] = None,
    max_download_bytes: Optional[int] = None,
    allow_zip: bool = False,
) -> WeightsResult:
    """Fetch weights from ``source`` into ``target_dir`` and return what was done.

    Args:
        source: ``http://`` / ``https://`` URL, ``file://`` URL or local path (str or Path) of a
            tar archive (plain, gzip, bzip2 or xz; the kind is detected from the content) or of a
            directory whose contents are copied.
        target_dir: folder that receives the contents; created when missing. Its previous contents
            are replaced (a ``.gitkeep`` in it is kept). Temporary files and the lock file
            ``.<name>.lock`` are made beside it.
        sha256: expected hex sha256 of the archive (any case); verified when given. Not allowed
            for a directory source.
        timeout_s: timeout in seconds for each network operation (connect, each read).
        retries: how many times a failed download is retried (connection errors, timeouts,
            truncated bodies, transfers below ``min_rate_bytes_s`` and HTTP 5xx; never 4xx), with
            exponential backoff; a retry resumes the transfer where the server allows it.
        deadline_s: the whole download, all attempts and waits included, must finish within this
            many seconds (0: no deadline); a missed deadline is not retried.
        min_rate_bytes_s: an attempt fails when fewer than this many bytes per second arrive over
            a window of ``rate_grace_s`` seconds (0: no minimum).
        rate_grace_s: length of that window in seconds; the first starts with each attempt.
        max_extracted_bytes: most bytes an archive may unpack to. ``None`` (automatic): the sizes
            of the files listed in the archive's own manifest.json plus
            :data:`MANIFEST_SLACK_BYTES` once that member is met, until then (and without one)
            :data:`EXTRACT_RATIO` times the archive's size, at least :data:`EXTRACT_FLOOR_BYTES`.
        max_download_bytes: most bytes an http(s) download may have (``None``: no cap); a larger
            ``Content-Length`` fails before the body is read, a longer body as soon as it passes the cap.
        allow_zip: accept zip archives too (unpacked under the same rules; refused otherwise).

    Returns:
        A :class:`WeightsResult`; ``skipped`` is True when the marker left by an earlier fetch of
        the same source (same sha256 when given; for local sources, same size and modification
        time) matches and every recorded file is present with its recorded size in bytes, or when
        the source directory is ``target_dir`` itself.

    Raises:
        WeightsError: the source is missing or unsupported, ``sha256`` is malformed or given for a
            directory, files could not be written, or there is not enough free disk space.
        DownloadError: HTTP 4xx/5xx, timeout, connection failure, truncated download or a transfer
            below the minimum rate (after the retries), or the deadline passed.
        ChecksumError: the archive's sha256 differs from ``sha256``.
        ArchiveError: the archive is not a tar archive, is corrupt or truncated, unpacks to more
            than the limit, or has a member that would land outside ``target_dir``, is nested too
            deep, or is a device file, FIFO or sparse file.
        ValueError: a timeout, rate or limit argument is out of range.

    On any error the previous contents of ``target_dir`` are left untouched.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries!r}")
    if not deadline_s >= 0:
        raise ValueError(f"deadline_s must be >= 0 seconds (0: no deadline), got {deadline_s!r}")
    if not min_rate_bytes_s >= 0:
        raise ValueError(f"min_rate_bytes_s must be >= 0 bytes per second (0: no minimum), got {min_rate_bytes_s!r}")
    if not rate_grace_s > 0:
        raise ValueError(f"rate_grace_s must be > 0 seconds, got {rate_grace_s!r}")
    if max_extracted_bytes is not None and not max_extracted_bytes > 0:
        raise ValueError(f"max_extracted_bytes must be > 0 bytes, or None for automatic, got {max_extracted_bytes!r}")
    if max_download_bytes is not None and not max_download_bytes > 0:
        raise ValueError(f"max_download_bytes must be > 0 bytes, or None for no cap, got {max_download_bytes!r}")
    limits = _Limits(timeout_s, retries, deadline_s, min_rate_bytes_s, rate_grace_s, max_extracted_bytes,
                     max_download_bytes, allow_zip)

    src = _parse_source(source)
    expected_sha = _normalize_sha256(sha256, src.display)
    target = Path(target_dir).absolute()
    if target.exists() and not target.is_dir():
        raise WeightsError(f"target {target} exists and is not a directory")

    kind = "archive"
    fingerprint: Optional[dict[str, Any]] = None
    if src.path is not None:
        if not src.path.exists():
            raise WeightsError(
                f"weights source {src.display} does not exist; give an http(s) URL, a file:// URL or the "
                f"path of a {SUPPORTED_KINDS}"
            )
        if src.path.is_dir():
            kind = "directory"
            if expected_sha is not None:
                raise WeightsError(
                    f"a sha256 was given for the directory {src.display}, but checksums apply to archives only; "
                    "drop the sha256 or point the weights at a .tar/.tar.gz archive"
                )
            overlap = _directory_overlap(src.path, target)
            if overlap == "same":
                size = sum(e.get("size", 0) for e in _inventory(target))
                log.info("weights source %s is the target directory itself; nothing to copy", src.display)
                return WeightsResult(path=target, source=src.display, sha256=None, size_bytes=size, skipped=True)
            if overlap is not None:
                raise WeightsError(
                    f"weights source directory {src.display} and target {target} overlap ({overlap}); "
                    "use separate folders"
                )
        elif not src.path.is_file():
            raise WeightsError(f"weights source {src.display} is neither a regular file nor a directory")
        fingerprint = _local_fingerprint(src.path, kind, src.display)

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WeightsError(f"could not prepare {target}: {exc}") from exc
    with _exclusive_lock(target):
        marker = _read_marker(target)
        if marker is not None and _marker_matches(marker, src.key, expected_sha, fingerprint, target):
            log.info("weights from %s already present in %s (%d files); skipping the fetch",
                     src.display, target, len(marker["files"]))
            return WeightsResult(
                path=target, source=src.display, sha256=marker.get("sha256"),
                size_bytes=int(marker["size_bytes"]), skipped=True,
            )
        return _fetch(src, kind, fingerprint, expected_sha, target, limits)


def _fetch(
    src: "_Source", kind: str, fingerprint: Optional[dict[str, Any]], expected_sha: Optional[str], target: Path,
    limits: _Limits,
) -> WeightsResult:
    """The body of :func:`fetch_weights`, run under the target's lock once the marker did not match."""
    started = time.monotonic()
    log.info("fetching weights from %s into %s", src.display, target)
    try:
        _remove_leftovers(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    except OSError as exc:
        raise WeightsError(f"could not prepare {target}: {exc}") from exc
    download: Optional[Path] = None
    try:
        digest: Optional[str]
        if kind == "directory":
            assert src.path is not None
            _copy_directory(src.path, staging, src.display)
            digest, size = None, 0
        else:
            if src.url is not None:
                download = target.parent / f".{target.name}.download-{secrets.token_hex(4)}"
                digest, size = _download(src.url, src.display, download, limits)
                archive = download
            else:
                assert src.path is not None
                archive = src.path
                digest, size = _hash_file(archive, src.display)
            if expected_sha is not None and digest != expected_sha:
                raise ChecksumError(
                    f"sha256 mismatch for {src.display}: expected {expected_sha}, got {digest} ({size} bytes); "
                    f"the file is corrupt or the expected checksum is wrong. The previous contents of {target} "
                    "were kept"
                )
            _extract_archive(archive, staging, src.display, limits.max_extracted_bytes, allow_zip=limits.allow_zip)
        files = _inventory(staging)
        if not files:
            raise (WeightsError if kind == "directory" else ArchiveError)(
                f"the weights {kind} {src.display} contains no files"
            )
        if kind == "directory":
            size = sum(e.get("size", 0) for e in files)
        try:
            for name in KEEP_NAMES:
                if (target / name).is_file() and not (staging / name).exists():
                    shutil.copy2(target / name, staging / name)
            _write_marker(staging, {
                "version": MARKER_VERSION,
                "source": src.display,
                "source_key": src.key,
                "sha256": digest,
                "size_bytes": size,
                "local": fingerprint,
                "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "files": files,
            })
            os.chmod(staging, stat.S_IMODE(target.stat().st_mode) if target.is_dir() else 0o755)
            _replace_directory(staging, target)
        except OSError as exc:
            raise WeightsError(f"could not move the new weights into {target}: {exc}") from exc
    finally:
        if download is not None:
            download.unlink(missing_ok=True)
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

    log.info("weights from %s ready in %s: %d files, source %d bytes, %.1f s",
             src.display, target, len(files), size, time.monotonic() - started)
    return WeightsResult(path=target, source=src.display, sha256=digest, size_bytes=size, skipped=False)


# --- locking ---------------------------------------------------------------------------------


@contextmanager
def _exclusive_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<target name>.lock`` in ``target``'s parent for the block.

    A second process blocks until the first is done (or dies: the kernel drops its lock). The
    file is removed while still locked; a waiter that then gets the lock on the removed file sees
    that its inode is no longer the path's and locks the new file instead, so there is never more
    than one holder.

    Where the lock file cannot be created for lack of permission or a read-only file system, the
    block runs unlocked (with a warning): nothing can be fetched there anyway, and weights that are
    already in place are still found and reused.

    Raises:
        WeightsError: the lock file cannot be created or locked for another reason.
    """
    path = target.parent / f".{target.name}.lock"
    fd = _acquire_lock(path, target)
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
def target_lock(target: Path, *, wait: bool = True) -> Iterator[bool]:
    """The lock :func:`fetch_weights` holds on ``target`` while it fetches into it, for other writers of the
    same folder (the LoRA adapter cache evicts and fills its folders under it).

    Yields True when held; with ``wait=False``, False (at once) when another process holds it. Where no
    lock file can be made (read-only file system) it yields True unlocked, as fetch_weights does.

    Raises:
        WeightsError: the lock file cannot be created or locked for another reason.
    """
    path = target.parent / f".{target.name}.lock"
    try:
        fd = _acquire_lock(path, target, wait=wait)
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


def _acquire_lock(path: Path, target: Path, wait: bool = True) -> Optional[int]:
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
                fcntl.flock(fd, fcntl.LOCK_EX)
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


# --- sources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    key: str  # sha256 of the full source string (URL) or of the absolute path (local)
    display: str  # safe to log
    url: Optional[str] = None  # http(s) URL
    path: Optional[Path] = None  # local file or directory (absolute)


def _parse_source(source: SourceLike) -> _Source:
    if isinstance(source, os.PathLike):
        path = Path(os.fspath(source))
    elif isinstance(source, str):
        text = source.strip()
        if not text:
            raise WeightsError(f"the weights source is empty; give an http(s) URL, a file:// URL or a path to a "
                               f"{SUPPORTED_KINDS}")
        match = _SCHEME_RE.match(text)
        if match is None:
            path = Path(text).expanduser()
        else:
            scheme = match.group(1).lower()
            if scheme in ("http", "https"):
                try:
                    host = urlsplit(text).hostname
                except ValueError:
                    host = None
                if not host:
                    raise WeightsError(f"weights URL {redact_url(text)} has no host")
                return _Source(key=_sha256_text(text), display=redact_url(text), url=text)
            if scheme == "file":
                parts = urlsplit(text)
                if parts.netloc not in ("", "localhost"):
                    raise WeightsError(f"file:// URL {redact_url(text)} names the host {parts.netloc!r}; "
                                       "only local files (file:///path) are supported")
                path = Path(url2pathname(parts.path))
            else:
                raise WeightsError(f"unsupported weights URL scheme {scheme!r} in {redact_url(text)}; "
                                   "use http://, https://, file:// or a local path")
    else:
        raise TypeError(f"source must be a str or a path, got {type(source).__name__}")
    path = path.absolute()
    return _Source(key=_sha256_text("local:" + os.fspath(path)), display=os.fspath(path), path=path)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _normalize_sha256(value: Optional[str], display: str) -> Optional[str]:
    if value is None:
        return None
    normalized = value.strip().lower()
    if not normalized:
        return None
    if not _SHA256_RE.match(normalized):
        raise WeightsError(f"the expected sha256 for {display} must be 64 hexadecimal characters, got {value!r}")
    return normalized


def _directory_overlap(source: Path, target: Path) -> Optional[str]:
    src, dst = source.resolve(), target.resolve()
    if src == dst:
        return "same"
    if dst.is_relative_to(src):
        return "the target is inside the source"
    if src.is_relative_to(dst):
        return "the source is inside the target"
    return None


def _local_fingerprint(path: Path, kind: str, display: str) -> dict[str, Any]:
    """Size and mtime of a local archive, or a digest over (path, size, mtime) of a directory's files."""
    try:
        if kind != "directory":
            st = path.stat()
            return {"kind": "file", "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        digest = hashlib.sha256()
        count = total = 0
        for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, path)
            for name in sorted(filenames):
                if rel_dir == "." and name == MARKER_NAME:
                    continue
                st = os.stat(os.path.join(dirpath, name))
                rel = PurePosixPath(rel_dir, name).as_posix()
                digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
                count += 1
                total += st.st_size
        return {"kind": "directory", "files": count, "size": total, "digest": digest.hexdigest()}
    except OSError as exc:
        raise WeightsError(f"could not read the weights source {display}: {exc}") from exc
    except RecursionError:  # os.walk recurses once per folder level before Python 3.12
        raise WeightsError(f"the weights directory {display} nests folders too deeply to read") from None


def _hash_file(path: Path, display: str) -> tuple[str, int]:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise WeightsError(f"could not read the weights archive {display}: {exc}") from exc


# --- marker ----------------------------------------------------------------------------------


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


# --- staging and replacement -----------------------------------------------------------------


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


# --- archives --------------------------------------------------------------------------------


def _corrupt(display: str, detail: object) -> ArchiveError:
    return ArchiveError(f"the weights archive {display} is corrupt or truncated ({detail}); "
                        "download or build it again")


def _show(name: str) -> str:
    """``name`` quoted for a message, cut to :data:`SHOWN_NAME_CHARS` characters."""
    if len(name) <= SHOWN_NAME_CHARS:
        return repr(name)
    return f"{name[:SHOWN_NAME_CHARS]!r}... ({len(name)} characters)"


def _check_free_space(directory: Path, need: int, what: str) -> None:
    """Raise WeightsError when the file system of ``directory`` has fewer than ``need`` bytes free."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # not knowing is no reason to fail; a full disk still fails the write itself
    if free < need:
        raise WeightsError(
            f"not enough free disk space in {directory} for {what}: {need} bytes needed, {free} bytes free; "
            "free some space, or set COG_TRITON_WEIGHTS_DIR to a folder on a larger disk"
        )


@dataclass
class _Budget:
    """How many bytes an archive may unpack to (``limit``, and why: ``reason``), and how many it has.

    ``declared`` sums the regular members' header sizes, checked before each member is written;
    ``written`` counts the bytes actually written. An automatic limit is tightened by the archive's
    own manifest.json once that member has been unpacked.
    """

    display: str
    staging: Path
    limit: int
    reason: str
    explicit: bool
    declared: int = 0
    written: int = 0
    manifest_seen: bool = False

    @classmethod
    def for_archive(cls, display: str, staging: Path, archive_size: int, explicit: Optional[int]) -> "_Budget":
        if explicit is not None:
            return cls(display, staging, explicit, f"COG_TRITON_MAX_EXTRACTED_BYTES={explicit}", True)
        limit = max(EXTRACT_RATIO * archive_size, EXTRACT_FLOOR_BYTES)
        reason = (f"{EXTRACT_RATIO} times the archive's {archive_size} bytes, at least {EXTRACT_FLOOR_BYTES} bytes, "
                  f"as it has no {MANIFEST_NAME} to tell")
        return cls(display, staging, limit, reason, False)

    def _over(self, what: str) -> ArchiveError:
        return ArchiveError(
            f"the weights archive {self.display} unpacks to more than allowed: {what}, over the limit of {self.limit} "
            f"bytes ({self.reason}); refusing to unpack it. If the archive is genuine, set "
            "COG_TRITON_MAX_EXTRACTED_BYTES to a larger number of bytes"
        )

    def declare(self, member: tarfile.TarInfo) -> None:
        """Count a regular member's declared size before it is written; check the limit and free space."""
        self.declare_bytes(member.name, member.size)

    def declare_bytes(self, name: str, size: int) -> None:
        """Count ``size`` declared bytes of member ``name`` before it is written; check the limit and free space."""
        self.declared += size
        if self.declared > self.limit:
            raise self._over(f"member {_show(name)} ({size} bytes) brings it to {self.declared} bytes")
        _check_free_space(self.staging, size, f"member {_show(name)} ({size} bytes) of {self.display}")

    def wrote(self, count: int, name: str) -> None:
        """Count ``count`` bytes just read for member ``name``, before they are written."""
        self.written += count
        if self.written > self.limit:
            raise self._over(f"{self.written} bytes were written, the last of them for member {_show(name)}")

    def apply_manifest(self, member: tarfile.TarInfo) -> None:
        """Tighten an automatic limit to what the just-unpacked manifest.json ``member`` lists."""
        self.manifest_seen = True
        where = f"{self.display}: {member.name}"
        try:
            with open(self.staging / member.name, "rb") as fh:
                data = json.loads(fh.read(MANIFEST_MAX_BYTES + 1))
            manifest = Manifest.from_json(data, where)
        except (OSError, ValueError, ManifestError) as exc:
            log.info("%s is not a manifest we can read (%s); the unpacked size stays limited to %d bytes",
                     where, exc, self.limit)
            return
        listed = sum(f.size for f in manifest.files)
        expected = listed + member.size
        if not self.explicit and expected + MANIFEST_SLACK_BYTES < self.limit:
            self.limit = expected + MANIFEST_SLACK_BYTES
            self.reason = (f"the {listed} bytes of files listed in its {MANIFEST_NAME}, plus {member.size} bytes for "
                           f"{MANIFEST_NAME} itself and {MANIFEST_SLACK_BYTES} bytes of slack")
            log.debug("%s: unpacked size limited to %d bytes by %s", self.display, self.limit, MANIFEST_NAME)
            if self.declared > self.limit:
                raise self._over(f"{self.declared} bytes were unpacked up to and including {_show(member.name)}")
        if expected > self.declared:
            _check_free_space(self.staging, expected - self.declared,
                              f"the rest of {self.display} (its {MANIFEST_NAME} lists {listed} bytes of files)")


def _data_mode(member: tarfile.TarInfo) -> Optional[int]:
    """The mode tarfile's ``data`` filter gives ``member``; None: leave the default (directories, symlinks)."""
    if member.mode is None or not (member.isreg() or member.islnk()):
        return None
    mode = member.mode & 0o755  # no setuid/setgid/sticky, no group/other write
    if not mode & stat.S_IXUSR:
        mode &= ~0o111  # executable for group/other only if for the owner too
    return mode | 0o600  # the owner can read and write


class _SafeTarFile(tarfile.TarFile):
    """A TarFile that unpacks by the rules of tarfile's ``data`` filter on every Python, and counts bytes.

    Regular files and hard links get :func:`_data_mode`; directories are made with the default mode
    (the archive's is ignored); owners are never set, whoever runs it (``chown`` does nothing);
    every byte of a regular file counts against ``budget`` before it is written.
    """

    budget: Optional[_Budget] = None

    def chown(self, tarinfo: tarfile.TarInfo, targetpath: str, numeric_owner: bool) -> None:
        """Never change owners: the archive's uid/gid/uname/gname are ignored."""

    def chmod(self, tarinfo: tarfile.TarInfo, targetpath: str) -> None:
        """Apply :func:`_data_mode`, or nothing for directories and symlinks."""
        mode = _data_mode(tarinfo)
        if mode is None:
            return
        try:
            os.chmod(targetpath, mode)
        except OSError as exc:
            raise tarfile.ExtractError("could not change mode") from exc

    def makedir(self, tarinfo: tarfile.TarInfo, targetpath: str) -> None:
        """Make a directory with the process's default mode (umask applies)."""
        try:
            os.mkdir(targetpath)
        except FileExistsError:
            if not os.path.isdir(targetpath):
                raise

    def makefile(self, tarinfo: tarfile.TarInfo, targetpath: str) -> None:
        """Write a regular member, counting each chunk against ``budget`` first."""
        if tarinfo.sparse is not None:  # refused earlier by _member_problem; never half-supported here
            raise tarfile.ExtractError(f"sparse member {tarinfo.name!r}")
        source = self.fileobj
        assert source is not None
        source.seek(tarinfo.offset_data)
        remaining = tarinfo.size
        with open(targetpath, "wb") as target:
            while remaining > 0:
                chunk = source.read(min(CHUNK_BYTES, remaining))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                if self.budget is not None:
                    self.budget.wrote(len(chunk), tarinfo.name)
                target.write(chunk)
                remaining -= len(chunk)


def _extract_archive(archive: Path, staging: Path, display: str, max_extracted_bytes: Optional[int] = None,
                     *, allow_zip: bool = False) -> None:
    """Unpack the tar archive ``archive`` (or, with ``allow_zip``, zip archive) into the empty folder ``staging``
    (see :func:`fetch_weights`)."""
    with open(archive, "rb") as fh:
        head = fh.read(tarfile.BLOCKSIZE)
    if not head:
        raise ArchiveError(f"the weights archive {display} is empty (0 bytes); expected a {SUPPORTED_KINDS}")
    if allow_zip and head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        size = archive.stat().st_size
        _extract_zip(archive, staging, display, _Budget.for_archive(display, staging, size, max_extracted_bytes))
        return
    for magic, what in _UNSUPPORTED_MAGIC:
        if head.startswith(magic):
            raise ArchiveError(f"the weights file {display} is {what}, not a tar archive; supported: {SUPPORTED_KINDS}")
    compression = next((name for magic, name in _COMPRESSION_MAGIC if head.startswith(magic)), None)
    size = archive.stat().st_size
    budget = _Budget.for_archive(display, staging, size, max_extracted_bytes)
    # the unpacked files take at least about the archive's size (less its tar headers)
    _check_free_space(staging, min(size - size // 100, budget.limit), f"unpacking {display} ({size} bytes)")
    try:
        tar = _SafeTarFile.open(archive, "r:*")
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        if compression is not None:
            raise _corrupt(display, f"{compression} data without a readable tar archive inside") from exc
        raise ArchiveError(
            f"the weights file {display} is not a tar archive (nor a gzip/bzip2/xz-compressed one), or it is "
            f"corrupt or truncated; supported: {SUPPORTED_KINDS}"
        ) from exc
    dest = os.path.realpath(staging)
    try:
        with tar:
            tar.errorlevel = 1
            tar.budget = budget
            members = _checked_members(tar, dest, display, budget)
            if _HAS_DATA_FILTER:  # the same rules as _SafeTarFile's, checked twice where Python has them
                tar.extractall(staging, members=members, filter="data")
            else:  # Python < 3.10.12 / 3.11.4: _checked_members and _SafeTarFile are the guards
                tar.extractall(staging, members=members)
            _check_archive_end(tar, display)
    except WeightsError:
        raise
    except _FILTER_ERRORS as exc:
        member = getattr(exc, "tarinfo", None)
        name = member.name if member is not None else "?"
        raise ArchiveError(f"unsafe weights archive {display}: member {_show(name)} was refused: {exc}") from exc
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise _corrupt(display, exc) from exc
    except KeyError as exc:  # a hard link to a member that is not in the archive
        raise ArchiveError(f"the weights archive {display} has a hard link to a missing member: {exc}") from exc
    except RecursionError:  # not expected with members at most MAX_MEMBER_DEPTH deep; never a bare one
        raise ArchiveError(f"the weights archive {display} nests folders too deeply to unpack") from None
    except OSError as exc:
        if exc.errno is None:  # decompressor errors (bz2 "Invalid data stream", ...) carry no errno
            raise _corrupt(display, exc) from exc
        raise WeightsError(f"could not unpack {display} into {staging}: {exc}") from exc


def _extract_zip(archive: Path, staging: Path, display: str, budget: _Budget) -> None:
    """Unpack a zip archive by the rules of :func:`_member_problem` (paths, depth, no links), counting bytes."""
    dest = os.path.realpath(staging)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                name = info.filename
                mode = info.external_attr >> 16
                problem = _member_problem(_zip_as_tar(info), dest)
                if problem is None and stat.S_ISLNK(mode):
                    problem = "is a symlink, which zip archives may not hold here"
                if problem is not None:
                    raise ArchiveError(
                        f"unsafe archive {display}: member {_show(name)} {problem}; refusing to unpack it "
                        "(nothing was written outside the target directory)"
                    )
                target = staging / name
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                if PurePosixPath(name).name == VERIFIED_NAME:
                    continue
                budget.declare_bytes(name, info.file_size)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as source, open(target, "wb") as out:
                    while chunk := source.read(CHUNK_BYTES):
                        budget.wrote(len(chunk), name)
                        out.write(chunk)
                os.chmod(target, 0o644)
    except WeightsError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, lzma.LZMAError, NotImplementedError) as exc:
        raise _corrupt(display, exc) from exc
    except OSError as exc:
        raise WeightsError(f"could not unpack {display} into {staging}: {exc}") from exc


def _zip_as_tar(info: zipfile.ZipInfo) -> tarfile.TarInfo:
    """A zip member as the TarInfo that :func:`_member_problem` checks (a directory or a regular file)."""
    member = tarfile.TarInfo(info.filename.rstrip("/") if info.is_dir() else info.filename)
    member.type = tarfile.DIRTYPE if info.is_dir() else tarfile.REGTYPE
    member.size = info.file_size
    return member


def _checked_members(
    tar: tarfile.TarFile, dest: str, display: str, budget: _Budget
) -> Iterator[tarfile.TarInfo]:
    """Yield the members of ``tar`` one by one, each checked just before it is extracted.

    A generator: extractall unpacks each member before asking for the next, so a manifest.json
    yielded here has been written when the loop comes back, and can tighten ``budget``.
    """
    manifest: Optional[tarfile.TarInfo] = None
    for member in tar:
        if manifest is not None:
            budget.apply_manifest(manifest)
            manifest = None
        problem = _member_problem(member, dest)
        if problem is not None:
            raise ArchiveError(
                f"unsafe weights archive {display}: member {_show(member.name)} {problem}; refusing to unpack it "
                "(nothing was written outside the target directory)"
            )
        if PurePosixPath(member.name).name == VERIFIED_NAME:
            log.warning("skipping %s in %s: verification records are only trusted when written on this machine",
                        _show(member.name), display)
            continue
        if member.isreg():
            budget.declare(member)
            parts = PurePosixPath(member.name).parts
            if (not budget.manifest_seen and parts[-1] == MANIFEST_NAME and len(parts) <= 2
                    and member.size <= MANIFEST_MAX_BYTES):
                manifest = member
        yield member
    if manifest is not None:
        budget.apply_manifest(manifest)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _member_problem(member: tarfile.TarInfo, dest: str) -> Optional[str]:
    """Why ``member`` must not be extracted into the real directory ``dest``, or None when it is safe."""
    name = member.name
    if not name or "\x00" in name:
        return "has an empty or invalid name"
    depth = len(PurePosixPath(name).parts)
    if depth > MAX_MEMBER_DEPTH:
        return f"is nested {depth} path components deep, more than the {MAX_MEMBER_DEPTH} allowed"
    length = len(name.encode("utf-8", "surrogateescape"))
    if length > MAX_MEMBER_PATH_BYTES:
        return f"has a path {length} bytes long, more than {MAX_MEMBER_PATH_BYTES} allowed"
    if name.startswith(("/", "\\")) or os.path.isabs(name) or PureWindowsPath(name).drive:
        return "has an absolute path"
    if ".." in PurePosixPath(name).parts or ".." in PureWindowsPath(name).parts:
        return "has a '..' path component"
    if member.ischr() or member.isblk():
        return "is a device file"
    if member.isfifo():
        return "is a FIFO (named pipe)"
    if member.issparse():
        return "is a sparse file, which is not supported; pack the archive without --sparse"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return f"has the unsupported tar member type {member.type!r}"
    if not _within(os.path.realpath(os.path.join(dest, name)), dest):
        return "would be written outside the target directory (through a symlink)"
    if member.issym() or member.islnk():
        what = "symlink" if member.issym() else "hard link"
        link = member.linkname
        if not link:
            return f"is a {what} with an empty target"
        if len(link.encode("utf-8", "surrogateescape")) > MAX_MEMBER_PATH_BYTES:
            return f"is a {what} to a path longer than {MAX_MEMBER_PATH_BYTES} bytes"
        if link.startswith(("/", "\\")) or os.path.isabs(link):
            return f"is a {what} to the absolute path {_show(link)} (outside the target directory)"
        base = posixpath.dirname(name) if member.issym() else ""
        lexical = posixpath.normpath(posixpath.join(base, link))
        resolved = os.path.realpath(os.path.join(dest, base, link))
        if lexical == ".." or lexical.startswith("../") or not _within(resolved, dest):
            return f"is a {what} to {_show(link)}, which points outside the target directory"
    return None


def _check_archive_end(tar: tarfile.TarFile, display: str) -> None:
    """Fail unless the archive ended with its end-of-archive block and the compressed stream is complete.

    tarfile treats a missing end-of-archive block (a tar cut at a member boundary) as a normal end
    and does not read a gzip stream's trailer; both are signs of truncation.
    """
    fileobj = tar.fileobj
    assert fileobj is not None
    fileobj.seek(tar.offset)  # within the reader's buffer: the block tarfile has just read
    block = fileobj.read(tarfile.BLOCKSIZE)
    if len(block) < tarfile.BLOCKSIZE:
        raise _corrupt(display, f"it ends at byte {tar.offset} of the tar data without the end-of-archive marker")
    if block.count(0) != tarfile.BLOCKSIZE:
        raise _corrupt(display, f"unreadable tar header at byte {tar.offset} of the tar data")
    _drain(fileobj)


def _drain(fileobj: BinaryIO) -> None:
    while fileobj.read(CHUNK_BYTES):
        pass


# --- HTTP --------------------------------------------------------------------------------------


class _TransientDownloadError(DownloadError):
    """A download failure worth retrying (connection, timeout, truncated body, too slow, 5xx)."""


#: Loggers whose records are redacted (plus any other httpx*/httpcore* logger that exists by then).
_REDACTED_LOGGERS = (
    "httpx", "httpcore", "httpcore.connection", "httpcore.connection_pool", "httpcore.http11", "httpcore.http2",
    "httpcore.proxy", "httpcore.socks", "hpack",
)  # fmt: skip


class _RedactUrlFilter(logging.Filter):
    """Removes userinfo and query strings from the URLs in httpx's and httpcore's log records.

    httpx logs each request line ("HTTP Request: GET <url> ..."), at INFO level; httpcore logs, at
    DEBUG level, the response headers, a redirect's ``Location`` (absolute or relative) included.
    The whole formatted message is redacted with :func:`redact_text` and replaces the record's
    ``msg`` (``args`` emptied) whenever it changed.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the handler's to report, not ours
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def _install_log_redaction() -> None:
    """Attach :class:`_RedactUrlFilter` to every httpx/httpcore logger (a logger's filters only see
    the records logged on it, not those its children propagate, hence each one by name)."""
    existing = [name for name in logging.root.manager.loggerDict if name.split(".")[0] in ("httpx", "httpcore")]
    for name in {*_REDACTED_LOGGERS, *existing}:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactUrlFilter) for f in logger.filters):
            logger.addFilter(_RedactUrlFilter())


_install_log_redaction()


class _Progress:
    def __init__(self, display: str, total: Optional[int], done: int = 0) -> None:
        self.display = display
        self.total = total
        self.started = self.last_time = time.monotonic()
        self.base = self.last_bytes = done  # bytes that were there before this attempt (a resumed download)

    def rate(self, done: int, now: float) -> float:
        return (done - self.base) / max(now - self.started, 1e-6) / 1e6

    def update(self, done: int) -> None:
        now = time.monotonic()
        step_due = self.total is not None and done - self.last_bytes >= self.total * PROGRESS_FRACTION
        if not step_due and now - self.last_time < PROGRESS_INTERVAL_S:
            return
        self.last_time, self.last_bytes = now, done
        if self.total:
            log.info("downloading %s: %d of %d bytes (%.0f%%), %.1f MB/s",
                     self.display, done, self.total, 100.0 * done / self.total, self.rate(done, now))
        else:
            log.info("downloading %s: %d bytes, %.1f MB/s", self.display, done, self.rate(done, now))

    def finish(self, done: int) -> None:
        now = time.monotonic()
        log.info("downloaded %s: %d bytes in %.1f s, %.1f MB/s",
                 self.display, done, now - self.started, self.rate(done, now))


@dataclass
class _Transfer:
    """One download across its attempts: the bytes in ``dest`` so far (``received``, all of them in
    ``hasher``) and what the server said about the file (for resuming)."""

    dest: Path
    deadline: Optional[float]  # time.monotonic() value; None: no deadline
    hasher: Any = field(default_factory=hashlib.sha256)
    received: int = 0
    total: Optional[int] = None  # the whole file's size in bytes, when the server said
    validator: Optional[str] = None  # strong ETag, else Last-Modified: sent as If-Range when resuming
    resumable: bool = False
    started: float = field(default_factory=time.monotonic)
    last_error: Optional[str] = None

    def restart(self) -> None:
        """Forget the bytes so far: the next write starts the file (and the hash) from byte 0."""
        self.hasher = hashlib.sha256()
        self.received = 0

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _deadline_error(display: str, transfer: _Transfer, limits: _Limits) -> DownloadError:
    elapsed = time.monotonic() - transfer.started
    of = f" of {transfer.total}" if transfer.total is not None else ""
    last = f"; the last attempt failed with: {transfer.last_error}" if transfer.last_error else ""
    return DownloadError(
        f"the download of {display} did not finish within the deadline of {_num(limits.deadline_s)} s "
        f"(COG_TRITON_DOWNLOAD_DEADLINE_S): {transfer.received}{of} bytes arrived in {elapsed:.1f} s{last}. "
        "Raise COG_TRITON_DOWNLOAD_DEADLINE_S (0: no deadline) or use a faster source"
    )


def _too_slow(display: str, rate: float, window_s: float, limits: _Limits) -> str:
    return (
        f"the download of {display} is too slow: {rate:.0f} bytes/s over the last {window_s:.1f} s, below the minimum "
        f"of {_num(limits.min_rate_bytes_s)} bytes/s (COG_TRITON_DOWNLOAD_MIN_RATE_BYTES_S, measured over "
        f"COG_TRITON_DOWNLOAD_RATE_GRACE_S={_num(limits.rate_grace_s)} s); use a faster source, or lower the "
        "minimum (0 disables it)"
    )


def _download(url: str, display: str, dest: Path, limits: _Limits) -> tuple[str, int]:
    """Download ``url`` into ``dest``; return (sha256 hex, size in bytes). Raises DownloadError."""
    _install_log_redaction()
    attempts = limits.retries + 1
    transfer = _Transfer(dest, deadline=time.monotonic() + limits.deadline_s if limits.deadline_s > 0 else None)
    backoff = wait_exponential_jitter(
        initial=RETRY_INITIAL_BACKOFF_S, max=RETRY_MAX_BACKOFF_S, jitter=RETRY_INITIAL_BACKOFF_S / 2
    )

    def wait(state: RetryCallState) -> float:  # never sleep past the deadline
        seconds = backoff(state)
        if transfer.deadline is not None:
            seconds = max(0.0, min(seconds, transfer.deadline - time.monotonic()))
        return seconds

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        transfer.last_error = str(getattr(exc, "message", exc))
        sleep = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("download attempt %d of %d failed: %s; retrying in %.1f s",
                    state.attempt_number, attempts, transfer.last_error, sleep)

    retrying = Retrying(
        stop=stop_after_attempt(attempts) | (lambda state: transfer.past_deadline()),
        wait=wait,
        retry=retry_if_exception_type(_TransientDownloadError),
        before_sleep=before_sleep,
        reraise=True,
    )
    with httpx.Client(
        timeout=httpx.Timeout(limits.timeout_s), follow_redirects=True, headers={"Accept-Encoding": "identity"}
    ) as client:
        try:
            retrying(_download_once, client, url, display, transfer, limits)
        except _TransientDownloadError as exc:
            if transfer.past_deadline():
                transfer.last_error = exc.message
                raise _deadline_error(display, transfer, limits) from exc
            tries = f"after {attempts} attempts" if attempts > 1 else "(no retries configured)"
            raise DownloadError(f"{exc.message}; gave up {tries}") from exc.__cause__
    return transfer.hasher.hexdigest(), transfer.received


def _download_once(client: httpx.Client, url: str, display: str, transfer: _Transfer, limits: _Limits) -> None:
    """One attempt: fetch the rest of the file (or all of it) into ``transfer.dest``."""
    if transfer.past_deadline():
        raise _deadline_error(display, transfer, limits)
    headers: dict[str, str] = {}
    if transfer.received and transfer.resumable and _size_of(transfer.dest) == transfer.received:
        headers["Range"] = f"bytes={transfer.received}-"
        if transfer.validator:
            headers["If-Range"] = transfer.validator
    elif transfer.received:
        transfer.restart()
    timeout = limits.timeout_s
    if transfer.deadline is not None:
        timeout = max(0.001, min(timeout, transfer.deadline - time.monotonic()))
    expected: Optional[int] = None
    phase = "connecting to"
    try:
        with client.stream("GET", url, headers=headers, timeout=timeout) as response:
            status = response.status_code
            if status >= 500:
                raise _TransientDownloadError(f"HTTP {status} {response.reason_phrase} (server error) from {display}")
            if status == 416 and "Range" in headers:
                transfer.restart()
                transfer.resumable = False
                raise _TransientDownloadError(
                    f"{display} refused to resume at byte {headers['Range'][6:-1]} (HTTP 416); starting over"
                )
            if status >= 400:
                hint = "check the URL" + (" and its credentials" if status in (401, 403) else "")
                raise DownloadError(f"HTTP {status} {response.reason_phrase} for {display}; {hint}")
            if status == 206 and "Range" in headers:
                _check_resumed_range(response, display, transfer)
                mode = "ab"
                log.info("resuming the download of %s at byte %d of %s", display, transfer.received, transfer.total)
            elif status == 200:
                if transfer.received:
                    log.info("%s answered the request to resume at byte %d with the whole file (HTTP 200): the server "
                             "does not resume, or the file changed; starting over from byte 0",
                             display, transfer.received)
                    transfer.restart()
                transfer.total = _content_length(response)
                transfer.validator = _validator(response)
                if limits.max_download_bytes is not None and (transfer.total or 0) > limits.max_download_bytes:
                    raise DownloadError(_too_big(display, transfer.total, limits))
                accept = response.headers.get("accept-ranges", "").strip().lower()
                transfer.resumable = transfer.total is not None and accept != "none"
                mode = "wb"
                log.info("downloading %s (%s)", display,
                         f"{transfer.total} bytes" if transfer.total is not None else "size unknown")
                if transfer.total is not None:
                    _check_free_space(transfer.dest.parent, transfer.total, f"the download of {display}")
            else:
                raise DownloadError(f"unexpected HTTP {status} {response.reason_phrase} for {display}")
            expected = transfer.total
            progress = _Progress(display, expected, transfer.received)
            phase = "reading from"
            window_start, window_bytes = time.monotonic(), transfer.received
            with open(transfer.dest, mode) as fh:
                for chunk in response.iter_raw():  # as the bytes arrive (exact counts on a short read)
                    fh.write(chunk)
                    transfer.hasher.update(chunk)
                    transfer.received += len(chunk)
                    if limits.max_download_bytes is not None and transfer.received > limits.max_download_bytes:
                        raise DownloadError(_too_big(display, transfer.received, limits))
                    progress.update(transfer.received)
                    now = time.monotonic()
                    if transfer.deadline is not None and now >= transfer.deadline:
                        raise _deadline_error(display, transfer, limits)
                    if limits.min_rate_bytes_s and now - window_start >= limits.rate_grace_s:
                        rate = (transfer.received - window_bytes) / (now - window_start)
                        if rate < limits.min_rate_bytes_s:
                            raise _TransientDownloadError(_too_slow(display, rate, now - window_start, limits))
                        window_start, window_bytes = now, transfer.received
    except httpx.TimeoutException as exc:
        if transfer.past_deadline():
            raise _deadline_error(display, transfer, limits) from exc
        raise _TransientDownloadError(
            f"timed out after {limits.timeout_s:g} s {phase} {display} (timeout_s={limits.timeout_s:g}; "
            "raise COG_TRITON_DOWNLOAD_TIMEOUT_S for slow servers)"
        ) from exc
    except httpx.ConnectError as exc:
        raise _TransientDownloadError(f"could not connect to {display}: {_scrub(exc, url, display)}") from exc
    except (httpx.RemoteProtocolError, httpx.NetworkError) as exc:
        if expected is not None:
            raise _TransientDownloadError(_truncated(display, expected, transfer.received)) from exc
        raise _TransientDownloadError(
            f"connection to {display} failed after {transfer.received} bytes: {_scrub(exc, url, display)}"
        ) from exc
    except httpx.HTTPError as exc:  # invalid URL, too many redirects, ...
        raise DownloadError(f"could not download {display}: {type(exc).__name__}: {_scrub(exc, url, display)}") from exc
    except OSError as exc:
        raise WeightsError(f"could not write the download of {display} to {transfer.dest}: {exc}") from exc
    if expected is not None and transfer.received != expected:
        raise _TransientDownloadError(_truncated(display, expected, transfer.received))
    progress.finish(transfer.received)


def _check_resumed_range(response: httpx.Response, display: str, transfer: _Transfer) -> None:
    """Accept a 206 answer only if it continues exactly where ``transfer`` stopped, in the same file."""
    header = response.headers.get("content-range", "")
    match = _CONTENT_RANGE_RE.match(header)
    total = None if match is None or match.group(3) == "*" else int(match.group(3))
    if match is None or int(match.group(1)) != transfer.received or total not in (None, transfer.total):
        at = transfer.received
        transfer.restart()
        transfer.resumable = False
        raise _TransientDownloadError(
            f"{display} answered the request to resume at byte {at} with Content-Range {header!r} (the file has "
            f"{transfer.total} bytes); starting over"
        )


def _validator(response: httpx.Response) -> Optional[str]:
    """What to send as If-Range: a strong ETag, else Last-Modified (weak ETags are not allowed there)."""
    etag = response.headers.get("etag")
    if etag and not etag.startswith("W/"):
        return etag
    return response.headers.get("last-modified") or None


def _size_of(path: Path) -> Optional[int]:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _content_length(response: httpx.Response) -> Optional[int]:
    value = response.headers.get("content-length")
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


def _too_big(display: str, size: Optional[int], limits: _Limits) -> str:
    return (f"{display} has more than the {limits.max_download_bytes} bytes allowed to download "
            f"({size} bytes or more); refusing it")


def _truncated(display: str, expected: int, received: int) -> str:
    return (f"truncated download of {display}: expected {expected} bytes (Content-Length), "
            f"received {received} bytes before the connection closed")


def _scrub(exc: BaseException, url: str, display: str) -> str:
    return redact_text(str(exc).replace(url, display)) or type(exc).__name__
