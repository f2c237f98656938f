"""URLs as the HTTP client parses them: what a URL shows in messages and logs, which URLs are refused, and the
redaction of every log record of the process.

A URL's secrets are its userinfo (``user:password@``), its query string (pre-signed URLs carry
``X-Amz-Signature`` and ``X-Amz-Credential`` there) and its fragment. Where the text of a URL is split is decided
by **the parser the HTTP client uses** (``httpx.URL``, httpx 0.28.1 ``httpx/_urlparse.py``), never by another one:
``https://deploy:hunter2/SECRET@example.com/a.tar.gz`` (a password with an unencoded ``/``) is, for
``urllib.parse.urlsplit`` and for httpx alike, the host ``deploy`` with the port ``hunter2``: httpx refuses it
("Invalid port: 'hunter2'"), and a redaction that only removed ``...@`` left the password in the log. So:

* :func:`parse_url`: a URL as the client will request it, or :class:`UnparsableURL` whose message names why
  (httpx's reason up to its first ``:``: "Invalid port", "Invalid IPv4 address", "Invalid IDNA hostname") and
  never holds the URL or any part of it. Callers refuse such a URL by their own rule (the input named, the secret
  not echoed) before anything is fetched or logged: ``0177.0.0.1`` (an octal IPv4 address), a fullwidth host
  name and a password with ``/`` are refused that way.
* :func:`redact_url`: a URL for messages: scheme, host, port and path as httpx parsed them, no userinfo, query or
  fragment; ``<unparsable URL>`` for one the parser refuses.
* :func:`redact_text`: free text (a log line, an exception's message) with every absolute URL in it replaced by
  its :func:`redact_url` form, and, with ``relative=True``, the query string and fragment of relative URLs (a
  redirect's ``Location: /path?sig=...`` in httpcore's DEBUG lines, urllib3's ``"GET /path?sig=... HTTP/1.1"``)
  removed too.
* :func:`redact_error` / :func:`errors_redacted`: an exception's message redacted in place before it leaves our code
  (the error a caller gets: coglet shows and logs ``<type>: <str(error)>`` in its own "Prediction failed" line, which
  the log redaction below cannot reach: replicate/cog 6110c912 ``crates/coglet-python/src/predictor.rs``,
  ``crates/coglet/src/orchestrator.rs``). Our own errors (``CogTritonError``) lose every absolute URL's secrets; any
  other exception's text (a library's, which may quote a request line) loses relative URLs' query strings and
  fragments too.
* :func:`install_log_redaction`: every log record the process creates passes through :func:`redact_text`
  (message, and the traceback text of a record with ``exc_info``) before any handler sees it: a record factory
  (``logging.setLogRecordFactory``, the standard library's hook for every record of every logger, present or
  created later). Records of the HTTP clients' loggers (:data:`HTTP_LOGGERS`: httpx, httpcore, httpx2 and
  httpcore2 of huggingface_hub 2.x, urllib3 of its 0.x, huggingface_hub itself) get the relative-URL rule too;
  other loggers' text is left alone but for absolute URLs (a "?" in prose is not a query string).

Hot path: none. A record costs one formatting of its message and a substring test (``://``, ``?``, ``#``); only
text that holds one is scanned.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import traceback
from typing import Any, Callable, Iterator

import httpx

#: Loggers of the HTTP clients a fetch may use (and their children): httpx and httpcore (our downloads),
#: httpx2 and httpcore2 (huggingface_hub 2.x's client), urllib3 (0.x's, through requests), huggingface_hub,
#: hpack (HTTP/2 headers). Their records also lose relative URLs' query strings and fragments.
HTTP_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2", "urllib3", "requests", "huggingface_hub", "hpack")

#: What a URL the client cannot parse shows instead of itself.
UNPARSABLE = "<unparsable URL>"

# An absolute URL in free text: a scheme, "://", then everything up to white space, a quote or an angle bracket
# (log lines quote URLs as reprs and bytes reprs: b'https://...').
_ABSOLUTE_URL_RE = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")
# A relative URL's query string or fragment (a Location header, a request line), in the HTTP clients' lines.
_QUERY_RE = re.compile(r"\?[^\s'\"<>)\]]+")
_FRAGMENT_RE = re.compile(r"(?<=[\w/])#[^\s'\"<>)\]]+")


class UnparsableURL(ValueError):
    """A URL the HTTP client's parser refuses. ``reason`` is httpx's reason without the part of the URL it quotes
    (safe to show: "Invalid port", "Invalid IPv4 address", ...); ``hint`` says what to change."""

    def __init__(self, reason: str, hint: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint

    def refusal(self, name: str) -> str:
        """The message refusing the value of ``name`` (an input, a setting): the reason and the fix, never the
        value."""
        hint = f" {self.hint}" if self.hint else ""
        return (f"{name} is not a URL the HTTP client can parse ({self.reason}); the value is not shown, as it may "
                f"hold a password.{hint}")


def _reason(exc: Exception) -> tuple[str, str]:
    """(reason, hint) of httpx's ``InvalidURL``: its message up to the first ':' or ',' (what follows quotes the
    URL: "Invalid port: 'hunter2'"), at most 60 characters."""
    reason = re.split(r"[:,]", str(exc), maxsplit=1)[0].strip()[:60] or type(exc).__name__
    lowered = reason.lower()
    if "port" in lowered:
        hint = ("Between '//' and the next '/' a URL holds [user[:password]@]host[:port]: percent-encode '/', '@', "
                "':', '?' and '#' in a user name or password (%2F, %40, %3A, %3F, %23).")
    elif "ipv4" in lowered:
        hint = "Write an IPv4 address as four decimal numbers (octal and hexadecimal forms are not accepted)."
    elif "ipv6" in lowered:
        hint = "Write an IPv6 address in brackets, as [2001:db8::1]."
    elif "idna" in lowered:
        hint = "The host is not a valid internationalized domain name: write it in ASCII (or punycode, xn--...)."
    else:
        hint = ""
    return reason, hint


def parse_url(text: str) -> httpx.URL:
    """``text`` as the HTTP client (httpx) parses it: the URL it would request.

    Raises:
        UnparsableURL: httpx refuses it (``httpx.InvalidURL``) or it holds white space or control characters;
            the message never holds the URL nor any part of it.
    """
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise UnparsableURL("white space or a control character", "Percent-encode it (%20 for a space).")
    try:
        return httpx.URL(text)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise UnparsableURL(*_reason(exc)) from None


def redact_url(url: str) -> str:
    """``url`` without userinfo, query string and fragment, split by the HTTP client's parser (:func:`parse_url`):
    ``https://u:p@host:8443/a/b.tgz?sig=1#f`` -> ``https://host:8443/a/b.tgz``; :data:`UNPARSABLE` for a URL the
    parser refuses (its text is never shown)."""
    try:
        parsed = parse_url(url)
    except UnparsableURL:
        return UNPARSABLE
    try:
        return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
    except (httpx.InvalidURL, ValueError, TypeError):
        return UNPARSABLE


def _redact_match(match: "re.Match[str]") -> str:
    text = match.group(0)
    tail = ""
    while text and text[-1] in ".,;:!)]}":  # prose around a URL ("see https://host/x."), kept outside of it
        tail = text[-1] + tail
        text = text[:-1]
    try:
        parsed = parse_url(text)
    except UnparsableURL:
        scheme = text.split("://", 1)[0]
        return f"{scheme}://{UNPARSABLE}{tail}"
    if not parsed.userinfo and not parsed.query and not parsed.fragment:
        return match.group(0)  # nothing secret: the text as it was
    return redact_url(text) + tail


def redact_text(text: str, relative: bool = True) -> str:
    """``text`` with every absolute URL in it shown as :func:`redact_url` shows it (one the client cannot parse:
    ``scheme://<unparsable URL>``), and with ``relative``, every other query string (``?...``) and fragment
    (``#...``) removed too (a relative redirect's ``Location``, a request line)."""
    if "://" in text:
        text = _ABSOLUTE_URL_RE.sub(_redact_match, text)
    if relative:
        if "?" in text:
            text = _QUERY_RE.sub("?<redacted>", text)
        if "#" in text:
            text = _FRAGMENT_RE.sub("#<redacted>", text)
    return text


def _is_http_logger(name: str) -> bool:
    return name.split(".", 1)[0] in HTTP_LOGGERS


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Redact ``record`` in place (see the module docstring): its message (``msg`` replaced by the redacted text,
    ``args`` emptied, when anything changed) and the traceback text of its ``exc_info`` (``exc_text``, which
    ``logging.Formatter`` uses as it is once set)."""
    relative = _is_http_logger(record.name)
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a broken record is the handler's to report, not ours
        return record
    if "://" in message or (relative and ("?" in message or "#" in message)):
        redacted = redact_text(message, relative)
        if redacted != message:
            record.msg, record.args = redacted, ()
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = redact_text(text, relative)
    return record


def redact_error(error: BaseException) -> BaseException:
    """``error``, its message redacted (see the module docstring); the same object, changed in place, when its text
    comes from its arguments (``CogTritonError.message``, ``args``), else a ``RuntimeError`` of its redacted text
    (``<type>: <message>``). Exceptions that are not errors (``CancelledError``, ``GeneratorExit``, ...) are left
    alone."""
    from common.errors import CogTritonError  # noqa: PLC0415 - the error tree, below this package

    if not isinstance(error, Exception):
        return error
    if isinstance(error, CogTritonError):
        message = redact_text(error.message, relative=False)
        if message != error.message:
            error.message = message
            error.args = (message,)
        return error
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - an exception whose str() fails: nothing of it is shown
        return error
    if redact_text(text) == text:
        return error
    error.args = tuple(redact_text(arg) if isinstance(arg, str) else arg for arg in error.args)
    try:
        if redact_text(str(error)) == str(error):
            return error
    except Exception:  # noqa: BLE001
        pass
    return RuntimeError(redact_text(f"{type(error).__name__}: {text}"))


@contextlib.contextmanager
def errors_redacted() -> Iterator[None]:
    """Every error raised in the block leaves it redacted (:func:`redact_error`)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised, redacted
        safe = redact_error(exc)
        if safe is exc:
            raise
        raise safe from None


_installed_lock = threading.Lock()


def install_log_redaction() -> None:
    """Make every log record of this process pass through :func:`redact_record` (idempotent): the current record
    factory is wrapped (``logging.setLogRecordFactory``; Python's logging HOWTO, "LogRecord factories"), so every
    logger, including those created later (``httpcore.http11``, ``huggingface_hub.file_download``), is covered,
    and a factory installed before keeps working under it."""
    with _installed_lock:
        current: Callable[..., logging.LogRecord] = logging.getLogRecordFactory()
        if getattr(current, "_cog_triton_redacts", False):
            return

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return redact_record(current(*args, **kwargs))

        factory._cog_triton_redacts = True  # type: ignore[attr-defined]
        logging.setLogRecordFactory(factory)


__all__ = (
    "HTTP_LOGGERS", "UNPARSABLE", "UnparsableURL", "errors_redacted", "install_log_redaction", "parse_url",
    "redact_error", "redact_record", "redact_text", "redact_url",
)
