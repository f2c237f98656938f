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
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

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
        status: the HTTP status of the Hub's answer (kinds revision/gated/repository/file/http), else None.
        server_message: the Hub's ``X-Error-Message`` or body message, "" when none. May quote the request; scrub
            tokens before showing it.
    """

    kind: str
    error: BaseException
    status: Optional[int] = None
    server_message: str = ""

    @property
    def detail(self) -> str:
        """``<exception type>: <message>`` of :attr:`error` (unscrubbed)."""
        return f"{type(self.error).__name__}: {self.error}"


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
        return HubFailure("offline", exc)
    answered = isinstance(exc, hf.HfHubHTTPError) and not isinstance(exc, local_missing)
    message = str(getattr(exc, "server_message", None) or "") if answered else ""
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubFailure("revision", exc, _status(exc), message)
    if isinstance(exc, hf.GatedRepoError):  # before RepositoryNotFoundError, its base
        return HubFailure("gated", exc, _status(exc), message)
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubFailure("repository", exc, _status(exc), message)
    # 1.x+: RemoteEntryNotFoundError; 0.x: EntryNotFoundError, which LocalEntryNotFoundError subclasses there.
    remote_missing = getattr(hf, "RemoteEntryNotFoundError", hf.EntryNotFoundError)
    if isinstance(exc, remote_missing) and not isinstance(exc, local_missing):
        return HubFailure("file", exc, _status(exc), message)
    if answered:
        return HubFailure("http", exc, _status(exc), message)
    if isinstance(exc, hf.FileMetadataError):  # an OSError: before the disk's
        return HubFailure("not_a_hub", exc)
    if isinstance(exc, local_missing):  # not found locally, no cause given: nothing was asked or answered
        return HubFailure("unreachable", exc)
    if isinstance(exc, _unreachable_classes()):  # requests' are OSErrors: before the disk's
        return HubFailure("unreachable", exc)
    if isinstance(exc, _transport_classes()):
        return HubFailure("transport", exc)
    if isinstance(exc, OSError):
        return HubFailure("local", exc)
    return HubFailure("other", exc)


__all__ = ("KINDS", "HubFailure", "classify_hub_error")
