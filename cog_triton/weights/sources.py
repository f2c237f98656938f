"""Weights sources: parsing a source (http(s) URL, file:// URL, local path), and fingerprints and hashes of local
sources. URLs are shown redacted (:func:`cog_triton.fetch.redaction.redact_url`, re-exported here as before).

Part of :mod:`cog_triton.weights` (its public face is the package).
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


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


SourceLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class _Source:
    key: str  # sha256 of the full source string (URL) or of the absolute path (local)
    display: str  # safe to log
    url: Optional[str] = None  # http(s) URL
    path: Optional[Path] = None  # local file or directory (absolute)
    hub: Optional[Any] = None  # an hf:// reference (cog_triton.weights.hub.HubRef)


def _parse_source(source: SourceLike) -> _Source:
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
                return _Source(key=_sha256_text(text), display=redact_url(text), url=text)
            if scheme == "hf":
                from cog_triton.weights.hub import parse_hub_ref  # noqa: PLC0415 - hub imports this module

                ref = parse_hub_ref(text)
                return _Source(key=_sha256_text(ref.text), display=ref.text, hub=ref)
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
