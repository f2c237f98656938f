"""cog_triton.fetch.hub_errors: what a failed huggingface_hub call means, under whichever major is installed (the venv's
2.x here; tests/test_weights_hub_0x.py runs this module again under 0.36). The Hub's error answers are made by
huggingface_hub's own ``hf_raise_for_status`` from a response of its HTTP stack (requests in 0.x, httpx2 in 2.x),
so each class is the one that major really raises; the transport errors are the stacks' own classes."""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

import huggingface_hub
import pytest
import requests
from huggingface_hub import errors as hf
from huggingface_hub.utils import hf_raise_for_status

from cog_triton.fetch.hub_errors import KINDS, classify_hub_error

MAJOR = int(huggingface_hub.__version__.split(".")[0])
URL = "https://hub.example/me/tiny/resolve/main/config.json"


def _response(status: int, code: Optional[str]) -> Any:
    headers = {"X-Error-Message": "said the Hub", **({"X-Error-Code": code} if code else {})}
    if MAJOR == 0:
        response = requests.Response()
        response.status_code, response.url, response.reason, response._content = status, URL, "Reason", b"{}"
        response.headers.update(headers)
        response.request = requests.Request("HEAD", URL).prepare()
        return response
    stack = importlib.import_module("httpx2" if importlib.util.find_spec("httpx2") and MAJOR >= 2 else "httpx")
    return stack.Response(status, headers=headers, content=b"{}", request=stack.Request("HEAD", URL))


def _raised(status: int, code: Optional[str] = None) -> BaseException:
    try:
        hf_raise_for_status(_response(status, code))
    except Exception as exc:  # noqa: BLE001 - the one under test
        return exc
    raise AssertionError("hf_raise_for_status raised nothing")


@pytest.mark.parametrize("status,code,kind", [
    (404, "RevisionNotFound", "revision"),
    (401, "GatedRepo", "gated"),
    (403, "GatedRepo", "gated"),
    (404, "RepoNotFound", "repository"),
    (401, None, "repository"),
    (404, "EntryNotFound", "file"),
    (500, None, "http"),
    (403, None, "http"),
])
def test_the_hubs_answers_are_classified_with_status_and_message(status, code, kind):
    failure = classify_hub_error(_raised(status, code))
    assert (failure.kind, failure.status, failure.server_message) == (kind, status, "said the Hub")


def test_what_hf_hub_download_wraps_is_classified_by_its_cause():
    """_raise_on_head_call_error raises LocalEntryNotFoundError from the HEAD's error; in 0.x that class is an
    EntryNotFoundError and an HfHubHTTPError, so it must not read as a missing file or an HTTP answer."""
    for cause, kind in ((_raised(500), "http"), (requests.exceptions.ConnectionError("refused"), "unreachable"),
                        (hf.FileMetadataError("no X-Repo-Commit"), "not_a_hub")):
        wrapper = hf.LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")
        wrapper.__cause__ = cause
        failure = classify_hub_error(wrapper)
        assert (failure.kind, failure.error) == (kind, cause)
    bare = classify_hub_error(hf.LocalEntryNotFoundError("Cannot find the requested files in the disk cache"))
    assert (bare.kind, bare.status, bare.server_message) == ("unreachable", None, "")


def test_transport_errors_of_every_stack_are_not_disk_errors():
    """requests' ConnectionError and Timeout are OSErrors (0.x's stack); httpx's and httpx2's are not. None of them
    is a disk failure."""
    cases = [
        (requests.exceptions.ConnectionError("refused"), "unreachable"),
        (requests.exceptions.SSLError("bad certificate"), "unreachable"),
        (requests.exceptions.ReadTimeout("slow"), "unreachable"),
        (requests.exceptions.ChunkedEncodingError("cut short"), "transport"),
        (ConnectionRefusedError(111, "refused"), "unreachable"),
        (TimeoutError("slow"), "unreachable"),
        (hf.OfflineModeIsEnabled("offline"), "offline"),
        (PermissionError(13, "Permission denied"), "local"),
        (OSError(28, "No space left on device"), "local"),
        (ValueError("something else"), "other"),
    ]
    for name in ("httpx", "httpx2"):
        if importlib.util.find_spec(name):
            stack = importlib.import_module(name)
            cases += [(stack.ConnectError("refused"), "unreachable"), (stack.ReadTimeout("slow"), "unreachable"),
                      (stack.RemoteProtocolError("cut short"), "transport")]
    assert [classify_hub_error(exc).kind for exc, _ in cases] == [kind for _, kind in cases]
    assert {kind for _, kind in cases} | {"revision", "gated", "repository", "file", "http", "not_a_hub"} == set(KINDS)


def test_the_detail_names_the_error():
    failure = classify_hub_error(requests.exceptions.ConnectionError("refused"))
    assert failure.detail == "ConnectionError: refused"
