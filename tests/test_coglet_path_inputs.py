"""What coglet 0.23.1 does with URLs given to a ``list[Path]`` input (as ``image_input`` is), reproduced with the
installed Cog server and a toy predictor that reports what ``predict()`` receives: the facts docs/operations.md
("Files given as URLs to a Cog Path input") states, and that the predictor's handling of ``image_input`` is built
around (source: replicate/cog 6110c912 ``crates/coglet-python/src/input.rs`` ``coerce_typed_inputs`` and
``download_url_paths_into_dict``; cog 0.23.1 ``python/cog/types.py`` ``URLFile``, ``URLPath``). If a coglet
release changes one, its test fails here first.
"""

from __future__ import annotations

import http.server
import textwrap
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.test_cog_bridge import ToyServer

pytestmark = pytest.mark.integration

SOURCE = textwrap.dedent(
    """
    import os
    from typing import List
    from cog import BasePredictor, Input, Path

    class Predictor(BasePredictor):
        async def predict(self, image_input: List[Path] = Input(default=[])) -> str:
            return "\\n".join(f"{type(item).__name__}|{item}|{os.path.exists(str(item))}" for item in image_input)
    """
)
SCHEMA = {"image_input": {"type": "array", "items": {"type": "string", "format": "uri"}, "default": []}}


class Files:
    """An HTTP server on 127.0.0.1 serving a few bytes at any path but /missing (404) and /redirect (302 to
    127.0.0.2, also loopback); it records each request's path."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        files = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                files.paths.append(self.path)
                if self.path == "/missing":
                    self.send_error(404)
                    return
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.2:{files.port}/moved.png")
                    self.end_headers()
                    return
                body = b"\x89PNG image bytes"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("coglet_paths")
    tmp = work / "tmp"
    tmp.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp))
        server = ToyServer(work / "toy", SOURCE, SCHEMA)
    files = Files()
    try:
        yield {"server": server, "files": files, "tmp": tmp}
    finally:
        server.stop()
        files.httpd.shutdown()


def predict(stack: dict[str, Any], images: list[str]) -> dict[str, Any]:
    stack["files"].paths.clear()
    response = httpx.post(f"{stack['server'].url}/predictions", json={"input": {"image_input": images}}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def received(doc: dict[str, Any]) -> list[list[str]]:
    assert doc["status"] == "succeeded", doc
    return [line.split("|") for line in doc["output"].splitlines()]


def test_a_loopback_url_is_downloaded_and_predict_gets_the_file(stack: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{stack['files'].port}/a.png"
    ((kind, path, exists),) = received(predict(stack, [url]))
    assert (kind, exists) == ("Path", "True") and path.startswith(str(stack["tmp"]))
    assert stack["files"].paths == ["/a.png"]
    assert list(stack["tmp"].iterdir()) == []  # removed when the prediction ended


def test_a_redirect_to_loopback_is_followed(stack: dict[str, Any]) -> None:
    ((kind, _, exists),) = received(predict(stack, [f"http://127.0.0.1:{stack['files'].port}/redirect"]))
    assert (kind, exists) == ("Path", "True") and stack["files"].paths == ["/redirect", "/moved.png"]


def test_a_path_on_the_server_reaches_predict_as_a_plain_string(stack: dict[str, Any]) -> None:
    assert received(predict(stack, ["/etc/hostname", "file:///etc/hostname"])) == [
        ["str", "/etc/hostname", "True"], ["str", "file:///etc/hostname", "False"]]


def test_a_list_mixing_a_url_and_a_string_is_not_downloaded(stack: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{stack['files'].port}/c.png"
    assert received(predict(stack, [url, "/etc/hostname"])) == [["URLPath", url, "False"],
                                                               ["str", "/etc/hostname", "True"]]
    assert stack["files"].paths == []


def test_a_failed_download_fails_the_prediction_and_leaves_a_file(stack: dict[str, Any]) -> None:
    before = set(stack["tmp"].iterdir())
    doc = predict(stack, [f"http://127.0.0.1:{stack['files'].port}/missing"])
    assert doc["status"] == "failed" and doc["error"].startswith("Input validation error: 404 Client Error")
    left = set(stack["tmp"].iterdir()) - before
    assert len(left) == 1 and next(iter(left)).stat().st_size == 0
