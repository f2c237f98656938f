"""Fetch model weights into a local folder: download, verify, safely unpack, and skip when unchanged.

:func:`fetch_weights` accepts an http(s) URL, a ``file://`` URL or a local path, pointing to a
``.tar`` / ``.tar.gz`` (``.tgz``; bzip2 and xz work too) archive or to a directory, or ``hf://owner/repo[@revision]``
(a Hugging Face checkpoint fetched from the Hub with huggingface_hub: :mod:`cog_triton.weights.hub`), and leaves
its contents in ``target_dir``:

* One fetch at a time per target: the whole fetch holds an exclusive lock (``flock``) on
  ``.<target name>.lock`` beside the target (:func:`cog_triton.fetch.folders.target_lock`, which the LoRA adapter
  cache takes too); a second fetch waits, then finds the marker and skips.
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
  paths, ``..`` components, paths deeper than :data:`~cog_triton.weights.archive.MAX_MEMBER_DEPTH` components or
  longer than :data:`~cog_triton.weights.archive.MAX_MEMBER_PATH_BYTES`, links that resolve outside the target,
  device files, FIFOs and sparse files are refused with :class:`~common.errors.ArchiveError`.
* The unpacked size is bounded (see :func:`fetch_weights`, ``max_extracted_bytes``): every
  member's declared size and every byte written count, and free disk space is checked before the
  extraction and before each file (:func:`cog_triton.fetch.folders.check_free_space`).
* An archive an API caller gave (an adapter) is also held to a member limit (``max_members``), counted before
  anything is written, its tar stream to what that many members can take, and its unpacking to the fetch's
  deadline (``unpack_in_deadline``); the operator's own weights keep neither.
* Everything is unpacked (or copied) into a staging folder beside ``target_dir`` which then
  replaces ``target_dir`` by rename, so a failed fetch leaves the previous weights in place.
* A marker file (:data:`~common.files.MARKER_NAME`) records what was fetched; the next identical fetch whose
  files are all still present with their recorded sizes is skipped. Verification records
  (:data:`~common.files.VERIFIED_NAME`) in an archive or a copied folder are dropped: only this
  machine's own hashing writes them.

URLs are never logged or put into error messages with their userinfo, query string or fragment, as the
HTTP client's own parser splits them (:func:`redact_url`; a URL it cannot parse is refused without being shown);
every log record of the process, httpx's, httpcore's, huggingface_hub's and urllib3's included, is redacted the
same way (:mod:`cog_triton.fetch.redaction`).

The package, one module per concern. This module is its one public face: other packages import from
``cog_triton.weights`` only, never from its modules, and no module of it imports another's private (underscored)
names (``tests/test_layers.py``). Its modules import each other one way, every import at module top:

* :mod:`~cog_triton.weights.sources`: what a source is (URL, path or ``hf://`` reference), redaction, local
  fingerprints (imports no other module of the package);
* :mod:`~cog_triton.weights.download`: HTTP download with retries, resume, deadline and minimum rate;
* :mod:`~cog_triton.weights.archive`: safe extraction of tar (and zip) archives within a byte budget (← sources);
* :mod:`~cog_triton.weights.cache`: the marker and the atomic staging swap;
* :mod:`~cog_triton.weights.hub`: ``hf://`` sources (the files of a checkpoint, at one commit, staged) (← sources,
  cache);
* :mod:`~cog_triton.weights.install`: :func:`fetch_weights`, which puts them together (← all of them).

The folder's lock and the free-space check are :mod:`cog_triton.fetch.folders`, the lower fetching layer, since the
LoRA adapter cache uses them too.
"""

from __future__ import annotations

from cog_triton.weights.archive import EXTRACT_FLOOR_BYTES, EXTRACT_RATIO, MANIFEST_SLACK_BYTES
from cog_triton.fetch.deadline import (
    DEFAULT_DOWNLOAD_DEADLINE_S,
    DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S,
    DEFAULT_DOWNLOAD_RATE_GRACE_S,
)
from cog_triton.weights.install import WeightsResult, fetch_weights
from cog_triton.weights.sources import SUPPORTED_KINDS, redact_text, redact_url

__all__ = (
    "DEFAULT_DOWNLOAD_DEADLINE_S",
    "DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S",
    "DEFAULT_DOWNLOAD_RATE_GRACE_S",
    "EXTRACT_FLOOR_BYTES",
    "EXTRACT_RATIO",
    "MANIFEST_SLACK_BYTES",
    "SUPPORTED_KINDS",
    "WeightsResult",
    "fetch_weights",
    "redact_text",
    "redact_url",
)
