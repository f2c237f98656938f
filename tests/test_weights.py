"""Tests of cog_triton.weights against a real local HTTP server and real archives built with tarfile."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import stat
import tarfile
import threading
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlsplit

import pytest

from common.errors import ArchiveError, ChecksumError, DownloadError, WeightsError
from common.files import MARKER_NAME
from cog_triton.weights import WeightsResult, fetch_weights, redact_url

GOOD_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}\n',
    "tokenizer/tokenizer.json": b'{"model": "bpe"}\n',
    "rank0.engine": b"engine bytes " * 100,
}
OLD_FILES = {"old.txt": b"previous weights\n"}


# --- archive helpers -------------------------------------------------------------------------


def _reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, Optional[io.BytesIO]]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    return info, io.BytesIO(data)


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, Optional[io.BytesIO]]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            tar.addfile(info, data)
    return path


def good_tar(path: Path, files: dict[str, bytes] = GOOD_FILES, mode: str = "w:gz") -> Path:
    return make_tar(path, [_reg(name, data) for name, data in files.items()], mode)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_contents(directory: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (directory / name).read_bytes() == data, name
    found = {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if (p.is_file() or p.is_symlink()) and p.name not in (MARKER_NAME, ".gitkeep")
    }
    assert found == set(files)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A target directory alone in its own parent, holding "previous weights"."""
    directory = tmp_path / "parent" / "weights"
    directory.mkdir(parents=True)
    for name, data in OLD_FILES.items():
        (directory / name).write_bytes(data)
    return directory


def parent_listing(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir())


# --- HTTP server -----------------------------------------------------------------------------


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    fail_first: int = 0  # answer 500 this many times first
    delay_s: float = 0.0  # sleep before answering
    content_length: Optional[int] = None  # announce this length instead of len(body); -1: announce none
    trickle_bytes: int = 0  # send the body in pieces of this many bytes ...
    trickle_interval_s: float = 0.0  # ... with this pause between them
    drop_first_after: Optional[int] = None  # first request: announce the full body, send this many bytes, hang up
    ranges: bool = False  # honour "Range: bytes=N-" (206), checking If-Range against the ETag
    refuse_ranges: bool = False  # answer any Range request with 416 (Range Not Satisfiable)
    etag: Optional[str] = None
    redirect_to: Optional[str] = None  # answer 302 with this Location
    then: Optional["Route"] = None  # answers from the second request on


class WeightsServer:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: Counter[str] = Counter()
        self.auth_headers: list[Optional[str]] = []
        self.requests: list[tuple[str, dict[str, str], int]] = []  # (path, request headers, status answered)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silence
                pass

            def do_GET(self) -> None:  # noqa: N802
                path = urlsplit(self.path).path
                server.hits[path] += 1
                server.auth_headers.append(self.headers.get("Authorization"))
                route = server.routes.get(path)
                if route is not None and route.then is not None and server.hits[path] > 1:
                    route = route.then
                try:
                    if route is None or route.status == 404:
                        self._send(404, b"not found")
                        return
                    if server.hits[path] <= route.fail_first or route.status >= 500:
                        self._send(route.status if route.status >= 500 else 500, b"boom")
                        return
                    if route.redirect_to is not None:
                        self._record(path, 302)
                        self.send_response(302)
                        self.send_header("Location", route.redirect_to)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if route.delay_s:
                        time.sleep(route.delay_s)
                    body, status, start = route.body, route.status, 0
                    wanted = self.headers.get("Range")
                    if route.refuse_ranges and wanted:
                        self._record(path, 416)
                        self._send(416, b"")
                        return
                    if route.ranges and wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                        if_range = self.headers.get("If-Range")
                        if if_range is None or if_range == route.etag:
                            start, status = int(wanted[len("bytes="):-1]), 206
                            body = route.body[start:]
                    length = len(body) if route.content_length is None else route.content_length
                    self._record(path, status)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/octet-stream")
                    if length >= 0:  # -1: no Content-Length, the body ends when the connection closes
                        self.send_header("Content-Length", str(length))
                    if route.ranges:
                        self.send_header("Accept-Ranges", "bytes")
                    if route.etag:
                        self.send_header("ETag", route.etag)
                    if status == 206:
                        self.send_header("Content-Range", f"bytes {start}-{len(route.body) - 1}/{len(route.body)}")
                    drop = route.drop_first_after if server.hits[path] == 1 else None
                    if length != len(body) or drop is not None:
                        self.send_header("Connection", "close")
                        self.close_connection = True
                    self.end_headers()
                    if drop is not None:
                        body = body[:drop]
                    step = route.trickle_bytes or len(body) or 1
                    for offset in range(0, len(body), step):
                        if offset and route.trickle_interval_s:
                            time.sleep(route.trickle_interval_s)
                        self.wfile.write(body[offset:offset + step])
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _record(self, path: str, status: int) -> None:
                server.requests.append((path, {k.lower(): v for k, v in self.headers.items()}, status))

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # clients that gave up (timeout test) are expected

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, body: bytes = b"", **kwargs: object) -> str:
        self.routes[path] = Route(body=body, **kwargs)  # type: ignore[arg-type]
        return self.url(path)


@pytest.fixture
def server() -> Iterator[WeightsServer]:
    srv = WeightsServer()
    srv.thread.start()
    try:
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
        srv.thread.join(timeout=5)


# --- successful fetches ----------------------------------------------------------------------


def test_http_tar_gz(server: WeightsServer, target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    url = server.serve("/good.tar.gz", archive.read_bytes())
    caplog.set_level(logging.INFO, logger="cog_triton.weights")

    result = fetch_weights(url, target)

    assert result == WeightsResult(
        path=target, source=url, sha256=sha256_of(archive), size_bytes=archive.stat().st_size, skipped=False
    )
    assert_contents(target, GOOD_FILES)  # old.txt is gone: contents were replaced
    assert (target / MARKER_NAME).is_file()
    assert parent_listing(target) == ["weights"]  # no temp download or staging folder left behind
    assert server.hits["/good.tar.gz"] == 1
    assert any("MB/s" in r.getMessage() and str(archive.stat().st_size) in r.getMessage() for r in caplog.records)


def test_progress_is_logged_at_most_every_10_percent(
    server: WeightsServer, target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = good_tar(tmp_path / "big.tar", {"blob.bin": os.urandom(4 << 20)}, mode="w")
    url = server.serve("/big.tar", archive.read_bytes())
    caplog.set_level(logging.INFO, logger="cog_triton.weights")
    fetch_weights(url, target)
    messages = [r.getMessage() for r in caplog.records]
    progress = [m for m in messages if m.startswith("downloading ") and "%" in m]
    assert 3 <= len(progress) <= 11, progress
    assert all("MB/s" in line and "bytes" in line for line in progress)


def test_http_plain_tar(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "good.tar", mode="w")
    url = server.serve("/good.tar", archive.read_bytes())
    result = fetch_weights(url, target, sha256=sha256_of(archive))
    assert result.sha256 == sha256_of(archive) and not result.skipped
    assert_contents(target, GOOD_FILES)


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz", "w"])
def test_compression_detected_by_content_not_extension(
    server: WeightsServer, target: Path, tmp_path: Path, mode: str
) -> None:
    archive = good_tar(tmp_path / "weights.bin", mode=mode)
    url = server.serve("/download/weights.bin", archive.read_bytes())
    fetch_weights(url, target)
    assert_contents(target, GOOD_FILES)


def test_file_url(target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "my weights.tgz")  # a space, percent-encoded in the URL
    result = fetch_weights(archive.as_uri(), target)
    assert result.sha256 == sha256_of(archive)
    assert result.source == str(archive)
    assert_contents(target, GOOD_FILES)


@pytest.mark.parametrize("as_path", [True, False])
def test_local_archive_path(target: Path, tmp_path: Path, as_path: bool) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    result = fetch_weights(archive if as_path else str(archive), target)
    assert (result.sha256, result.size_bytes, result.skipped) == (sha256_of(archive), archive.stat().st_size, False)
    assert_contents(target, GOOD_FILES)
    assert archive.is_file()  # a local source is never moved or deleted


def test_local_directory(target: Path, tmp_path: Path) -> None:
    source = tmp_path / "checkpoint"
    for name, data in GOOD_FILES.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    result = fetch_weights(source, target)
    assert result.sha256 is None
    assert result.size_bytes == sum(len(d) for d in GOOD_FILES.values())
    assert_contents(target, GOOD_FILES)
    assert_contents(source, GOOD_FILES)  # source untouched
    assert parent_listing(target) == ["weights"]


def test_local_directory_follows_file_symlinks(target: Path, tmp_path: Path) -> None:
    # like a Hugging Face cache snapshot: files are symlinks into a blob folder outside the snapshot
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"blob data")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "model.safetensors").symlink_to(blobs / "abc")
    fetch_weights(snapshot, target)
    copied = target / "model.safetensors"
    assert not copied.is_symlink() and copied.read_bytes() == b"blob data"


def test_directory_with_sha256_is_refused(target: Path, tmp_path: Path) -> None:
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "config.json").write_text("{}")
    with pytest.raises(WeightsError, match="checksums apply to archives"):
        fetch_weights(source, target, sha256="0" * 64)
    assert_contents(target, OLD_FILES)


def test_sha256_ok_any_case(target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    result = fetch_weights(archive, target, sha256="  " + sha256_of(archive).upper())
    assert result.sha256 == sha256_of(archive)
    assert_contents(target, GOOD_FILES)


def test_sha256_mismatch_keeps_previous_weights(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    first = good_tar(tmp_path / "first.tar.gz")
    fetch_weights(first, target)
    marker_before = (target / MARKER_NAME).read_bytes()

    second = good_tar(tmp_path / "second.tar.gz", {"other.bin": b"other"})
    url = server.serve("/second.tar.gz", second.read_bytes())
    wrong = "ab" * 32
    with pytest.raises(ChecksumError) as info:
        fetch_weights(url, target, sha256=wrong)
    message = str(info.value)
    assert wrong in message and sha256_of(second) in message and url in message
    assert_contents(target, GOOD_FILES)
    assert (target / MARKER_NAME).read_bytes() == marker_before
    assert parent_listing(target) == ["weights"]


def test_malformed_sha256(target: Path, tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="64 hexadecimal"):
        fetch_weights(good_tar(tmp_path / "a.tgz"), target, sha256="abc123")


def test_gitkeep_is_kept(target: Path, tmp_path: Path) -> None:
    (target / ".gitkeep").write_bytes(b"")
    fetch_weights(good_tar(tmp_path / "a.tgz"), target)
    assert (target / ".gitkeep").is_file()
    fetch_weights(good_tar(tmp_path / "b.tgz", {"x.txt": b"x"}), target)
    assert (target / ".gitkeep").is_file()
    assert_contents(target, {"x.txt": b"x"})


def test_symlinks_and_hardlinks_inside_the_target_are_fine(target: Path, tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "links.tgz", [
        _reg("data/real.txt", b"real"),
        _special("data/sym.txt", tarfile.SYMTYPE, "real.txt"),
        _special("top-sym", tarfile.SYMTYPE, "data"),
        _special("hard.txt", tarfile.LNKTYPE, "data/real.txt"),
    ])
    fetch_weights(archive, target)
    assert (target / "data" / "sym.txt").is_symlink()
    assert (target / "data" / "sym.txt").read_bytes() == b"real"
    assert (target / "top-sym" / "real.txt").read_bytes() == b"real"
    assert (target / "hard.txt").read_bytes() == b"real"
    assert os.stat(target / "hard.txt").st_ino == os.stat(target / "data" / "real.txt").st_ino
    # the second fetch checks the recorded links too, and skips
    assert fetch_weights(archive, target).skipped


def test_target_created_when_missing(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "weights"
    fetch_weights(good_tar(tmp_path / "a.tgz"), target)
    assert_contents(target, GOOD_FILES)


def test_target_that_is_a_symlink_is_filled_in_place(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "old.txt").write_text("old")
    link = tmp_path / "parent" / "weights"
    link.parent.mkdir()
    link.symlink_to(real)
    fetch_weights(good_tar(tmp_path / "a.tgz"), link)
    assert link.is_symlink()
    assert_contents(real, GOOD_FILES)
    assert parent_listing(link) == ["weights"]


# --- skipping and re-fetching ----------------------------------------------------------------


def test_second_http_fetch_is_skipped(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    url = server.serve("/good.tar.gz", archive.read_bytes())
    first = fetch_weights(url, target, sha256=sha256_of(archive))
    second = fetch_weights(url, target, sha256=sha256_of(archive))
    third = fetch_weights(url, target)  # no sha256 given: the same source is enough
    assert not first.skipped and second.skipped and third.skipped
    assert server.hits["/good.tar.gz"] == 1
    assert (second.sha256, second.size_bytes, second.path) == (first.sha256, first.size_bytes, target)
    assert_contents(target, GOOD_FILES)


def test_refetch_when_a_file_is_missing_or_resized(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    url = server.serve("/good.tar.gz", archive.read_bytes())
    fetch_weights(url, target)
    (target / "rank0.engine").write_bytes(b"short")
    assert not fetch_weights(url, target).skipped
    (target / "tokenizer" / "tokenizer.json").unlink()
    assert not fetch_weights(url, target).skipped
    assert server.hits["/good.tar.gz"] == 3
    assert_contents(target, GOOD_FILES)


def test_refetch_when_source_or_sha256_differ(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    url = server.serve("/good.tar.gz", archive.read_bytes())
    fetch_weights(url, target)
    assert not fetch_weights(url + "?v=2", target).skipped  # a different source string
    assert server.hits["/good.tar.gz"] == 2
    with pytest.raises(ChecksumError):  # a different expected sha256: downloaded again, and checked
        fetch_weights(url + "?v=2", target, sha256="cd" * 32)
    assert server.hits["/good.tar.gz"] == 3
    assert_contents(target, GOOD_FILES)


def test_changed_local_archive_is_refetched(target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    fetch_weights(archive, target)
    assert fetch_weights(archive, target).skipped
    good_tar(archive, {"new.txt": b"new contents"})
    os.utime(archive, ns=(time.time_ns() + 10**9,) * 2)  # a distinct mtime even on coarse clocks
    result = fetch_weights(archive, target)
    assert not result.skipped and result.sha256 == sha256_of(archive)
    assert_contents(target, {"new.txt": b"new contents"})


def test_changed_local_directory_is_refetched(target: Path, tmp_path: Path) -> None:
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "a.txt").write_text("one")
    fetch_weights(source, target)
    assert fetch_weights(source, target).skipped
    (source / "b.txt").write_text("two")
    assert not fetch_weights(source, target).skipped
    assert_contents(target, {"a.txt": b"one", "b.txt": b"two"})


# --- HTTP failures ---------------------------------------------------------------------------


def test_404_is_not_retried(server: WeightsServer, target: Path) -> None:
    url = server.url("/missing.tar.gz")
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, retries=3)
    message = str(info.value)
    assert "404" in message and url in message and "check the URL" in message
    assert server.hits["/missing.tar.gz"] == 1  # not retried, so no back-off wait either
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_500_then_200_is_retried(
    server: WeightsServer, target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    url = server.serve("/flaky.tar.gz", archive.read_bytes(), fail_first=1)
    caplog.set_level(logging.INFO, logger="cog_triton.weights")
    result = fetch_weights(url, target, retries=2, sha256=sha256_of(archive))
    assert server.hits["/flaky.tar.gz"] == 2
    assert not result.skipped
    assert_contents(target, GOOD_FILES)
    assert any("500" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)


def test_persistent_500_gives_up_after_the_retries(server: WeightsServer, target: Path) -> None:
    url = server.serve("/down.tar.gz", status=503)
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, retries=1)
    assert "503" in str(info.value) and "2 attempts" in str(info.value)
    assert server.hits["/down.tar.gz"] == 2
    assert_contents(target, OLD_FILES)


def test_timeout(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    url = server.serve("/slow.tar.gz", good_tar(tmp_path / "a.tgz").read_bytes(), delay_s=2.0)
    started = time.monotonic()
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, timeout_s=0.5, retries=0)
    elapsed = time.monotonic() - started
    assert "timed out after 0.5 s" in str(info.value) and url in str(info.value)
    # Not before the timeout; and before the server's answer (at 2 s), which would have made the fetch succeed
    # rather than raise: no upper wall-clock bound needed.
    assert elapsed >= 0.5, elapsed
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_truncated_download(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    body = good_tar(tmp_path / "a.tgz").read_bytes()
    url = server.serve("/truncated.tar.gz", body[:100], content_length=len(body))
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, retries=0)
    message = str(info.value)
    assert f"expected {len(body)} bytes" in message and "received 100 bytes" in message
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_truncated_download_is_retried(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    body = good_tar(tmp_path / "a.tgz").read_bytes()
    url = server.serve("/truncated.tar.gz", body[:100], content_length=len(body))
    with pytest.raises(DownloadError, match="gave up after 2 attempts"):
        fetch_weights(url, target, retries=1)
    assert server.hits["/truncated.tar.gz"] == 2


def test_connection_refused(target: Path) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener now
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/weights.tar.gz"
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, retries=0)
    assert "could not connect" in str(info.value) and url in str(info.value)
    assert_contents(target, OLD_FILES)


@pytest.mark.parametrize("secret", ["userinfo", "query", "fragment"])
def test_credentials_never_logged(
    server: WeightsServer, target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, secret: str
) -> None:
    """Each kind of secret alone in the URL (a password with no query string, a signed query string, a fragment):
    neither a log record nor the error of a failed fetch shows it."""
    archive = good_tar(tmp_path / "good.tar.gz")
    server.serve("/private.tar.gz", archive.read_bytes())
    caplog.set_level(logging.DEBUG)  # every logger, httpx's included

    def url(path: str) -> str:
        if secret == "userinfo":
            return f"http://alice:hunter2@127.0.0.1:{server.port}{path}"
        return f"http://127.0.0.1:{server.port}{path}" + ("?X-Amz-Signature=hunter2" if secret == "query"
                                                          else "#hunter2")

    result = fetch_weights(url("/private.tar.gz"), target)
    assert result.source == server.url("/private.tar.gz")
    if secret == "userinfo":
        assert server.auth_headers[-1] is not None and server.auth_headers[-1].startswith("Basic ")  # auth was sent
    with pytest.raises(DownloadError) as info:
        fetch_weights(url("/nope.tar.gz"), target)
    assert "404" in str(info.value) and server.url("/nope.tar.gz") in str(info.value)
    text = caplog.text + str(info.value)
    assert "httpx" in {r.name for r in caplog.records}  # httpx's request log was captured ...
    assert "hunter2" not in text and "alice" not in text  # ... and redacted


def test_redact_url() -> None:
    assert redact_url("https://u:p@host:8443/a/b.tgz?sig=1#frag") == "https://host:8443/a/b.tgz"
    assert redact_url("https://u:pw-alone@host/a.tgz") == "https://host/a.tgz"  # a password alone
    assert redact_url("https://token-alone@host/a.tgz") == "https://host/a.tgz"  # a user name alone


# --- bad archives ----------------------------------------------------------------------------


def test_corrupt_gzip_over_http(server: WeightsServer, target: Path) -> None:
    url = server.serve("/corrupt.tar.gz", b"\x1f\x8b\x08\x00" + os.urandom(2000))
    with pytest.raises(ArchiveError) as info:
        fetch_weights(url, target)
    assert "corrupt or truncated" in str(info.value) and url in str(info.value)
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


@pytest.mark.parametrize("cut", [0.5, 0.9, -4])
def test_truncated_local_tar_gz(target: Path, tmp_path: Path, cut: float) -> None:
    data = good_tar(tmp_path / "full.tgz", {"big.bin": os.urandom(50_000), "z.txt": b"z"}).read_bytes()
    archive = tmp_path / "cut.tgz"
    archive.write_bytes(data[: int(len(data) * cut)] if cut > 0 else data[: int(cut)])
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target)
    assert "corrupt or truncated" in str(info.value) and str(archive) in str(info.value)
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_plain_tar_cut_at_a_member_boundary(target: Path, tmp_path: Path) -> None:
    full = good_tar(tmp_path / "full.tar", {"a.txt": b"a" * 512, "b.txt": b"b" * 512}, mode="w")
    with tarfile.open(full) as tar:
        second = tar.getmembers()[1].offset
    archive = tmp_path / "cut.tar"
    archive.write_bytes(full.read_bytes()[:second])  # only the first member, no end-of-archive blocks
    with pytest.raises(ArchiveError, match="corrupt or truncated"):
        fetch_weights(archive, target)
    assert_contents(target, OLD_FILES)


@pytest.mark.parametrize("kind", ["zip", "random", "plain-gzip", "empty"])
def test_unsupported_files(target: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "weights.tar.gz"  # the name claims tar.gz; the content decides
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("config.json", "{}")
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "plain-gzip":
        path.write_bytes(gzip.compress(b"just text, not a tar archive\n" * 50))
    else:
        path.write_bytes(b"")
    with pytest.raises(ArchiveError) as info:
        fetch_weights(path, target)
    assert str(path) in str(info.value)
    if kind == "zip":
        assert "zip archive" in str(info.value)
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_missing_local_path(target: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.tar.gz"
    with pytest.raises(WeightsError, match="does not exist") as info:
        fetch_weights(missing, target)
    assert str(missing) in str(info.value)
    with pytest.raises(WeightsError, match="does not exist"):
        fetch_weights(missing.as_uri(), target)
    assert_contents(target, OLD_FILES)


def test_unsupported_scheme(target: Path) -> None:
    with pytest.raises(WeightsError, match="unsupported weights URL scheme 'ftp'"):
        fetch_weights("ftp://example.com/w.tar.gz", target)


# --- hostile archives ------------------------------------------------------------------------


def _hostile_cases(tmp_path: Path) -> dict[str, tuple[str, list[tuple[tarfile.TarInfo, Optional[io.BytesIO]]]]]:
    """name -> (offending member name, members); a harmless member always comes first."""
    outside = tmp_path / "parent" / "outside.txt"  # beside the target, must never appear
    first = _reg("ok.txt", b"fine")
    return {
        "absolute-path": (str(outside), [first, _reg(str(outside), b"evil")]),
        "dotdot": ("../outside.txt", [first, _reg("../outside.txt", b"evil")]),
        "nested-dotdot": ("sub/../../outside.txt", [first, _reg("sub/../../outside.txt", b"evil")]),
        "symlink-etc-passwd": ("passwd", [first, _special("passwd", tarfile.SYMTYPE, "/etc/passwd")]),
        "symlink-outside-then-write": (
            "escape",
            [first, _special("escape", tarfile.SYMTYPE, ".."), _reg("escape/outside.txt", b"evil")],
        ),
        "symlink-chain": (
            "x/y/z",
            # x/y -> .. is the target itself (fine); x/y/z -> .. then resolves above the target
            [first, _special("x/y", tarfile.SYMTYPE, ".."), _special("x/y/z", tarfile.SYMTYPE, "..")],
        ),
        "hardlink-outside": ("hl", [first, _special("hl", tarfile.LNKTYPE, "../../secret.txt")]),
        "hardlink-absolute": ("hl", [first, _special("hl", tarfile.LNKTYPE, "/etc/passwd")]),
        "char-device": ("dev/null0", [first, _special("dev/null0", tarfile.CHRTYPE)]),
        "block-device": ("dev/sda0", [first, _special("dev/sda0", tarfile.BLKTYPE)]),
        "fifo": ("pipe", [first, _special("pipe", tarfile.FIFOTYPE)]),
    }


HOSTILE = [
    "absolute-path", "dotdot", "nested-dotdot", "symlink-etc-passwd", "symlink-outside-then-write",
    "symlink-chain", "hardlink-outside", "hardlink-absolute", "char-device", "block-device", "fifo",
]


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_archive(target: Path, tmp_path: Path, case: str) -> None:
    member, members = _hostile_cases(tmp_path)[case]
    archive = make_tar(tmp_path / f"{case}.tar.gz", members)
    secret = tmp_path / "secret.txt"  # an existing file outside, for links to aim at
    secret.write_bytes(b"secret")
    before = parent_listing(target)
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target)
    message = str(info.value)
    assert repr(member) in message, message
    assert str(archive) in message
    assert parent_listing(target) == before == ["weights"]  # nothing beside the target, no temp dirs
    assert not (tmp_path / "outside.txt").exists()
    assert secret.read_bytes() == b"secret" and secret.stat().st_nlink == 1
    assert_contents(target, OLD_FILES)  # previous weights intact
    assert not (target / MARKER_NAME).exists()


def test_all_hostile_cases_are_tested(tmp_path: Path) -> None:
    assert sorted(_hostile_cases(tmp_path)) == sorted(HOSTILE)


# --- extraction: modes and owners (the rules of tarfile.data_filter on every Python) ---------------


def _owned(name: str, mode: int, uid: int, gid: int, uname: str = "", gname: str = "", data: bytes = b"x"):
    info, body = _reg(name, data)
    info.mode, info.uid, info.gid, info.uname, info.gname = mode, uid, gid, uname, gname
    return info, body


def test_modes_and_owners_follow_the_data_filter_rules(target: Path, tmp_path: Path) -> None:
    # expected modes: tarfile.data_filter's rules (CPython docs): high bits and group/other write
    # cleared, owner read+write set, exec bits dropped when the owner cannot execute; the archive's
    # directory modes and all owners are ignored
    cases = {
        "setuid-all": (0o4777, 0o755),
        "setgid-sticky": (0o3775, 0o755),
        "world-writable": (0o666, 0o644),
        "no-bits": (0o000, 0o600),
        "group-exec-only": (0o070, 0o640),
        "owner-exec-only": (0o700, 0o700),
    }
    members = [_owned(name, mode, 0, 0, "root", "root") for name, (mode, _) in cases.items()]
    members.append(_owned("someone-elses", 0o644, 4242, 4343))  # numeric owner only, as tar --numeric-owner
    directory = tarfile.TarInfo("bin")
    directory.type, directory.mode, directory.uid, directory.gid = tarfile.DIRTYPE, 0o7777, 4242, 4343
    members.append((directory, None))
    members.append(_owned("bin/tool", 0o6755, 4242, 4343))
    hard = tarfile.TarInfo("hard-setuid")  # shares the inode of world-writable, whose mode it sets again
    hard.type, hard.linkname, hard.mode = tarfile.LNKTYPE, "world-writable", 0o4666
    members.append((hard, None))
    archive = make_tar(tmp_path / "modes.tar", members, mode="w")

    fetch_weights(archive, target)

    umask = os.umask(0)
    os.umask(umask)
    found = {name: stat.S_IMODE(os.lstat(target / name).st_mode) for name in [*cases, "bin", "bin/tool"]}
    assert found == {**{name: want for name, (_, want) in cases.items()}, "bin": 0o777 & ~umask, "bin/tool": 0o755}
    for path in [target / name for name in [*cases, "someone-elses", "bin", "bin/tool", "hard-setuid"]]:
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()), path  # never chowned to 4242/4343
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH), path


# --- extraction: depth -----------------------------------------------------------------------


def test_deeply_nested_member_is_refused(target: Path, tmp_path: Path) -> None:
    deep = "/".join(["d"] * 3000) + "/f.bin"
    archive = make_tar(tmp_path / "deep.tar.gz", [_reg("ok.txt", b"fine"), _reg(deep, b"x")])
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target)
    message = str(info.value)
    assert str(archive) in message and "'d/d/d/d/d" in message and "3001 path components" in message
    assert "64" in message and len(message) < 1000, message  # the member's name is shortened
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_overlong_member_path_is_refused(target: Path, tmp_path: Path) -> None:
    long_name = "/".join(["x" * 200] * 25)  # 25 components, 5024 bytes
    archive = make_tar(tmp_path / "long.tar", [_reg(long_name, b"x")], mode="w")
    with pytest.raises(ArchiveError, match="5024 bytes long, more than 4096"):
        fetch_weights(archive, target)
    assert_contents(target, OLD_FILES)


def test_nesting_within_the_limit_is_fine(target: Path, tmp_path: Path) -> None:
    name = "/".join(["d"] * 63) + "/f.bin"
    fetch_weights(make_tar(tmp_path / "ok.tar", [_reg(name, b"deep")], mode="w"), target)
    assert (target / name).read_bytes() == b"deep"


# --- extraction: size limits -----------------------------------------------------------------


def _zeros_tar(path: Path, size: int, extra: Optional[list] = None, first: Optional[list] = None) -> Path:
    zeros = tarfile.TarInfo("zeros.bin")
    zeros.size = size
    return make_tar(path, [*(first or []), (zeros, io.BytesIO(bytes(size))), *(extra or [])])


def test_extracted_size_is_bounded_by_the_setting(target: Path, tmp_path: Path) -> None:
    archive = _zeros_tar(tmp_path / "bomb.tar.gz", 8 << 20)  # about 8 KB of gzip
    assert archive.stat().st_size < 100_000
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target, max_extracted_bytes=1 << 20)
    message = str(info.value)
    assert "'zeros.bin'" in message and f"{8 << 20} bytes" in message and f"{1 << 20} bytes" in message
    assert "COG_TRITON_MAX_EXTRACTED_BYTES" in message and str(archive) in message
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_default_extraction_limit_is_a_multiple_of_the_archive_size(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cog_triton.weights.archive as weights

    monkeypatch.setattr(weights, "EXTRACT_FLOOR_BYTES", 1 << 20)  # instead of 1 GiB, to keep the test small
    archive = _zeros_tar(tmp_path / "bomb.tar.gz", 8 << 20)
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target)
    message = str(info.value)
    assert f"{weights.EXTRACT_RATIO} times" in message and "COG_TRITON_MAX_EXTRACTED_BYTES" in message
    fetch_weights(_zeros_tar(tmp_path / "ok.tar.gz", 512 << 10), target)  # 512 KiB: under the floor
    assert (target / "zeros.bin").stat().st_size == 512 << 10


def _manifest_member(sizes: dict[str, int]) -> tuple[tarfile.TarInfo, io.BytesIO]:
    from tensorrtllm_backend.manifest import FileEntry, Manifest

    manifest = Manifest(
        name="m", backend="reference", kind="hf_checkpoint", tensorrt_llm_version=None, triton_image="img",
        world_size=1, tp_size=1, pp_size=1, gpu_name=None, compute_capability=None, build_config={},
        files=tuple(FileEntry(path, size, "0" * 64) for path, size in sizes.items()),
    )  # fmt: skip
    return _reg("manifest.json", json.dumps(manifest.to_json()).encode())


@pytest.mark.parametrize("where", ["first", "last"])
def test_manifest_tightens_the_extraction_limit(target: Path, tmp_path: Path, where: str) -> None:
    manifest = _manifest_member({"zeros.bin": 1000})  # the archive's own manifest says 1000 bytes
    size = 3 << 20  # more than 1000 bytes + manifest.json + 1 MiB of slack
    if where == "first":
        archive = _zeros_tar(tmp_path / "lying.tar.gz", size, first=[manifest])
    else:
        archive = _zeros_tar(tmp_path / "lying.tar.gz", size, extra=[manifest])
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target)
    message = str(info.value)
    assert "manifest.json" in message and "1000 bytes" in message and str(archive) in message, message
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]
    honest = _zeros_tar(tmp_path / "honest.tar.gz", size, first=[_manifest_member({"zeros.bin": size})])
    fetch_weights(honest, target)
    assert (target / "zeros.bin").stat().st_size == size


def test_not_enough_disk_space(target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _zeros_tar(tmp_path / "a.tar.gz", 2 << 20)
    real = shutil.disk_usage

    def small_disk(path: object) -> object:  # a nearly full disk cannot be made here portably
        usage = real(path)  # type: ignore[arg-type]
        return type(usage)(usage.total, usage.total - 1_000_000, 1_000_000)

    monkeypatch.setattr(shutil, "disk_usage", small_disk)
    with pytest.raises(WeightsError) as info:
        fetch_weights(archive, target)
    message = str(info.value)
    assert "free disk space" in message and "1000000 bytes free" in message and str(2 << 20) in message, message
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_sparse_members_are_refused(target: Path, tmp_path: Path) -> None:
    sparse = tarfile.TarInfo("sparse.bin")
    sparse.type = tarfile.GNUTYPE_SPARSE
    archive = make_tar(tmp_path / "sparse.tar", [_reg("ok.txt", b"ok"), (sparse, None)], mode="w")
    with tarfile.open(archive) as tar:
        assert tar.getmember("sparse.bin").issparse()  # what tarfile reads back
    with pytest.raises(ArchiveError, match="'sparse.bin' is a sparse file"):
        fetch_weights(archive, target)
    assert_contents(target, OLD_FILES)


# --- concurrent fetches ----------------------------------------------------------------------


FETCH_IN_CHILD = """
import json, sys, time
from pathlib import Path
from cog_triton.weights import fetch_weights
url, target, work, me = sys.argv[1:]
Path(work, f"ready-{me}").touch()
while not Path(work, "go").exists():
    time.sleep(0.005)
result = fetch_weights(url, target)
Path(work, f"result-{me}").write_text(json.dumps({"skipped": result.skipped, "sha256": result.sha256}))
"""


def test_concurrent_fetches_into_one_folder(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    files = {f"shard-{i:03d}.bin": os.urandom(20_000) for i in range(150)}
    archive = good_tar(tmp_path / "many.tar.gz", files)
    url = server.serve("/many.tar.gz", archive.read_bytes())
    work = tmp_path / "work"
    work.mkdir()
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    children = [
        subprocess.Popen([sys.executable, "-c", FETCH_IN_CHILD, url, str(target), str(work), str(n)], env=env)
        for n in (1, 2)
    ]
    deadline = time.monotonic() + 60
    while not all((work / f"ready-{n}").exists() for n in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    (work / "go").touch()
    assert [child.wait(timeout=120) for child in children] == [0, 0]

    results = [json.loads((work / f"result-{n}").read_text()) for n in (1, 2)]
    assert sorted(r["skipped"] for r in results) == [False, True]  # the second waited, then found the marker
    assert {r["sha256"] for r in results} == {sha256_of(archive)}
    assert server.hits["/many.tar.gz"] == 1
    assert_contents(target, files)
    assert parent_listing(target) == ["weights"]
    assert fetch_weights(url, target).skipped


def test_a_read_only_parent_still_reuses_the_weights(
    target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    fetch_weights(archive, target)
    real_open = os.open
    lock = str(target.parent / ".weights.lock")

    def read_only_open(path: object, *args: object, **kwargs: object) -> int:  # root ignores permissions:
        if os.fspath(path) == lock:  # a read-only file system is the case that cannot be made here
            raise OSError(30, "Read-only file system", lock)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only_open)
    with caplog.at_level(logging.WARNING, logger="cog_triton.weights"):
        assert fetch_weights(archive, target).skipped
    assert "going on without a lock" in caplog.text
    assert parent_listing(target) == ["weights"]


# --- slow servers ----------------------------------------------------------------------------


def test_a_trickling_server_fails_the_minimum_rate(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    body = os.urandom(1 << 20)
    url = server.serve("/trickle.tar.gz", body, trickle_bytes=1024, trickle_interval_s=0.05)  # ~20 KB/s
    whole_body_s = len(body) / 1024 * 0.05  # 51 s
    started = time.monotonic()
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, retries=0, timeout_s=5, min_rate_bytes_s=100_000, rate_grace_s=0.5)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "bytes/s" in message and "below the minimum of 100000 bytes/s" in message, message
    assert "COG_TRITON_DOWNLOAD_MIN_RATE_BYTES_S" in message and url in message
    assert elapsed < whole_body_s / 2, elapsed  # not the time the whole body would take (from its pace)
    assert_contents(target, OLD_FILES)
    assert parent_listing(target) == ["weights"]


def test_the_whole_download_has_a_deadline(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    body = os.urandom(1 << 20)
    url = server.serve("/trickle.tar.gz", body, trickle_bytes=4096, trickle_interval_s=0.05)  # ~80 KB/s
    whole_body_s = len(body) / 4096 * 0.05  # 12.8 s
    started = time.monotonic()
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, retries=3, timeout_s=5, min_rate_bytes_s=0, deadline_s=1.0)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "deadline of 1 s" in message and "COG_TRITON_DOWNLOAD_DEADLINE_S" in message, message
    # Not before the deadline, and well before the whole body (the bound from its pace, not a fixed one).
    assert 0.9 < elapsed < whole_body_s / 2, elapsed
    assert server.hits["/trickle.tar.gz"] == 1  # a missed deadline is not retried
    assert parent_listing(target) == ["weights"]


def test_download_limits_are_validated(target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "a.tgz")
    for kwargs in ({"deadline_s": -1}, {"min_rate_bytes_s": -1}, {"rate_grace_s": 0}, {"max_extracted_bytes": 0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            fetch_weights(archive, target, **kwargs)  # type: ignore[arg-type]


# --- resuming downloads ----------------------------------------------------------------------


def test_a_dropped_download_resumes_with_a_range_request(
    server: WeightsServer, target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = good_tar(tmp_path / "big.tar.gz", {"blob.bin": os.urandom(300_000)})
    body = archive.read_bytes()
    cut = len(body) // 2
    url = server.serve("/big.tar.gz", body, drop_first_after=cut, ranges=True, etag='"v1"')
    caplog.set_level(logging.INFO, logger="cog_triton.weights")
    result = fetch_weights(url, target, retries=1, sha256=sha256_of(archive))
    assert (result.sha256, result.size_bytes) == (sha256_of(archive), len(body))
    assert [(r[1].get("range"), r[1].get("if-range"), r[2]) for r in server.requests] == [
        (None, None, 200),
        (f"bytes={cut}-", '"v1"', 206),
    ]
    assert any(f"resuming" in r.getMessage() and str(cut) in r.getMessage() for r in caplog.records)
    assert_contents(target, _members_of(archive))


def test_a_server_that_ignores_range_restarts_from_zero(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "big.tar.gz", {"blob.bin": os.urandom(300_000)})
    body = archive.read_bytes()
    url = server.serve("/big.tar.gz", body, drop_first_after=len(body) // 2, etag='"v1"')  # no range support
    result = fetch_weights(url, target, retries=1, sha256=sha256_of(archive))
    assert result.sha256 == sha256_of(archive)
    assert [(r[1].get("range") is not None, r[2]) for r in server.requests] == [(False, 200), (True, 200)]
    assert_contents(target, _members_of(archive))


def test_a_refused_resume_starts_over_from_zero(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "big.tar.gz", {"blob.bin": os.urandom(300_000)})
    body = archive.read_bytes()
    url = server.serve("/big.tar.gz", body, drop_first_after=len(body) // 2, etag='"v1"', refuse_ranges=True)
    result = fetch_weights(url, target, retries=2, sha256=sha256_of(archive))
    assert result.sha256 == sha256_of(archive)
    assert [(r[1].get("range") is not None, r[2]) for r in server.requests] == [(False, 200), (True, 416), (False, 200)]
    assert_contents(target, _members_of(archive))


def test_a_changed_file_is_not_resumed(server: WeightsServer, target: Path, tmp_path: Path) -> None:
    first = good_tar(tmp_path / "v1.tar.gz", {"blob.bin": os.urandom(300_000)}).read_bytes()
    archive = good_tar(tmp_path / "v2.tar.gz", {"blob.bin": os.urandom(300_000)})
    changed = Route(body=archive.read_bytes(), ranges=True, etag='"v2"')  # replaced on the server meanwhile
    url = server.serve("/big.tar.gz", first, drop_first_after=len(first) // 2, ranges=True, etag='"v1"', then=changed)
    result = fetch_weights(url, target, retries=1)
    assert result.sha256 == sha256_of(archive)
    assert [(r[1].get("if-range"), r[2]) for r in server.requests] == [(None, 200), ('"v1"', 200)]  # the whole new file
    assert_contents(target, _members_of(archive))


def _members_of(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}  # type: ignore[union-attr]


# --- redaction of redirects ------------------------------------------------------------------


@pytest.mark.parametrize("absolute", [True, False])
def test_a_redirects_signed_query_is_never_logged(
    server: WeightsServer, target: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, absolute: bool
) -> None:
    archive = good_tar(tmp_path / "good.tar.gz")
    server.serve("/blob/good.tar.gz", archive.read_bytes())
    signed = "/blob/good.tar.gz?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=t0ps3cr3t"
    url = server.serve("/signed", redirect_to=server.url(signed) if absolute else signed)
    caplog.set_level(logging.DEBUG)  # every logger: httpx, httpcore, ours
    result = fetch_weights(url + "?token=m1ne", target)
    assert result.sha256 == sha256_of(archive)
    assert [r[0] for r in server.requests] == ["/signed", "/blob/good.tar.gz"]  # the redirect was followed
    assert any(r.name.startswith("httpcore") for r in caplog.records)  # debug logs were on
    for record in caplog.records:
        for text in (record.getMessage(), repr(record.args), str(record.msg)):
            for secret in ("t0ps3cr3t", "AKIAEXAMPLE", "m1ne"):
                assert secret not in text, (record.name, text)


# --- zip archives and the download cap (LoRA adapters) ---------------------------------------------


def make_zip(path: Path, files: dict[str, bytes], links: dict[str, str] = {}) -> Path:  # noqa: B006
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, link in links.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, link)
    return path


def test_zip_is_unpacked_only_where_allowed(tmp_path: Path, target: Path) -> None:
    archive = make_zip(tmp_path / "w.zip", GOOD_FILES)
    with pytest.raises(ArchiveError, match="zip archive"):
        fetch_weights(archive, target)
    fetch_weights(archive, target, allow_zip=True)
    assert_contents(target, GOOD_FILES)


@pytest.mark.parametrize("files,links,fragment", [
    ({"../escape.txt": b"x"}, {}, "'..' path component"),
    ({"/abs.txt": b"x"}, {}, "absolute path"),
    ({"ok.txt": b"x"}, {"link": "/etc/passwd"}, "is a symlink"),
])
def test_unsafe_zip_members_are_refused(tmp_path: Path, target: Path, files, links, fragment) -> None:
    archive = make_zip(tmp_path / "bad.zip", files, links)
    with pytest.raises(ArchiveError) as info:
        fetch_weights(archive, target, allow_zip=True)
    assert fragment in str(info.value)
    assert_contents(target, OLD_FILES)  # the previous contents stay
    assert not (tmp_path / "escape.txt").exists()


def test_a_zip_bomb_stops_at_the_byte_limit(tmp_path: Path, target: Path) -> None:
    archive = make_zip(tmp_path / "bomb.zip", {"zeros.bin": b"\0" * 5_000_000})
    assert archive.stat().st_size < 50_000
    with pytest.raises(ArchiveError, match="over the limit of 1000000 bytes"):
        fetch_weights(archive, target, allow_zip=True, max_extracted_bytes=1_000_000)
    assert_contents(target, OLD_FILES)


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "no-length"])
def test_the_download_cap(server: WeightsServer, target: Path, tmp_path: Path, announce: bool) -> None:
    """A larger Content-Length fails before the body; without one, the body fails once it passes the cap."""
    body = good_tar(tmp_path / "w.tar.gz", {"big.bin": os.urandom(300_000)}).read_bytes()
    url = server.serve("/w.tar.gz", body, content_length=None if announce else -1)
    with pytest.raises(DownloadError) as info:
        fetch_weights(url, target, max_download_bytes=100_000, retries=0)
    message = str(info.value)
    assert "more than the 100000 bytes allowed to download" in message
    seen = int(message.rsplit("(", 1)[1].split()[0])
    assert seen == len(body) if announce else 100_000 < seen < len(body)
    assert server.hits["/w.tar.gz"] == 1  # not retried
    assert_contents(target, OLD_FILES)


# --- an API caller's archive (an adapter): a member limit counted before anything is written, the tar stream held
# --- to what its members can take, unpacking within the fetch's deadline (issue 47); setup's weights keep neither

from cog_triton.fetch.deadline import FetchDeadline  # noqa: E402
from cog_triton.weights.archive import TAR_MEMBER_OVERHEAD_BYTES, extract_archive  # noqa: E402
from common.errors import FetchDeadlineError  # noqa: E402


def _empties(n: int) -> dict[str, bytes]:
    return {f"d/f{i}": b"" for i in range(n)}


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_the_member_limit_is_counted_before_anything_is_written(tmp_path: Path, kind: str) -> None:
    """51 empty files against a limit of 50: refused naming the limit and its setting, with the staging folder still
    empty (the members were counted before the first was written); 50 unpack."""
    make = (lambda p, f: good_tar(p, f)) if kind == "tar.gz" else make_zip
    over, fits = make(tmp_path / f"over.{kind}", _empties(51)), make(tmp_path / f"fits.{kind}", _empties(50))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(ArchiveError) as info:
        extract_archive(over, staging, "over", 1 << 20, allow_zip=True, max_members=50,
                        members_setting="COG_TRITON_ADAPTER_MAX_MEMBERS")
    assert str(info.value).endswith("has more than the 50 members allowed (COG_TRITON_ADAPTER_MAX_MEMBERS); "
                                    "refusing to unpack it (nothing was written)")
    assert list(staging.iterdir()) == []
    extract_archive(fits, staging, "fits", 1 << 20, allow_zip=True, max_members=50)
    assert len(list((staging / "d").iterdir())) == 50


def test_members_declaring_more_than_the_budget_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive = good_tar(tmp_path / "w.tar.gz", {"a.txt": b"x" * 1000, "b.bin": b"\0" * 2_000_000})
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(ArchiveError) as info:
        extract_archive(archive, staging, "w", 1_000_000, max_members=10, limit_reason="the adapter's cap")
    assert ("unpacks to more than allowed: its members declare 2001000 bytes (up to and including 'b.bin'); nothing "
            "was written, over the limit of 1000000 bytes (the adapter's cap); refusing to unpack it"
            ) in str(info.value)
    assert list(staging.iterdir()) == []


def test_without_a_member_limit_setup_unpacks_any_number_of_members(tmp_path: Path, target: Path) -> None:
    files = _empties(2000)
    fetch_weights(good_tar(tmp_path / "many.tar.gz", files), target)
    assert len(list((target / "d").iterdir())) == 2000


def _zip_end_record(path: Path, **fields: int) -> Path:
    """Rewrite the zip's end-of-central-directory record's ``entries`` (this disk and total) or ``directory`` size
    (APPNOTE.TXT 4.3.16), leaving the central directory itself as it was."""
    import struct

    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x05\x06")
    if "entries" in fields:
        struct.pack_into("<HH", data, at + 8, fields["entries"], fields["entries"])
    if "directory" in fields:
        struct.pack_into("<L", data, at + 12, fields["directory"])
    path.write_bytes(bytes(data))
    return path


def test_a_zip_whose_end_record_understates_its_members_is_counted_by_its_directory(tmp_path: Path) -> None:
    """zipfile ignores the end record's entry count and parses the whole central directory: 60 entries stated as 3
    are refused once counted (before anything is written)."""
    archive = _zip_end_record(make_zip(tmp_path / "lie.zip", _empties(60)), entries=3)
    assert len(zipfile.ZipFile(archive).infolist()) == 60
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(ArchiveError, match="has more than the 50 members allowed"):
        extract_archive(archive, staging, "lie", 1 << 20, allow_zip=True, max_members=50)
    assert list(staging.iterdir()) == []


def test_a_zip_stating_a_central_directory_too_large_for_its_members_is_refused_before_zipfile_reads_it(
        tmp_path: Path) -> None:
    """The directory's size is what zipfile reads and parses first; one larger than 50 members can take is refused
    from the end record alone (zipfile itself would call it corrupt only after reading it)."""
    archive = _zip_end_record(make_zip(tmp_path / "big.zip", _empties(3)), directory=50_000_000)
    with pytest.raises(ArchiveError, match="has more than the 50 members allowed"):
        extract_archive(archive, tmp_path, "big", 1 << 20, allow_zip=True, max_members=50)
    with pytest.raises(ArchiveError, match="corrupt or truncated"):  # without the limit, zipfile's own refusal
        extract_archive(archive, tmp_path, "big", 1 << 20, allow_zip=True)


def test_an_extended_header_longer_than_members_can_be_is_refused_as_it_is_read(tmp_path: Path) -> None:
    """A GNU long name declaring 8 MB, which tarfile reads into memory whole (Lib/tarfile.py _proc_gnulong): with a
    member limit the tar stream may not go past the budget plus what its members' headers can take, so it is
    refused before tarfile reads it. Without one (setup's weights), the member rules refuse its path afterwards."""
    info = tarfile.TarInfo("a" * 8_000_000)
    archive = tmp_path / "longname.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b""))
    assert archive.stat().st_size < 100_000
    limit = 1_000_000 + 10 * TAR_MEMBER_OVERHEAD_BYTES
    with pytest.raises(ArchiveError) as refused:
        extract_archive(archive, tmp_path / "s1", "longname", 1_000_000, max_members=10)
    assert "is longer than its members can be: its tar stream goes on past byte" in str(refused.value)
    assert f"past byte {limit + (20 << 10)} (1000000 bytes of files" in str(refused.value)
    (tmp_path / "s2").mkdir()
    with pytest.raises(ArchiveError, match="has a path 8000000 bytes long"):
        extract_archive(archive, tmp_path / "s2", "longname", 1_000_000)


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_unpacking_counts_against_the_deadline_when_asked(tmp_path: Path, target: Path, kind: str) -> None:
    """An adapter's fetch: unpacking is part of its deadline, so one that passed ends it with the deadline's words
    (the previous contents kept). Setup's weights (unpack_in_deadline off) unpack whatever the deadline says."""
    make = (lambda p, f: good_tar(p, f)) if kind == "tar.gz" else make_zip
    archive = make(tmp_path / f"w.{kind}", _empties(20))
    with pytest.raises(FetchDeadlineError) as info:
        fetch_weights(archive, target, allow_zip=True, deadline_s=3, deadline_at=time.monotonic() - 1, max_members=50,
                      unpack_in_deadline=True)
    assert str(info.value) == (f"[download_deadline] the download of {archive} did not finish within the deadline of "
                               "3 s (COG_TRITON_DOWNLOAD_DEADLINE_S): it passed while the archive was being unpacked")
    assert_contents(target, OLD_FILES)
    fetch_weights(archive, target, allow_zip=True, deadline_s=3, deadline_at=time.monotonic() - 1)
    assert len(list((target / "d").iterdir())) == 20


def test_a_deadline_passing_while_members_are_written_stops_the_unpacking(tmp_path: Path) -> None:
    """The deadline is checked as each member is written, not only before: one that passes after the first 10 of
    200 members (a deadline object whose end is moved as the 10th file appears) stops at the next."""
    archive = good_tar(tmp_path / "w.tar.gz", _empties(200))
    staging = tmp_path / "staging"
    staging.mkdir()
    deadline = FetchDeadline(60, what="the download of w", setting="S")
    real_check = deadline.check

    def check() -> None:
        folder = staging / "d"
        if folder.is_dir() and len(list(folder.iterdir())) >= 10:
            deadline.at = time.monotonic() - 1
        real_check()

    deadline.check = check  # type: ignore[method-assign]
    with pytest.raises(FetchDeadlineError, match=r"the download of w did not finish within the deadline of 60 s \(S\): "
                                                 "it passed while the archive was being unpacked"):
        extract_archive(archive, staging, "w", 1 << 20, max_members=500, deadline=deadline)
    assert 10 <= len(list((staging / "d").iterdir())) <= 11
