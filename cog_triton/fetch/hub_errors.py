"""What a failed huggingface_hub call means, the same under huggingface_hub 0.x, 1.x and 2.x.

Used where the image fetches from the Hub (:mod:`cog_triton.weights.hub` for ``hf://`` weights,
:mod:`cog_triton.streaming.lora.store` for ``hf://`` adapters), each of which turns a :class:`HubFailure` into its own
message. The error classes differ between the majors, and the differences change what an ``except`` clause
catches (read in huggingface_hub 0.36.0 and 2.4.0, ``errors.py``, ``file_download.py``, ``utils/_http.py``):

* 0.x's HTTP errors are ``requests.HTTPError`` (``HfHubHTTPError(requests.HTTPError)``), so every one of them is an
  ``OSError`` (requests' ``RequestException`` is an ``IOError``), and so are requests' ``ConnectionError`` and
  ``Timeout``: an ``except OSError`` meant for the disk catches an unreachable Hub. 1.x's are httpx's, 2.x's
  httpx2's (``HfHubHTTPError(httpx2.HTTPError, OSError)`` in 2.4.0); their transport errors are not ``OSError``.
* A missing file is ``EntryNotFoundError(HfHubHTTPError)`` in 0.x; 1.x+ split it into ``RemoteEntryNotFoundError``
  (the HTTP 404) under a plain ``EntryNotFoundError``. 0.x has no ``RemoteEntryNotFoundError``.
* ``LocalEntryNotFoundError`` (not on disk, and the Hub could not tell) subclasses ``EntryNotFoundError`` in both,
  so in 0.x it is also an ``HfHubHTTPError`` (with no response): it must be told apart before either.
* ``hf_hub_download`` wraps what went wrong with the file's ``HEAD`` in a ``LocalEntryNotFoundError`` ("An error
  happened while trying to locate the file on the Hub ...", ``_raise_on_head_call_error``, both majors) unless it
  is a missing repository, a gated one or an HTTP 401; the real error is its ``__cause__``: a connection error or
  timeout (requests', httpx's, httpx2's), an HTTP error answer (e.g. 500), or ``FileMetadataError`` (an answer
  without ``X-Repo-Commit``/``ETag``: not a Hub). A missing file or revision is raised as it is.
* ``hf_raise_for_status`` maps the Hub's ``X-Error-Code`` the same way in both: ``RepoNotFound`` (and a 401 without
  a code) -> ``RepositoryNotFoundError``, ``GatedRepo`` -> ``GatedRepoError`` (a ``RepositoryNotFoundError``),
  ``RevisionNotFound`` -> ``RevisionNotFoundError``, ``EntryNotFound`` -> the missing-file error above.
* ``HF_HUB_OFFLINE`` makes every request raise ``OfflineModeIsEnabled`` (a builtin ``ConnectionError``).

**Secrets in the messages.** huggingface_hub's messages quote the URL of the request that failed, in full, and for
an error answer also the answer's body when it is not JSON or HTML (``_format``, 0.36.0 and 2.4.0). A file in the
Hub's LFS storage is fetched from a signed URL of its CDN (the Hub's ``302``), so a CDN that answers an error puts
the signed URL (``X-Amz-Signature``, ``X-Amz-Credential``) in the message, and an S3 refusal's body echoes the
signature and the canonical request. What a :class:`HubFailure` gives to show (:attr:`HubFailure.text`,
:attr:`~HubFailure.detail`, :attr:`~HubFailure.server_message`) is therefore redacted here, once, for every caller
(:func:`cog_triton.fetch.redaction.redact_text`: no userinfo, query string or fragment of any URL in it), and the
body of an answer from any host other than the Hub endpoint's is not quoted at all.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from cog_triton.fetch.redaction import UnparsableURL, parse_url, redact_text, redact_url

#: :attr:`HubFailure.kind` values, in the order :func:`classify_hub_error` tests them.
KINDS = (
    "offline",  # HF_HUB_OFFLINE is set
    "revision",  # the Hub answered: no such revision
    "gated",  # the Hub answered: gated, and the token (if any) has no access
    "repository",  # the Hub answered: no such repository, or private and no token with access
    "file",  # the Hub answered: no such file at that revision
    "http",  # the Hub answered with another HTTP error (status and server message in the failure)
    "not_a_hub",  # something answered, without the headers every Hub file answer has (FileMetadataError)
    "unreachable",  # no answer: connection refused or failed, name not resolved, TLS failed, timed out
    "transport",  # the connection broke during the exchange (e.g. a body cut short)
    "local",  # another OSError: a file could not be written or read here
    "other",  # anything else
)


@dataclass(frozen=True)
class HubFailure:
    """A failed Hub call, classified.

    Attributes:
        kind: one of :data:`KINDS`.
        error: the exception that says what happened (the ``__cause__`` of a wrapping ``LocalEntryNotFoundError``).
            Its own text may hold secrets: show :attr:`text` or :attr:`detail` instead.
        status: the HTTP status of the answer (kinds revision/gated/repository/file/http), else None.
        server_message: the Hub's ``X-Error-Message`` or body message, redacted; "" when none, or when the answer
            came from another host than the Hub endpoint (its file CDN: its body may echo the signed request).
            Scrub tokens before showing it.
        answered_by: the URL that answered with the error (kinds with a status), redacted; "" when none.
        text: the error's message, redacted (every URL without userinfo, query string and fragment), without the
            body of an answer from another host than the Hub endpoint.
    """

    kind: str
    error: BaseException
    status: Optional[int] = None
    server_message: str = ""
    answered_by: str = ""
    text: str = ""

    @property
    def detail(self) -> str:
        """``<exception type>: <message>`` of :attr:`error`, redacted (:attr:`text`)."""
        return f"{type(self.error).__name__}: {self.text}"

    @property
    def from_hub(self) -> bool:
        """The answer (if any) came from the Hub endpoint itself, not from another host (its file CDN)."""
        return not self.answered_by or _same_origin(self.answered_by, _endpoint())


def _endpoint() -> str:
    from huggingface_hub import constants  # noqa: PLC0415 - only where the Hub is used

    return str(constants.ENDPOINT)


def _same_origin(url: str, other: str) -> bool:
    try:
        a, b = parse_url(url), parse_url(other)
    except UnparsableURL:
        return False
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


def _failure(kind: str, exc: BaseException, answered: bool = False) -> HubFailure:
    """The :class:`HubFailure` of ``exc``, its texts redacted (see the module docstring)."""
    raw_text = str(exc)
    if not answered:
        return HubFailure(kind, exc, text=redact_text(raw_text))
    response = getattr(exc, "response", None)
    url = getattr(response, "url", None)
    answered_by = redact_url(str(url)) if url is not None else ""
    raw_message = str(getattr(exc, "server_message", None) or "")
    if answered_by and not _same_origin(str(url), _endpoint()):
        if raw_message:  # the CDN's body is not quoted: huggingface_hub appends it to the message as it came
            raw_text = raw_text.replace(raw_message, "").rstrip()
        raw_message = ""
    return HubFailure(kind, exc, _status(exc), redact_text(raw_message), answered_by, redact_text(raw_text))


def _classes(module: str, *names: str) -> tuple[type, ...]:
    """The classes ``names`` of ``module`` that exist (an HTTP stack that is not installed has none)."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return ()
    return tuple(getattr(found, name) for name in names if isinstance(getattr(found, name, None), type))


def _unreachable_classes() -> tuple[type, ...]:
    """Errors of a request that got no answer, in each HTTP stack huggingface_hub uses (0.x requests, 1.x httpx,
    2.x httpx2): connect failures (including TLS and proxy ones), timeouts."""
    return (
        ConnectionError, TimeoutError,
        *_classes("requests.exceptions", "ConnectionError", "Timeout"),
        *_classes("httpx", "ConnectError", "TimeoutException", "ProxyError"),
        *_classes("httpx2", "ConnectError", "TimeoutException", "ProxyError"),
    )  # fmt: skip


def _transport_classes() -> tuple[type, ...]:
    """Any other failure of the exchange itself (requests' ``RequestException``, httpx's ``TransportError``)."""
    return (*_classes("requests.exceptions", "RequestException"), *_classes("httpx", "TransportError"),
            *_classes("httpx2", "TransportError"))


def _status(exc: BaseException) -> Optional[int]:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def classify_hub_error(exc: BaseException) -> HubFailure:
    """What ``exc``, raised by a huggingface_hub call (``HfApi`` methods, ``hf_hub_download``,
    ``get_hf_file_metadata``), means; the same answer under huggingface_hub 0.x, 1.x and 2.x (see the module
    docstring). Never raises."""
    from huggingface_hub import errors as hf  # noqa: PLC0415 - only where the Hub is used

    local_missing = hf.LocalEntryNotFoundError
    if isinstance(exc, local_missing) and exc.__cause__ is not None:
        exc = exc.__cause__  # what hf_hub_download's HEAD really met
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return _failure("offline", exc)
    answered = isinstance(exc, hf.HfHubHTTPError) and not isinstance(exc, local_missing)
    if isinstance(exc, hf.RevisionNotFoundError):
        return _failure("revision", exc, answered)
    if isinstance(exc, hf.GatedRepoError):  # before RepositoryNotFoundError, its base
        return _failure("gated", exc, answered)
    if isinstance(exc, hf.RepositoryNotFoundError):
        return _failure("repository", exc, answered)
    # 1.x+: RemoteEntryNotFoundError; 0.x: EntryNotFoundError, which LocalEntryNotFoundError subclasses there.
    remote_missing = getattr(hf, "RemoteEntryNotFoundError", hf.EntryNotFoundError)
    if isinstance(exc, remote_missing) and not isinstance(exc, local_missing):
        return _failure("file", exc, answered)
    if answered:
        return _failure("http", exc, answered)
    if isinstance(exc, hf.FileMetadataError):  # an OSError: before the disk's
        return _failure("not_a_hub", exc)
    if isinstance(exc, local_missing):  # not found locally, no cause given: nothing was asked or answered
        return _failure("unreachable", exc)
    if isinstance(exc, _unreachable_classes()):  # requests' are OSErrors: before the disk's
        return _failure("unreachable", exc)
    if isinstance(exc, _transport_classes()):
        return _failure("transport", exc)
    if isinstance(exc, OSError):
        return _failure("local", exc)
    return _failure("other", exc)


__all__ = ("KINDS", "HubFailure", "classify_hub_error")
