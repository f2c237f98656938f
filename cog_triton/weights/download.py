"""HTTP downloads of weights: streamed with httpx, hashed while they stream, retried with backoff and resumed
with Range/If-Range, within a deadline and a minimum rate; URLs redacted from every log record
(:mod:`cog_triton.fetch.redaction`).

Part of :mod:`cog_triton.weights` (its public face is the package).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from cog_triton.fetch.deadline import FetchDeadline
from cog_triton.fetch.folders import check_free_space
from cog_triton.fetch.guard import FetchGuard, bound_connects, guarded_transport
from cog_triton.fetch.rules import FetchRules
from cog_triton.fetch.redaction import install_log_redaction, redact_text
from common.errors import DownloadError, FetchDeadlineError, WeightsError

log = logging.getLogger("cog_triton.weights")


#: Progress is logged when this fraction of the download has arrived since the last line ...
PROGRESS_FRACTION = 0.10


#: ... or when this many seconds have passed since it.
PROGRESS_INTERVAL_S = 5.0


#: First retry waits about this long (seconds, plus jitter); each further one twice as long.
RETRY_INITIAL_BACKOFF_S = 1.0


#: Longest wait between two attempts (seconds).
RETRY_MAX_BACKOFF_S = 30.0




_CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class FetchLimits:
    """The bounds of one :func:`cog_triton.weights.fetch_weights` call (its arguments of the same names: seconds,
    bytes, bytes per second), as its download and extraction read them.

    Attributes:
        rules: for a source an API caller gave; None: the operator's own weights.
        what: names what is fetched in the fetch rules' messages.
        deadline_at: the ``time.monotonic()`` instant the deadline ends, when it began before the call.
        max_members / members_setting: the archive's member limit and the setting that sets it (None: no limit).
        limit_reason: why the byte caps are what they are, and how to raise them, for the messages refusing a
            download or an archive over them (None: the weights' settings).
        unpack_in_deadline: unpacking the archive counts against the deadline too.
    """

    timeout_s: float
    retries: int
    deadline_s: float
    min_rate_bytes_s: float
    rate_grace_s: float
    max_extracted_bytes: Optional[int]
    max_download_bytes: Optional[int] = None
    allow_zip: bool = False
    rules: Optional[FetchRules] = None
    what: str = "weights"
    deadline_at: Optional[float] = None
    max_members: Optional[int] = None
    members_setting: str = ""
    limit_reason: Optional[str] = None
    unpack_in_deadline: bool = False


class _TransientDownloadError(DownloadError):
    """A download failure worth retrying (connection, timeout, truncated body, too slow, 5xx)."""


# Every log record of the process is redacted (httpx's request lines, httpcore's DEBUG headers with a redirect's
# Location, huggingface_hub's and urllib3's lines): cog_triton.fetch.redaction.
install_log_redaction()


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
    watchdog: Optional[FetchDeadline] = None  # enforces ``deadline`` on the connections (cog_triton.fetch.deadline)

    def restart(self) -> None:
        """Forget the bytes so far: the next write starts the file (and the hash) from byte 0."""
        self.hasher = hashlib.sha256()
        self.received = 0

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _deadline_error(display: str, transfer: _Transfer, limits: FetchLimits) -> FetchDeadlineError:
    elapsed = time.monotonic() - transfer.started
    of = f" of {transfer.total}" if transfer.total is not None else ""
    last = f"; the last attempt failed with: {transfer.last_error}" if transfer.last_error else ""
    return FetchDeadlineError(
        f"the download of {display} did not finish within the deadline of {_num(limits.deadline_s)} s "
        f"(COG_TRITON_DOWNLOAD_DEADLINE_S): {transfer.received}{of} bytes arrived in {elapsed:.1f} s{last}. "
        "Raise COG_TRITON_DOWNLOAD_DEADLINE_S (0: no deadline) or use a faster source"
    )


def _too_slow(display: str, rate: float, window_s: float, limits: FetchLimits) -> str:
    return (
        f"the download of {display} is too slow: {rate:.0f} bytes/s over the last {window_s:.1f} s, below the minimum "
        f"of {_num(limits.min_rate_bytes_s)} bytes/s (COG_TRITON_DOWNLOAD_MIN_RATE_BYTES_S, measured over "
        f"COG_TRITON_DOWNLOAD_RATE_GRACE_S={_num(limits.rate_grace_s)} s); use a faster source, or lower the "
        "minimum (0 disables it)"
    )


def download_file(url: str, display: str, dest: Path, limits: FetchLimits) -> tuple[str, int]:
    """Download ``url`` into ``dest`` (``display``: the URL as shown in messages); return (sha256 hex, size in
    bytes).

    Raises:
        DownloadError: see :func:`cog_triton.weights.fetch_weights`.
        FetchRefusedError: ``limits.rules`` refuse a request or connection (never retried).
    """
    install_log_redaction()
    attempts = limits.retries + 1
    watchdog = None
    if limits.deadline_s > 0:
        watchdog = FetchDeadline(limits.deadline_s, at=limits.deadline_at, what=f"the download of {display}",
                                 setting="COG_TRITON_DOWNLOAD_DEADLINE_S")
    transfer = _Transfer(dest, deadline=watchdog.at if watchdog else None, watchdog=watchdog)
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
    guarded: dict[str, Any] = {}
    # Under fetch rules every request and connection (redirects too) goes through the guarded transport. No proxy:
    # a Client given a transport mounts none from HTTP(S)_PROXY (httpx 0.28.1 _client.py, Client.__init__:
    # allow_env_proxies = trust_env and transport is None), and trust_env=False also drops .netrc credentials.
    # Either way each connect is held to the deadline (the guard's connect; the operator's through bound_connects):
    # the name resolved and every address tried within the time left.
    if limits.rules is not None:
        guard = FetchGuard(limits.rules, what=limits.what, deadline=watchdog)
        guarded = {"transport": guarded_transport(guard), "trust_env": False}
    with httpx.Client(
        timeout=httpx.Timeout(limits.timeout_s), follow_redirects=True, headers={"Accept-Encoding": "identity"},
        **guarded,
    ) as client, (watchdog or contextlib.nullcontext()):
        if watchdog is not None and limits.rules is None:
            bound_connects(client, watchdog)
        try:
            retrying(_download_once, client, url, display, transfer, limits)
        except _TransientDownloadError as exc:
            if transfer.past_deadline():
                transfer.last_error = exc.message
                raise _deadline_error(display, transfer, limits) from exc
            tries = f"after {attempts} attempts" if attempts > 1 else "(no retries configured)"
            raise DownloadError(f"{exc.message}; gave up {tries}") from exc.__cause__
    return transfer.hasher.hexdigest(), transfer.received


def _download_once(client: httpx.Client, url: str, display: str, transfer: _Transfer, limits: FetchLimits) -> None:
    """One attempt: fetch the rest of the file (or all of it) into ``transfer.dest``.

    Raises:
        _TransientDownloadError: worth another attempt (connection, timeout, truncated body, too slow, 5xx, a resume
            the server refused).
        DownloadError: not worth one (4xx, over the byte cap, an unexpected status, an invalid URL).
        FetchDeadlineError: the deadline passed.
        WeightsError: the file could not be written, or not enough free disk space.
    """
    if transfer.past_deadline():
        raise _deadline_error(display, transfer, limits)
    headers = _resume_headers(transfer)
    timeout = limits.timeout_s
    if transfer.deadline is not None:
        timeout = max(0.001, min(timeout, transfer.deadline - time.monotonic()))
    expected: Optional[int] = None
    phase = "connecting to"
    # The deadline's watchdog learns each connection of the request and its redirects from httpcore's trace
    # extension, and shuts them down when it passes (cog_triton.fetch.deadline).
    extensions = {"trace": transfer.watchdog.trace} if transfer.watchdog is not None else {}
    try:
        with client.stream("GET", url, headers=headers, timeout=timeout, extensions=extensions) as response:
            mode = _accept_answer(response, headers, display, transfer, limits)
            expected = transfer.total
            progress = _Progress(display, expected, transfer.received)
            phase = "reading from"
            _receive(response, mode, display, transfer, limits, progress)
    except FetchDeadlineError as exc:  # the watchdog ended it, whatever the server was doing
        raise _deadline_error(display, transfer, limits) from exc
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


def _resume_headers(transfer: _Transfer) -> dict[str, str]:
    """The headers of the next attempt: ``Range`` from the bytes already in ``transfer.dest`` (and ``If-Range``) when
    the server resumes and the file holds exactly them; otherwise none, and ``transfer`` starts again from byte 0."""
    headers: dict[str, str] = {}
    if transfer.received and transfer.resumable and _size_of(transfer.dest) == transfer.received:
        headers["Range"] = f"bytes={transfer.received}-"
        if transfer.validator:
            headers["If-Range"] = transfer.validator
    elif transfer.received:
        transfer.restart()
    return headers


def _accept_answer(response: httpx.Response, headers: dict[str, str], display: str, transfer: _Transfer,
                   limits: FetchLimits) -> str:
    """Check the status and headers of ``response`` to the request sent with ``headers``; record in ``transfer``
    what the server said about the file; return the mode to open ``transfer.dest`` with (``"ab"``: resumed, ``"wb"``).

    Raises:
        _TransientDownloadError: 5xx, or a resume refused (416, a Content-Range that does not continue the file).
        DownloadError: 4xx, a size over the byte cap, or another status.
        WeightsError: not enough free disk space for the announced size.
    """
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
        log.info("resuming the download of %s at byte %d of %s", display, transfer.received, transfer.total)
        return "ab"
    if status != 200:
        raise DownloadError(f"unexpected HTTP {status} {response.reason_phrase} for {display}")
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
    log.info("downloading %s (%s)", display,
             f"{transfer.total} bytes" if transfer.total is not None else "size unknown")
    if transfer.total is not None:
        check_free_space(transfer.dest.parent, transfer.total, f"the download of {display}")
    return "wb"


def _receive(response: httpx.Response, mode: str, display: str, transfer: _Transfer, limits: FetchLimits,
             progress: _Progress) -> None:
    """Write the body of ``response`` to ``transfer.dest`` (opened with ``mode``) as its bytes arrive, hashing and
    counting them, within the byte cap, the deadline and the minimum rate.

    Raises:
        DownloadError: over the byte cap.
        FetchDeadlineError: the deadline passed.
        _TransientDownloadError: too slow.
        OSError: the file could not be written; httpx's errors as the body is read.
    """
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


def _too_big(display: str, size: Optional[int], limits: FetchLimits) -> str:
    reason = f" ({limits.limit_reason})" if limits.limit_reason else ""
    return (f"{display} has more than the {limits.max_download_bytes} bytes allowed to download{reason} "
            f"({size} bytes or more); refusing it")


def _truncated(display: str, expected: int, received: int) -> str:
    return (f"truncated download of {display}: expected {expected} bytes (Content-Length), "
            f"received {received} bytes before the connection closed")


def _scrub(exc: BaseException, url: str, display: str) -> str:
    return redact_text(str(exc).replace(url, display)) or type(exc).__name__
