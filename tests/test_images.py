"""A prediction's images in a stream process (cog_triton/streaming/images.py): each limit refuses with a message
naming the image and what is allowed, a decompression bomb is refused before it is decoded, and image URLs are
fetched under the fetch rules and the deadline. Real Pillow, real files, and real HTTP servers on 127.0.0.1 that
record what reached them."""

from __future__ import annotations

import base64
import http.server
import io
import math
import threading
import time
import zlib
from pathlib import Path
from typing import Iterator

import pytest
from PIL import Image, ImageFile

from common.errors import ImageInputError
from cog_triton.fetch.rules import FetchRules
from cog_triton.stream_config import ImageLimits
from cog_triton.streaming.images import ImageRef, check_image, load_images, read_data_uri, read_file
from tests.slow_server import SlowServer

LIMITS = ImageLimits(max_count=3, max_pixels=1000 * 1000, max_bytes=200_000, fetch_deadline_s=5.0,
                     rules=FetchRules())
OPEN = ImageLimits(max_count=3, max_pixels=1000 * 1000, max_bytes=200_000, fetch_deadline_s=5.0,
                   rules=FetchRules.open())


def encoded(fmt: str, size=(40, 30), color=(10, 200, 30), **kwargs) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def animated(fmt: str) -> bytes:
    buffer = io.BytesIO()
    frames = [Image.new("RGB", (20, 20), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(buffer, format=fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buffer.getvalue()


def png_bomb(width: int, height: int) -> bytes:
    """A grayscale PNG of ``width`` x ``height`` zeros: a few kilobytes that decode to width * height bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    rows = zlib.compress(b"\x00" * ((width + 1) * height), 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every decode (ImageFile.load) the test makes."""
    calls: list[str] = []
    real = ImageFile.ImageFile.load

    def load(self):
        calls.append(str(self.format))
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return calls


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF"])
def test_the_allowed_formats_are_read_and_decoded(fmt: str, no_decoding: list[str]) -> None:
    data = encoded(fmt)
    image = check_image(data, "image_input[0]", LIMITS)
    assert (image.format, image.width, image.height, image.data) == (fmt, 40, 30, data)
    assert no_decoding == [fmt]  # decoded once, here


@pytest.mark.parametrize("fmt", ["TIFF", "BMP", "ICO", "PPM"])
def test_other_formats_are_refused_unread(fmt: str) -> None:
    with pytest.raises(ImageInputError, match=r"image_input\[1\] is not an image in a format taken here "
                                              r"\(JPEG, PNG, WebP, GIF \(stills\)\)"):
        check_image(encoded(fmt), "image_input[1]", LIMITS)


def test_bytes_that_are_no_image_are_refused() -> None:
    with pytest.raises(ImageInputError, match="is not an image in a format taken here"):
        check_image(b"%PDF-1.7 not an image", "messages[0].content[1]", LIMITS)


def test_a_decompression_bomb_is_refused_before_it_is_decoded(no_decoding: list[str]) -> None:
    bomb = png_bomb(5000, 5000)  # 25 megapixels in a few kilobytes
    assert len(bomb) < 40_000
    with pytest.raises(ImageInputError) as refused:
        check_image(bomb, "image_input[0]", LIMITS)
    assert refused.value.message == ("image_input[0] is 5000 x 5000 = 25000000 pixels; an image may have at most 1000000 "
                                  "pixels (COG_TRITON_IMAGE_MAX_PIXELS); send a smaller image (it was not decoded)")
    assert no_decoding == []


def test_pillows_own_bomb_limit_is_reported_as_the_pixel_bound() -> None:
    """Past twice Image.MAX_IMAGE_PIXELS Pillow refuses at open; the message still names our bound."""
    huge = ImageLimits(max_pixels=1 << 30, max_bytes=1 << 20)
    with pytest.raises(ImageInputError, match="refused before decoding: .*COG_TRITON_IMAGE_MAX_PIXELS"):
        check_image(png_bomb(20000, 10000), "image_input[0]", huge)


@pytest.mark.parametrize("fmt", ["GIF", "PNG", "WEBP"])
def test_animated_images_are_refused(fmt: str) -> None:
    with pytest.raises(ImageInputError, match=r"image_input\[0\] is animated \(2 frames\); this model takes still "
                                              "images"):
        check_image(animated(fmt), "image_input[0]", LIMITS)


def test_a_truncated_image_is_refused_when_decoded() -> None:
    data = encoded("JPEG", size=(200, 200))
    with pytest.raises(ImageInputError, match=r"image_input\[0\] could not be decoded as a JPEG image"):
        check_image(data[: len(data) // 2], "image_input[0]", LIMITS)


def test_files_larger_than_the_byte_limit_are_refused_unread(tmp_path: Path, no_decoding: list[str]) -> None:
    path = tmp_path / "big.png"
    path.write_bytes(encoded("PNG") + b"\x00" * 300_000)
    with pytest.raises(ImageInputError, match=r"image_input\[0\] is 300104 bytes; an image may have at most 200000 bytes "
                                              r"\(COG_TRITON_IMAGE_MAX_BYTES\)"):
        read_file(str(path), "image_input[0]", LIMITS)
    with pytest.raises(ImageInputError, match="could not be read: No such file or directory"):
        read_file(str(tmp_path / "gone.png"), "image_input[1]", LIMITS)


def test_data_uris(monkeypatch: pytest.MonkeyPatch) -> None:
    png = encoded("PNG")
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    assert read_data_uri(uri, "messages[0].content[0]", LIMITS) == png
    for bad in ("data:text/plain;base64,aGVsbG8=", "data:image/png,rawbytes", "data:;base64,aGVsbG8="):
        with pytest.raises(ImageInputError, match="is a data URI that is not data:image/<type>;base64,<data>"):
            read_data_uri(bad, "messages[0].content[0]", LIMITS)
    with pytest.raises(ImageInputError, match="whose data is not valid base64"):
        read_data_uri("data:image/png;base64,***", "messages[0].content[0]", LIMITS)
    decoded: list[int] = []
    real = base64.b64decode
    monkeypatch.setattr(base64, "b64decode", lambda data, **kw: decoded.append(1) or real(data, **kw))
    with pytest.raises(ImageInputError, match="an image may have at most 200000 bytes"):
        read_data_uri("data:image/png;base64," + "A" * 400_000, "messages[0].content[0]", LIMITS)
    assert decoded == []  # refused from its length, before decoding


def test_the_count_is_checked_before_anything_is_read(tmp_path: Path) -> None:
    refs = [ImageRef(str(tmp_path / f"{i}.png"), f"image_input[{i}]") for i in range(4)]  # none exists
    with pytest.raises(ImageInputError, match=r"4 images were given; a prediction may carry at most 3 "
                                              r"\(COG_TRITON_IMAGE_MAX_COUNT\)"):
        load_images(refs, LIMITS)


# ------------------------------------------------------------------------------------------------ image URLs
class ImageServer:
    """An HTTP server on 127.0.0.1 that serves ``files`` by path (``/redirect`` redirects to ``target``; ``/chunked``
    sends ``files['/big']`` without a Content-Length) and records every request path."""

    def __init__(self, files: dict[str, bytes]) -> None:
        server = self
        self.requests: list[str] = []
        self.target = ""

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                server.requests.append(self.path)
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", server.target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/chunked":
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    body = files["/big"]
                    for start in range(0, len(body), 65536):
                        part = body[start:start + 65536]
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                body = files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[ImageServer]:
    served = ImageServer({"/cat.png": encoded("PNG"), "/big": b"\x00" * 300_000, "/big.png": b"\x00" * 300_000})
    yield served
    served.close()


def test_a_url_is_fetched_and_checked(server: ImageServer) -> None:
    (image,) = load_images([ImageRef(server.url + "/cat.png", "messages[0].content[1]")], OPEN)
    assert image.format == "PNG" and server.requests == ["/cat.png"]


def test_the_fetch_rules_refuse_before_a_request_is_sent(server: ImageServer) -> None:
    with pytest.raises(ImageInputError, match=r"messages\[0\].content\[1\] http://127.0.0.1:\d+/cat.png is "
                                              r"refused: .*https"):
        load_images([ImageRef(server.url + "/cat.png", "messages[0].content[1]")], LIMITS)
    https_only_but_private = ImageLimits(rules=FetchRules(allow_http=True))
    with pytest.raises(ImageInputError, match="is refused: .*loopback"):
        load_images([ImageRef(server.url + "/cat.png", "messages[0].content[1]")], https_only_but_private)
    assert server.requests == []


def test_a_redirect_is_held_to_the_rules(server: ImageServer) -> None:
    """Hosts allow-list: a URL on an allowed host whose redirect leads to another host is refused there."""
    server.target = server.url.replace("127.0.0.1", "localhost") + "/cat.png"
    rules = FetchRules(allow_http=True, allow_private=True, allow_hosts=("127.0.0.1",))
    with pytest.raises(ImageInputError, match="is refused: the redirect to http://localhost"):
        load_images([ImageRef(server.url + "/redirect", "image_url")], ImageLimits(rules=rules))
    assert server.requests == ["/redirect"]


def test_http_errors_and_oversized_downloads(server: ImageServer) -> None:
    with pytest.raises(ImageInputError, match=r"HTTP 404 Not Found for http://127.0.0.1:\d+/missing.png; check the "
                                              "URL"):
        load_images([ImageRef(server.url + "/missing.png", "image_url")], OPEN)
    with pytest.raises(ImageInputError, match="is 300000 bytes; an image may have at most 200000 bytes"):
        load_images([ImageRef(server.url + "/big.png", "image_url")], OPEN)  # Content-Length
    with pytest.raises(ImageInputError, match="an image may have at most 200000 bytes"):
        load_images([ImageRef(server.url + "/chunked", "image_url")], OPEN)  # as it arrives


def test_a_server_that_drips_its_answer_ends_at_the_deadline(server: ImageServer) -> None:
    """The deadline covers the whole fetch: a server sending one header byte every 50 ms is cut off at the
    deadline, and the client hangs up (the server did not let go). The deadline is 1 s, or more on a machine so
    loaded that a whole fetch of a small image takes over 1/20 of that (measured here first): the client must have
    connected before the deadline for the server to see it hang up."""
    started = time.monotonic()
    load_images([ImageRef(server.url + "/cat.png", "image_url")], OPEN)
    deadline_s = max(1, math.ceil(20 * (time.monotonic() - started)))
    limits = ImageLimits(fetch_deadline_s=deadline_s, rules=FetchRules.open())
    with SlowServer("headers", interval_s=0.05, hold_s=30.0 + deadline_s) as slow:
        started = time.monotonic()
        with pytest.raises(ImageInputError, match=r"image_url http://127.0.0.1:\d+/x.png: the fetch of 1 image URL "
                                                  rf"did not finish within the deadline of {deadline_s} s "
                                                  r"\(COG_TRITON_IMAGE_FETCH_DEADLINE_S\)"):
            load_images([ImageRef(slow.url + "/x.png", "image_url")], limits)
        took = time.monotonic() - started
        assert slow.wait(ended=1)
        assert slow.ended == ["client"]
    assert took < 30.0 + deadline_s  # not held until the server gave up (hold_s); only means "not hung"


def test_no_rules_means_no_urls(server: ImageServer) -> None:
    with pytest.raises(ImageInputError, match="this server fetches no image URLs"):
        load_images([ImageRef(server.url + "/cat.png", "image_url")], ImageLimits(rules=None))
    assert server.requests == []
