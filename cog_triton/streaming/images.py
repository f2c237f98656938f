"""A prediction's images in a stream process: read or fetched, and checked, before the request goes to Triton.

An image comes as a file Cog downloaded or received (``image_input``: a local path), a ``data:`` URI or an
``https://`` URL (image parts of ``messages``). Each one is held to :class:`ImageLimits` (``COG_TRITON_IMAGE_*``,
``cog_triton/settings/inputs.py``), in this order, and the first problem refuses the prediction with an
:class:`common.errors.ImageInputError` naming the image (``image_input[1]``, ``messages[0].content[2]``), what was
wrong and what is allowed:

* **count**: at most ``max_count`` images, counted before any is read or fetched;
* **bytes**: a file, a data URI's decoded bytes and a download are cut off past ``max_bytes`` (a file's size is read
  from the file system first, a data URI's from its length before it is decoded, a download's from its
  ``Content-Length`` and then as it arrives);
* **URLs** are fetched under the fetch rules (:mod:`cog_triton.fetch.rules`: https only unless
  ``COG_TRITON_FETCH_ALLOW_HTTP``, public addresses only, checked on the address connected to, each redirect
  included, the host allow-list), through the guarded transport (:func:`cog_triton.fetch.guard.guarded_transport`),
  all of a prediction's URLs within one deadline (``image_fetch_deadline_s``,
  :class:`cog_triton.fetch.deadline.FetchDeadline`), no proxy, no retry;
* **format**: Pillow opens the bytes with its JPEG, PNG, WebP and GIF readers only (``Image.open(...,
  formats=...)``), so no other parser ever reads them;
* **pixels**: width x height from the header, before any pixel is decoded: a decompression bomb (a small file that
  decodes to gigabytes) is refused unread;
* **animation**: an animated GIF, PNG or WebP (more than one frame) is refused: the models served take still images
  (TensorRT-LLM 1.2.1 passes video as its own modality, ``multi_modal_data["video"]``);
* **decoding**: the whole image is decoded (``Image.load``), so a truncated or corrupt file is refused here.

Why decode here, where the pixels are not used (the Triton model decodes the same bytes again for the LLM): a
malformed file that crashes a decoder takes down this stream process (its predictions fail and it is restarted,
:mod:`cog_triton.worker.stream_pool`), not Triton; and the model gets files that are known to decode. The bytes,
not the pixels, travel to Triton: a 16-megapixel image is 48 MB as RGB and a few MB as a JPEG, and the Python
backend moves request tensors through shared memory (``/dev/shm``, 64 MB by default in a Docker container).
Blocking (file reads, downloads, decoding): runs in the thread that prepares a request, off the event loop.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Sequence

from common.errors import FetchDeadlineError, FetchRefusedError, ImageInputError
from cog_triton.fetch.deadline import FetchDeadline
from cog_triton.fetch.guard import FetchGuard, guarded_transport
from cog_triton.fetch.redaction import UnparsableURL, parse_url, redact_url
from cog_triton.stream_config import IMAGE_URLS, ImageLimits

log = logging.getLogger(__name__)

#: Pillow's readers an image may be opened with (``Image.open(formats=...)``), and their names in messages.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF")
FORMAT_NAMES = "JPEG, PNG, WebP, GIF (stills)"
#: Settings named in messages.
COUNT_SETTING = "COG_TRITON_IMAGE_MAX_COUNT"
PIXELS_SETTING = "COG_TRITON_IMAGE_MAX_PIXELS"
BYTES_SETTING = "COG_TRITON_IMAGE_MAX_BYTES"
DEADLINE_SETTING = "COG_TRITON_IMAGE_FETCH_DEADLINE_S"
#: Longest wait for one network operation of an image fetch (connect, a read), seconds; capped by the deadline.
FETCH_OPERATION_TIMEOUT_S = 10.0
#: What image fetches are called in the fetch rules' messages.
WHAT = IMAGE_URLS
_DATA_URI = re.compile(r"^data:(image/[A-Za-z0-9.+-]+)?(;[^,;]*=[^,;]*)*;base64,", re.IGNORECASE)


@dataclass(frozen=True)
class ImageRef:
    """An image as a prediction gives it.

    Attributes:
        source: a local file's path (a file Cog downloaded or received), a ``data:image/...;base64,`` URI, or an
            ``http(s)://`` URL.
        where: the input it came from, for messages (``image_input[0]``, ``messages[1].content[0]``).
    """

    source: str
    where: str

    @property
    def kind(self) -> str:
        """"url", "data" or "file"."""
        head = self.source[:8].lower()
        if head.startswith(("https://", "http://")):
            return "url"
        if head.startswith("data:"):
            return "data"
        return "file"


@dataclass(frozen=True)
class CheckedImage:
    """An image that passed every check: its file's bytes as given, what Pillow read, and where it came from.

    Attributes:
        data: the encoded file (JPEG, PNG, WebP or GIF bytes).
        format: Pillow's format name ("JPEG", "PNG", "WEBP", "GIF").
        width: pixels. height: pixels.
        where: the input it came from.
    """

    data: bytes
    format: str
    width: int
    height: int
    where: str


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 20 else f"{n} bytes"


def _too_large(where: str, size: int, limits: ImageLimits) -> ImageInputError:
    return ImageInputError(f"{where} is {_mb(size)}; an image may have at most {_mb(limits.max_bytes)} "
                           f"({BYTES_SETTING}); send a smaller file")


def check_image(data: bytes, where: str, limits: ImageLimits) -> CheckedImage:
    """Check one image file's bytes (format, pixels, frames, decoding; see the module docstring).

    Raises:
        ImageInputError: naming the image, what is wrong and what is allowed.
    """
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415 - only for images

    if len(data) > limits.max_bytes:
        raise _too_large(where, len(data), limits)
    try:
        image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    except UnidentifiedImageError:
        raise ImageInputError(f"{where} is not an image in a format taken here ({FORMAT_NAMES})") from None
    except Image.DecompressionBombError as exc:  # Pillow's own bound (2 x Image.MAX_IMAGE_PIXELS), past ours
        raise ImageInputError(f"{where} is refused before decoding: {exc}; an image may have at most "
                              f"{limits.max_pixels} pixels ({PIXELS_SETTING})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageInputError(f"{where} could not be read as an image: {exc}") from None
    with image:
        width, height = image.size
        if width * height > limits.max_pixels:
            raise ImageInputError(
                f"{where} is {width} x {height} = {width * height} pixels; an image may have at most "
                f"{limits.max_pixels} pixels ({PIXELS_SETTING}); send a smaller image (it was not decoded)")
        frames = int(getattr(image, "n_frames", 1) or 1)
        if frames > 1:
            raise ImageInputError(f"{where} is animated ({frames} frames); this model takes still images: send one "
                                  "frame as a still JPEG, PNG, WebP or GIF")
        fmt = str(image.format)
        try:
            image.load()
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise ImageInputError(f"{where} could not be decoded as a {fmt} image: {exc}") from None
    return CheckedImage(data=data, format=fmt, width=width, height=height, where=where)


def read_file(path: str, where: str, limits: ImageLimits) -> bytes:
    """The bytes of a local image file (its size checked before it is read).

    Raises:
        ImageInputError: the file is missing, unreadable or larger than ``max_bytes``.
    """
    try:
        size = os.stat(path).st_size
        if size > limits.max_bytes:
            raise _too_large(where, size, limits)
        with open(path, "rb") as handle:
            data = handle.read(limits.max_bytes + 1)
    except OSError as exc:
        raise ImageInputError(f"{where} could not be read: {exc.strerror or exc}") from None
    if len(data) > limits.max_bytes:
        raise _too_large(where, len(data), limits)
    return data


def read_data_uri(uri: str, where: str, limits: ImageLimits) -> bytes:
    """The bytes of a ``data:image/<type>;base64,<data>`` URI (their count checked before they are decoded).

    Raises:
        ImageInputError: not a base64 image data URI, not valid base64, or larger than ``max_bytes``.
    """
    match = _DATA_URI.match(uri)
    if match is None or match.group(1) is None:
        raise ImageInputError(f"{where} is a data URI that is not data:image/<type>;base64,<data> (a base64 image "
                              "is taken, as OpenAI's image parts send it)")
    payload = uri[match.end():]
    if len(payload) * 3 // 4 - 2 > limits.max_bytes:
        raise _too_large(where, len(payload) * 3 // 4, limits)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(f"{where} is a data URI whose data is not valid base64") from None


def fetch_url(url: str, where: str, limits: ImageLimits, deadline: FetchDeadline) -> bytes:
    """Download an image URL under the fetch rules within ``deadline`` (see the module docstring).

    Raises:
        ImageInputError: the URL is unparsable or refused by the rules (no request was sent), the deadline passed,
            the server answered an error, the body is larger than ``max_bytes``, or the transfer failed.
    """
    import httpx  # noqa: PLC0415 - only for image URLs

    try:
        parse_url(url)
    except UnparsableURL as exc:
        raise ImageInputError(f"{where} is not a URL the server can fetch ({exc.reason})") from None
    shown = redact_url(url)
    if limits.rules is None:
        raise ImageInputError(f"{where} is a URL ({shown}), and this server fetches no image URLs")
    guard = FetchGuard(limits.rules, what=WHAT)
    timeout = max(0.001, min(FETCH_OPERATION_TIMEOUT_S, deadline.remaining()))
    try:
        deadline.check()
        with httpx.Client(transport=guarded_transport(guard), trust_env=False, follow_redirects=True,
                          timeout=httpx.Timeout(timeout)) as client:
            with client.stream("GET", url, extensions={"trace": deadline.trace}) as response:
                if response.status_code >= 400:
                    raise ImageInputError(f"{where}: HTTP {response.status_code} {response.reason_phrase} for "
                                          f"{shown}; check the URL")
                announced = response.headers.get("content-length")
                if announced is not None and announced.isdigit() and int(announced) > limits.max_bytes:
                    raise _too_large(where, int(announced), limits)
                chunks: list[bytes] = []
                received = 0
                for chunk in response.iter_bytes():
                    received += len(chunk)
                    if received > limits.max_bytes:
                        raise _too_large(where, received, limits)
                    chunks.append(chunk)
    except FetchRefusedError as exc:
        raise ImageInputError(f"{where} {shown} is refused: {exc.message}") from None
    except FetchDeadlineError:
        raise ImageInputError(f"{where} {shown}: {deadline.error().message}") from None
    except httpx.HTTPError as exc:
        if deadline.passed():
            raise ImageInputError(f"{where} {shown}: {deadline.error().message}") from None
        raise ImageInputError(f"{where} {shown} could not be fetched: {type(exc).__name__}") from None
    return b"".join(chunks)


def load_images(refs: Sequence[ImageRef], limits: ImageLimits) -> list[CheckedImage]:
    """Read, fetch and check a prediction's images, in order (see the module docstring). Blocking.

    Raises:
        ImageInputError: more images than ``max_count``, or the first image that fails a check.
    """
    if len(refs) > limits.max_count:
        raise ImageInputError(f"{len(refs)} images were given; a prediction may carry at most {limits.max_count} "
                              f"({COUNT_SETTING})")
    started = time.monotonic()
    urls = [ref for ref in refs if ref.kind == "url"]
    deadline = None
    if urls:
        what = f"the fetch of {len(urls)} image URL{'s' if len(urls) > 1 else ''}"
        deadline = FetchDeadline(limits.fetch_deadline_s, what=what, setting=DEADLINE_SETTING)
    checked = []
    with deadline if deadline is not None else contextlib.nullcontext():
        for ref in refs:
            if ref.kind == "url":
                assert deadline is not None
                data = fetch_url(ref.source, ref.where, limits, deadline)
            elif ref.kind == "data":
                data = read_data_uri(ref.source, ref.where, limits)
            else:
                data = read_file(ref.source, ref.where, limits)
            checked.append(check_image(data, ref.where, limits))
    if checked:
        log.debug("%d image(s) read and checked in %.1f ms", len(checked), (time.monotonic() - started) * 1e3)
    return checked


__all__ = ["ALLOWED_FORMATS", "CheckedImage", "ImageRef", "check_image", "fetch_url", "load_images",
           "read_data_uri", "read_file"]
