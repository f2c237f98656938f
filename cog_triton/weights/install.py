"""fetch_weights: a source installed into a target folder, under its lock, skipped when the marker matches.

Part of :mod:`cog_triton.weights` (its public face is the package).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from cog_triton.fetch.deadline import FetchDeadline
from cog_triton.fetch.folders import target_lock
from cog_triton.fetch.guard import hub_guard
from cog_triton.fetch.rules import FetchRules
from cog_triton.weights.archive import extract_archive
from cog_triton.weights.cache import (
    MARKER_VERSION,
    copy_directory,
    inventory,
    marker_matches,
    read_marker,
    remove_leftovers,
    replace_directory,
    write_marker,
)
from cog_triton.fetch.deadline import (
    DEFAULT_DOWNLOAD_DEADLINE_S,
    DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S,
    DEFAULT_DOWNLOAD_RATE_GRACE_S,
)
from cog_triton.weights.download import FetchLimits, download_file
from cog_triton.weights.hub import fetch_hub
from cog_triton.weights.sources import (
    SUPPORTED_KINDS,
    HubRef,
    Source,
    SourceLike,
    directory_overlap,
    hash_file,
    local_fingerprint,
    normalize_sha256,
    parse_source,
)
from common.errors import ArchiveError, ChecksumError, FetchDeadlineError, FetchRefusedError, WeightsError
from common.files import KEEP_NAMES

log = logging.getLogger("cog_triton.weights")


@dataclass(frozen=True)
class WeightsResult:
    """What :func:`fetch_weights` left in the target directory.

    Attributes:
        path: the target directory (absolute).
        source: the source as given, with userinfo and query string removed from URLs.
        sha256: hex sha256 of the archive (as downloaded / as on disk); ``None`` for a directory.
        size_bytes: size of the archive in bytes; for a directory, the total bytes of its files.
        skipped: ``True`` when an earlier identical fetch was found intact and reused.
        commit: for an ``hf://`` source, the commit its revision resolved to (None otherwise).
    """

    path: Path
    source: str
    sha256: Optional[str]
    size_bytes: int
    skipped: bool
    commit: Optional[str] = None


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
    hf_token: Optional[str] = None,
    hub_code: bool = False,
    rules: Optional[FetchRules] = None,
    what: str = "weights",
    deadline_at: Optional[float] = None,
    max_members: Optional[int] = None,
    members_setting: str = "",
    limit_reason: Optional[str] = None,
    unpack_in_deadline: bool = False,
) -> WeightsResult:
    """Fetch weights from ``source`` into ``target_dir`` and return what was done.

    Args:
        source: ``http://`` / ``https://`` URL, ``file://`` URL or local path (str or Path) of a
            tar archive (plain, gzip, bzip2 or xz; the kind is detected from the content) or of a
            directory whose contents are copied; or ``hf://owner/repo[@revision]``, a Hugging Face
            checkpoint fetched from the Hub (:mod:`cog_triton.weights.hub`: only ``timeout_s`` of the
            bounds below applies to it).
        target_dir: folder that receives the contents; created when missing. Its previous contents
            are replaced (a ``.gitkeep`` in it is kept). Temporary files and the lock file
            ``.<name>.lock`` are made beside it.
        sha256: expected hex sha256 of the archive (any case); verified when given. Not allowed
            for a directory source.
        timeout_s: timeout in seconds for each network operation (connect, each read).
        retries: how many times a failed download is retried (connection errors, timeouts,
            truncated bodies, transfers below ``min_rate_bytes_s`` and HTTP 5xx; never 4xx), with
            exponential backoff; a retry resumes the transfer where the server allows it.
        deadline_s: the whole fetch's network part must finish within this many seconds (0: no deadline): the
            wait for another process fetching into the same folder, and the download with all its connections,
            TLS handshakes, response headers, bodies, redirects, attempts and the waits between them (an
            ``hf://`` source's Hub calls too). It is enforced from outside the reads
            (:mod:`cog_triton.fetch.deadline`): when it passes, the fetch ends with the deadline's message,
            whatever the server is doing; it is not retried. Unpacking is not counted (the byte limits bound it)
            unless ``unpack_in_deadline``.
        min_rate_bytes_s: an attempt fails when fewer than this many bytes per second arrive over
            a window of ``rate_grace_s`` seconds (0: no minimum).
        rate_grace_s: length of that window in seconds; the first starts with each attempt.
        max_extracted_bytes: most bytes an archive may unpack to. ``None`` (automatic): the sizes
            of the files listed in the archive's own manifest.json plus
            :data:`~cog_triton.weights.archive.MANIFEST_SLACK_BYTES` once that member is met, until then (and
            without one) :data:`~cog_triton.weights.archive.EXTRACT_RATIO` times the archive's size, at least
            :data:`~cog_triton.weights.archive.EXTRACT_FLOOR_BYTES`.
        max_download_bytes: most bytes an http(s) download may have (``None``: no cap); a larger
            ``Content-Length`` fails before the body is read, a longer body as soon as it passes the cap.
        allow_zip: accept zip archives too (unpacked under the same rules; refused otherwise).
        hf_token: for an ``hf://`` source, a Hugging Face token for this fetch only (None: huggingface_hub's own
            lookup, ``HF_TOKEN``); never logged nor put in a message.
        hub_code: for an ``hf://`` source, also fetch the repository's top-level ``*.py`` files (the operator allowed
            a checkpoint's own code: ``COG_TRITON_LLM_TRUST_REMOTE_CODE``; :func:`cog_triton.weights.hub.fetch_hub`).

        rules: for a source an API caller gave (an adapter, a training's checkpoint): the fetch rules
            (:mod:`cog_triton.fetch.rules`) every request and connection of an http(s) download is held to,
            redirects included; ``what`` names what is fetched in their messages. None (the operator's own
            weights): no rules.
        deadline_at: the ``time.monotonic()`` instant the deadline ends, when the caller's clock started before
            this call (an adapter's: it waited for another fetch of the same adapter); ``deadline_s`` is then what
            the message says.
        max_members: for an archive an API caller gave (an adapter): most members it may have, counted before
            anything is written; the archive's stream and central directory are held to what that many members can
            take (:func:`cog_triton.weights.archive.extract_archive`). ``members_setting`` names the setting in
            messages. None (the operator's own weights): no limit.
        limit_reason: why ``max_extracted_bytes`` and ``max_download_bytes`` are what they are, and how to raise
            them, for the messages refusing a download or an archive over them (None: the weights' settings).
        unpack_in_deadline: unpacking an archive counts against the deadline too (an adapter's fetch); False (the
            operator's weights): the byte limits bound it.

    Returns:
        A :class:`WeightsResult`; ``skipped`` is True when the marker left by an earlier fetch of
        the same source (same sha256 when given; for local sources, same size and modification
        time) matches and every recorded file is present with its recorded size in bytes, or when
        the source directory is ``target_dir`` itself.

    Raises:
        WeightsError: the source is missing or unsupported, ``sha256`` is malformed or given for a
            directory, files could not be written, or there is not enough free disk space.
        DownloadError: HTTP 4xx/5xx, timeout, connection failure, truncated download or a transfer
            below the minimum rate (after the retries). FetchDeadlineError (a DownloadError): the deadline passed.
        ChecksumError: the archive's sha256 differs from ``sha256``.
        FetchRefusedError: ``rules`` refuse the URL, a redirect or an address it resolves to; nothing was sent
            there.
        ArchiveError: the archive is not a tar archive, is corrupt or truncated, unpacks to more
            than the limit, has more members than ``max_members``, or has a member that would land outside
            ``target_dir``, is nested too deep, or is a device file, FIFO or sparse file.
        ValueError: a timeout, rate or limit argument is out of range.

    On any error the previous contents of ``target_dir`` are left untouched.
    """
    limits = _checked_limits(
        timeout_s=timeout_s, retries=retries, deadline_s=deadline_s, min_rate_bytes_s=min_rate_bytes_s,
        rate_grace_s=rate_grace_s, max_extracted_bytes=max_extracted_bytes, max_download_bytes=max_download_bytes,
        allow_zip=allow_zip, rules=rules, what=what, deadline_at=deadline_at,
    )  # fmt: skip
    if max_members is not None and not max_members > 0:
        raise ValueError(f"max_members must be > 0 members, or None for no limit, got {max_members!r}")
    limits = dataclasses.replace(limits, max_members=max_members, members_setting=members_setting,
                                 limit_reason=limit_reason, unpack_in_deadline=unpack_in_deadline)
    src = parse_source(source)
    if rules is not None and src.url is not None:  # the URL itself (scheme, host, an IP literal) before anything
        refusal = rules.url_refusal(src.url, what)
        if refusal is not None:
            raise FetchRefusedError(refusal)
    expected_sha = normalize_sha256(sha256, src.display)
    target = Path(target_dir).absolute()
    if target.exists() and not target.is_dir():
        raise WeightsError(f"target {target} exists and is not a directory")
    if src.hub is not None:
        return _fetch_from_hub(src, src.hub, target, expected_sha, limits, hf_token=hf_token, hub_code=hub_code)
    kind = "archive"
    fingerprint: Optional[dict[str, Any]] = None
    if src.path is not None:
        kind = _local_kind(src, src.path, expected_sha)
        if kind == "directory" and _is_the_target(src, src.path, target):
            size = sum(e.get("size", 0) for e in inventory(target))
            log.info("weights source %s is the target directory itself; nothing to copy", src.display)
            return WeightsResult(path=target, source=src.display, sha256=None, size_bytes=size, skipped=True)
        fingerprint = local_fingerprint(src.path, kind, src.display)
    return _fetch_under_lock(src, kind, fingerprint, expected_sha, target, limits)


def _checked_limits(
    *, timeout_s: float, retries: int, deadline_s: float, min_rate_bytes_s: float, rate_grace_s: float,
    max_extracted_bytes: Optional[int], max_download_bytes: Optional[int], allow_zip: bool,
    rules: Optional[FetchRules], what: str, deadline_at: Optional[float],
) -> FetchLimits:
    """:func:`fetch_weights`'s bounds (its arguments of the same names), checked in this order, with the deadline's
    end: ``deadline_at`` as given, else ``deadline_s`` from now; None when ``deadline_s`` is 0.

    Raises:
        ValueError: a timeout, rate or limit is out of range (the message names it and its unit).
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
    if deadline_s > 0 and deadline_at is None:
        deadline_at = time.monotonic() + deadline_s
    elif deadline_s == 0:
        deadline_at = None
    return FetchLimits(timeout_s, retries, deadline_s, min_rate_bytes_s, rate_grace_s, max_extracted_bytes,
                       max_download_bytes, allow_zip, rules, what, deadline_at)


def _fetch_from_hub(src: Source, ref: HubRef, target: Path, expected_sha: Optional[str], limits: FetchLimits, *,
                    hf_token: Optional[str], hub_code: bool) -> WeightsResult:
    """:func:`fetch_weights` of an ``hf://`` source (``ref``): checked against the fetch rules, then fetched under
    the fetch rules (none for the operator's own weights) and the deadline.

    Raises:
        WeightsError: a sha256 was given, or the fetch failed (:func:`cog_triton.weights.hub.fetch_hub`).
        FetchRefusedError: the rules refuse the repository's owner.
        FetchDeadlineError: the deadline passed, in its own words.
    """
    if expected_sha is not None:
        raise WeightsError(f"a sha256 was given for {src.display}, but checksums apply to archives only; an hf:// "
                           "source is pinned by its revision (hf://owner/repo@<commit>): drop the sha256")
    rules, what = limits.rules, limits.what
    if rules is not None:
        refusal = rules.hf_owner_refusal(ref.repo_id, what)
        if refusal is not None:
            raise FetchRefusedError(f"{src.display}: {refusal}")
    # The Hub's connections follow the caller's rules; the operator's own weights (rules None) may come from
    # any endpoint (HF_ENDPOINT may be a mirror on the private network): huggingface_hub's client in this
    # process is the guarded one once any fetch installed it (cog_triton.fetch.guard), so say so explicitly.
    # The deadline reaches its connections through the guard (cog_triton.fetch.deadline).
    deadline = None if limits.deadline_at is None else FetchDeadline(
        limits.deadline_s, at=limits.deadline_at, what=f"the fetch of {src.display}",
        setting="COG_TRITON_DOWNLOAD_DEADLINE_S")
    try:
        with (deadline or contextlib.nullcontext()), hub_guard(rules or FetchRules.open(), what, deadline):
            hub = fetch_hub(ref, target, src.key, timeout_s=limits.timeout_s, token=hf_token, code=hub_code,
                            until=limits.deadline_at)
    except FetchDeadlineError as exc:
        raise _deadline_passed(exc, deadline) from None
    except WeightsError:
        if deadline is not None and deadline.passed():  # whatever a client made of a connection the watchdog ended
            raise deadline.error() from None
        raise
    return WeightsResult(path=target, source=src.display, sha256=None, size_bytes=hub.size_bytes,
                         skipped=hub.skipped, commit=hub.commit)


def _local_kind(src: Source, path: Path, expected_sha: Optional[str]) -> str:
    """``"directory"`` or ``"archive"``: what the local source ``path`` is.

    Raises:
        WeightsError: it does not exist, is neither a regular file nor a directory, or is a directory and a sha256
            was given.
    """
    if not path.exists():
        raise WeightsError(
            f"weights source {src.display} does not exist; give an http(s) URL, a file:// URL or the "
            f"path of a {SUPPORTED_KINDS}"
        )
    if path.is_dir():
        if expected_sha is not None:
            raise WeightsError(
                f"a sha256 was given for the directory {src.display}, but checksums apply to archives only; "
                "drop the sha256 or point the weights at a .tar/.tar.gz archive"
            )
        return "directory"
    if not path.is_file():
        raise WeightsError(f"weights source {src.display} is neither a regular file nor a directory")
    return "archive"


def _is_the_target(src: Source, path: Path, target: Path) -> bool:
    """True when the source directory ``path`` is ``target`` itself (nothing to copy).

    Raises:
        WeightsError: one is inside the other.
    """
    overlap = directory_overlap(path, target)
    if overlap is not None and overlap != "same":
        raise WeightsError(
            f"weights source directory {src.display} and target {target} overlap ({overlap}); "
            "use separate folders"
        )
    return overlap == "same"


def _fetch_under_lock(
    src: Source, kind: str, fingerprint: Optional[dict[str, Any]], expected_sha: Optional[str], target: Path,
    limits: FetchLimits,
) -> WeightsResult:
    """:func:`fetch_weights` of a URL or a local source once it is checked: under the target's lock, skipped when
    the marker matches, else :func:`_fetch`. A download's deadline bounds the wait for the lock too.

    Raises:
        WeightsError and the others of :func:`fetch_weights`; FetchDeadlineError in the deadline's words.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WeightsError(f"could not prepare {target}: {exc}") from exc
    until = limits.deadline_at if src.url is not None else None
    try:
        with target_lock(target, until=until):
            marker = read_marker(target)
            if marker is not None and marker_matches(marker, src.key, expected_sha, fingerprint, target):
                log.info("weights from %s already present in %s (%d files); skipping the fetch",
                         src.display, target, len(marker["files"]))
                return WeightsResult(
                    path=target, source=src.display, sha256=marker.get("sha256"),
                    size_bytes=int(marker["size_bytes"]), skipped=True,
                )
            return _fetch(src, kind, fingerprint, expected_sha, target, limits)
    except FetchDeadlineError as exc:
        if limits.deadline_at is None:
            raise
        raise _deadline_passed(exc, FetchDeadline(limits.deadline_s, at=limits.deadline_at,
                                                  what=f"the download of {src.display}",
                                                  setting="COG_TRITON_DOWNLOAD_DEADLINE_S")) from None


def _deadline_passed(exc: FetchDeadlineError, deadline: Optional[FetchDeadline]) -> FetchDeadlineError:
    """``exc`` in the deadline's words: the deadline, its setting, and what was still going on (another process's
    fetch holding the folder's lock) when that is not already what ``exc`` says."""
    if deadline is None:
        return exc
    ours = deadline.error()
    return exc if exc.message.startswith(ours.message) else FetchDeadlineError(f"{ours.message}: {exc.message}")


def _fetch(
    src: Source, kind: str, fingerprint: Optional[dict[str, Any]], expected_sha: Optional[str], target: Path,
    limits: FetchLimits,
) -> WeightsResult:
    """The body of :func:`fetch_weights`, run under the target's lock once the marker did not match."""
    started = time.monotonic()
    log.info("fetching weights from %s into %s", src.display, target)
    try:
        remove_leftovers(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    except OSError as exc:
        raise WeightsError(f"could not prepare {target}: {exc}") from exc
    download: Optional[Path] = None
    try:
        digest: Optional[str]
        if kind == "directory":
            assert src.path is not None
            copy_directory(src.path, staging, src.display)
            digest, size = None, 0
        else:
            if src.url is not None:
                download = target.parent / f".{target.name}.download-{secrets.token_hex(4)}"
                digest, size = download_file(src.url, src.display, download, limits)
                archive = download
            else:
                assert src.path is not None
                archive = src.path
                digest, size = hash_file(archive, src.display)
            if expected_sha is not None and digest != expected_sha:
                raise ChecksumError(
                    f"sha256 mismatch for {src.display}: expected {expected_sha}, got {digest} ({size} bytes); "
                    f"the file is corrupt or the expected checksum is wrong. The previous contents of {target} "
                    "were kept"
                )
            unpacking = None
            if limits.unpack_in_deadline and limits.deadline_at is not None:
                unpacking = FetchDeadline(limits.deadline_s, at=limits.deadline_at,
                                          what=f"the download of {src.display}",
                                          setting="COG_TRITON_DOWNLOAD_DEADLINE_S")
            extract_archive(archive, staging, src.display, limits.max_extracted_bytes, allow_zip=limits.allow_zip,
                            max_members=limits.max_members, members_setting=limits.members_setting,
                            limit_reason=limits.limit_reason, deadline=unpacking)
        files = inventory(staging)
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
            write_marker(staging, {
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
            replace_directory(staging, target)
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
