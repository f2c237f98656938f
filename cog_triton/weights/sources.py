"""Weights sources: parsing a source (http(s) URL, file:// URL, local path, or an ``hf://owner/repo[@revision]``
reference to the Hugging Face Hub), and fingerprints and hashes of local sources. URLs are shown redacted
(:func:`cog_triton.fetch.redaction.redact_url`, re-exported here as before).

Part of :mod:`cog_triton.weights` (its public face is the package); the other modules of the package use these
names. It imports no other module of the package.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Optional, Union
from urllib.parse import urlsplit
from urllib.request import url2pathname

from cog_triton.fetch.redaction import UnparsableURL, parse_url, redact_text, redact_url
from common.errors import WeightsError
from common.files import MARKER_NAME, sha256_file

log = logging.getLogger("cog_triton.weights")


SUPPORTED_KINDS = ".tar, .tar.gz/.tgz (also .tar.bz2, .tar.xz) or a directory"
#: The Hugging Face Hub form of a weights source (a checkpoint fetched with huggingface_hub: cog_triton.weights.hub).
HUB_FORM = "hf://owner/repo[@revision]"

SCHEME = "hf://"
#: A Hub repository id, ``owner/name`` (huggingface_hub's validate_repo_id rules, without the length check).
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
#: A branch, tag or commit (git ref characters; "/" allowed, as in "refs/pr/1").
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
FORM = "hf://owner/repo or hf://owner/repo@revision (a branch, tag or commit)"


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


SourceLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class HubRef:
    """A checked ``hf://`` weights source.

    Attributes:
        text: the reference as given (stripped); safe to log (it holds no credentials).
        repo_id: ``owner/name``.
        revision: branch, tag or commit; None for the repository's default branch.
    """

    text: str
    repo_id: str
    revision: Optional[str] = None


def is_hub_source(text: str) -> bool:
    """True when ``text`` uses the ``hf://`` scheme (any case)."""
    return text.strip()[: len(SCHEME)].lower() == SCHEME


def parse_hub_ref(text: str) -> HubRef:
    """The :class:`HubRef` of ``hf://owner/repo[@revision]``.

    Raises:
        WeightsError: not of that form; the message shows the value and the form.
    """
    stripped = text.strip()
    if not is_hub_source(stripped):
        raise WeightsError(f"weights source {stripped[:200]!r} is not an hf:// reference; give {FORM}")
    body = stripped[len(SCHEME):].strip("/")
    repo, at, revision = body.partition("@")
    if not _REPO_RE.match(repo) or (at and not _REVISION_RE.match(revision)):
        raise WeightsError(f"weights source {stripped[:200]!r} is not a Hugging Face reference of the form {FORM}")
    return HubRef(text=stripped, repo_id=repo, revision=revision or None)


@dataclass(frozen=True)
class Source:
    """A parsed weights source: exactly one of ``url``, ``path`` and ``hub`` is set.

    Attributes:
        key: the marker's key of this source: the sha256 (hex) of the full URL, of the ``hf://`` text, or of
            ``local:`` and the absolute path.
        display: the source as shown in logs and messages (a URL without its userinfo, query and fragment).
        url: an http(s) URL.
        path: a local file or directory (absolute).
        hub: an ``hf://`` reference.
    """

    key: str
    display: str
    url: Optional[str] = None
    path: Optional[Path] = None
    hub: Optional[HubRef] = None


def parse_source(source: SourceLike) -> Source:
    """The :class:`Source` of ``source``: an http(s) URL, a ``file://`` URL, a local path (str or path; ``~`` is
    expanded, relative paths are made absolute) or ``hf://owner/repo[@revision]``. Nothing is read or fetched.

    Raises:
        WeightsError: empty, an unsupported scheme, an http(s) URL the HTTP client cannot parse or without a host,
            a ``file://`` URL naming another host, or a malformed ``hf://`` reference.
        TypeError: ``source`` is neither a str nor a path.
    """
    if isinstance(source, os.PathLike):
        path = Path(os.fspath(source))
    elif isinstance(source, str):
        text = source.strip()
        if not text:
            raise WeightsError(f"the weights source is empty; give an http(s) URL, a file:// URL or a path to a "
                               f"{SUPPORTED_KINDS}, or {HUB_FORM}")
        match = _SCHEME_RE.match(text)
        if match is None:
            path = Path(text).expanduser()
        else:
            scheme = match.group(1).lower()
            if scheme in ("http", "https"):
                try:  # split as the HTTP client will split it (cog_triton.fetch.redaction)
                    host = parse_url(text).host
                except UnparsableURL as exc:
                    raise WeightsError(exc.refusal("the weights URL")) from None
                if not host:
                    raise WeightsError(f"weights URL {redact_url(text)} has no host")
                return Source(key=_sha256_text(text), display=redact_url(text), url=text)
            if scheme == "hf":
                ref = parse_hub_ref(text)
                return Source(key=_sha256_text(ref.text), display=ref.text, hub=ref)
            if scheme == "file":
                parts = urlsplit(text)
                if parts.netloc not in ("", "localhost"):
                    raise WeightsError(f"file:// URL {redact_url(text)} names the host {parts.hostname!r}; "
                                       "only local files (file:///path) are supported")
                path = Path(url2pathname(parts.path))
            else:
                raise WeightsError(f"unsupported weights URL scheme {scheme!r} in {redact_url(text)}; "
                                   f"use http://, https://, file://, a local path or {HUB_FORM}")
    else:
        raise TypeError(f"source must be a str or a path, got {type(source).__name__}")
    path = path.absolute()
    return Source(key=_sha256_text("local:" + os.fspath(path)), display=os.fspath(path), path=path)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def normalize_sha256(value: Optional[str], display: str) -> Optional[str]:
    """``value`` as 64 lower-case hex digits, or None when it is None or blank (``display``: the source, for the
    message).

    Raises:
        WeightsError: not 64 hexadecimal characters.
    """
    if value is None:
        return None
    normalized = value.strip().lower()
    if not normalized:
        return None
    if not _SHA256_RE.match(normalized):
        raise WeightsError(f"the expected sha256 for {display} must be 64 hexadecimal characters, got {value!r}")
    return normalized


def directory_overlap(source: Path, target: Path) -> Optional[str]:
    """How the folders ``source`` and ``target`` overlap once resolved: ``"same"``, ``"the target is inside the
    source"``, ``"the source is inside the target"``, or None when they are apart."""
    src, dst = source.resolve(), target.resolve()
    if src == dst:
        return "same"
    if dst.is_relative_to(src):
        return "the target is inside the source"
    if src.is_relative_to(dst):
        return "the source is inside the target"
    return None


def local_fingerprint(path: Path, kind: str, display: str) -> dict[str, Any]:
    """Size (bytes) and mtime (ns) of a local archive (``kind`` "archive"), or for a ``"directory"`` the number of
    its files, their total bytes and a digest over (path, size, mtime) of each (its marker left out): what the marker
    records to tell that a local source changed.

    Raises:
        WeightsError: a file could not be read, or the folders nest too deeply to walk.
    """
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


def hash_file(path: Path, display: str) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of the local archive ``path``.

    Raises:
        WeightsError: it could not be read.
    """
    try:
        return sha256_file(path)
    except OSError as exc:
        raise WeightsError(f"could not read the weights archive {display}: {exc}") from exc


__all__ = (
    "FORM", "HUB_FORM", "SCHEME", "SUPPORTED_KINDS", "HubRef", "Source", "SourceLike", "directory_overlap", "hash_file",
    "is_hub_source", "local_fingerprint", "normalize_sha256", "parse_hub_ref", "parse_source", "redact_text",
    "redact_url",
)  # fmt: skip
