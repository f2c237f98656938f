"""cog_triton.fetch.hub_errors: what a failed huggingface_hub call means, under whichever major is installed (the venv's
2.x here; tests/test_weights_hub_0x.py runs this module again under 0.36). The Hub's error answers are made by
huggingface_hub's own ``hf_raise_for_status`` from a response of its HTTP stack (requests in 0.x, httpx2 in 2.x),
so each class is the one that major really raises; the transport errors are the stacks' own classes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any, Optional

import huggingface_hub
import pytest
import requests
from huggingface_hub import errors as hf
from huggingface_hub.utils import hf_raise_for_status

from cog_triton.fetch.hub_errors import KINDS, classify_hub_error
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.pins import HUB0_DIR

MAJOR = int(huggingface_hub.__version__.split(".")[0])
#: A file of the Hub endpoint this process uses (huggingface_hub.constants.ENDPOINT: https://huggingface.co here).
URL = f"{huggingface_hub.constants.ENDPOINT}/me/tiny/resolve/main/config.json"
#: A signed URL of the Hub's file CDN (another host), as the Hub's 302 for an LFS file names it.
CDN_URL = ("https://cdn-lfs.hf.example/repos/ab/cd/0123?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIACDNCRED"
           "%2F20260101&X-Amz-Signature=cdns1gnature")


def _response(status: int, code: Optional[str], url: str = URL, body: bytes = b"{}",
              content_type: str = "application/json") -> Any:
    headers = {"Content-Type": content_type}
    if url == URL:  # the Hub's own answers carry its message; a CDN's do not
        headers.update({"X-Error-Message": "said the Hub", **({"X-Error-Code": code} if code else {})})
    if MAJOR == 0:
        response = requests.Response()
        response.status_code, response.url, response.reason, response._content = status, url, "Reason", body
        response.headers.update(headers)
        response.request = requests.Request("GET", url).prepare()
        return response
    stack = importlib.import_module("httpx2" if importlib.util.find_spec("httpx2") and MAJOR >= 2 else "httpx")
    return stack.Response(status, headers=headers, content=body, request=stack.Request("GET", url))


def _raised(status: int, code: Optional[str] = None, **response: Any) -> BaseException:
    try:
        hf_raise_for_status(_response(status, code, **response))
    except Exception as exc:  # noqa: BLE001 - the one under test
        return exc
    raise AssertionError("hf_raise_for_status raised nothing")


#: (status, X-Error-Code, kind) of the Hub's answers, as hf_raise_for_status raises them.
ANSWERS = [
    (404, "RevisionNotFound", "revision"),
    (401, "GatedRepo", "gated"),
    (403, "GatedRepo", "gated"),
    (404, "RepoNotFound", "repository"),
    (401, None, "repository"),
    (404, "EntryNotFound", "file"),
    (500, None, "http"),
    (403, None, "http"),
]


@pytest.mark.parametrize("status,code,kind", ANSWERS)
def test_the_hubs_answers_are_classified_with_status_and_message(status, code, kind):
    failure = classify_hub_error(_raised(status, code))
    assert (failure.kind, failure.status, failure.server_message) == (kind, status, "said the Hub")
    assert failure.answered_by == URL and failure.from_hub


def classified() -> list[list[Any]]:
    """[status, code, kind, status, server message] of each of :data:`ANSWERS` as this process's huggingface_hub
    raises it and classify_hub_error classifies it (for the comparison under both majors, below)."""
    out = []
    for status, code, _ in ANSWERS:
        failure = classify_hub_error(_raised(status, code))
        out.append([status, code, failure.kind, failure.status, failure.server_message])
    return out


def test_the_hubs_answers_are_classified_alike_under_both_majors():
    """The same answers, raised by huggingface_hub 0.36's own hf_raise_for_status (over requests, in a process
    with build/hub0 first on its path: the major the GPU image has) and by this venv's 2.x, are classified alike
    and as ANSWERS says; a fast test, so that a classification that holds under one major only fails here, not
    only in the integration tier's 0.x run (tests/test_weights_hub_0x.py)."""
    hub0 = REPO_ROOT / HUB0_DIR
    if not (hub0 / "huggingface_hub").is_dir():
        pytest.fail(f"{hub0} is missing: run scripts/setup", pytrace=False)
    script = ("import json, huggingface_hub, tests.test_hub_errors as t; "
              "print(json.dumps([huggingface_hub.__version__, t.classified()]))")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join((str(hub0), str(REPO_ROOT)))})
    assert run.returncode == 0, run.stderr[-3000:]
    version, under_0x = json.loads(run.stdout.strip().splitlines()[-1])
    assert version.startswith("0."), version
    here = classified()
    expected = [[status, code, kind, status, "said the Hub"] for status, code, kind in ANSWERS]
    assert under_0x == expected, f"under huggingface_hub {version}"
    assert here == expected, f"under huggingface_hub {huggingface_hub.__version__}"


def test_a_cdn_answering_an_error_after_the_hubs_redirect_shows_no_secret():
    """The Hub redirects an LFS file to a signed URL of its CDN; the CDN answers 403 with S3's refusal, whose body
    echoes the credential and the signature (tests/hub_server.py ``s3_signature_refusal``). huggingface_hub's
    message quotes the signed URL and that body; what the failure gives to show quotes neither (the URL redacted,
    the CDN's body dropped), and names who answered."""
    from tests.hub_server import s3_signature_refusal

    status, content_type, body = s3_signature_refusal("cdns1gnature", "AKIACDNCRED")
    exc = _raised(status, url=CDN_URL, body=body, content_type=content_type)
    assert "cdns1gnature" in str(exc) and "AKIACDNCRED" in str(exc)  # what huggingface_hub's message holds
    failure = classify_hub_error(exc)
    assert (failure.kind, failure.status, failure.server_message) == ("http", 403, "")
    assert failure.answered_by == "https://cdn-lfs.hf.example/repos/ab/cd/0123" and not failure.from_hub
    for shown in (failure.text, failure.detail, failure.answered_by):
        assert "cdns1gnature" not in shown and "AKIACDNCRED" not in shown and "X-Amz" not in shown, shown
    assert "https://cdn-lfs.hf.example/repos/ab/cd/0123" in failure.detail


@pytest.mark.parametrize("secret_url", [
    "https://deploy:pw-only-secret@hub.example/me/tiny/resolve/main/config.json",  # a password alone
    "https://hub.example/me/tiny/resolve/main/config.json?token=q-only-secret",  # a query string alone
    "https://hub.example/me/tiny/resolve/main/config.json#f-only-secret",  # a fragment alone
])
def test_each_secret_of_a_url_is_redacted_alone_from_a_failures_text(secret_url):
    """A transport error quoting a URL with one secret: the failure's text shows the URL without it."""
    failure = classify_hub_error(requests.exceptions.ConnectionError(f"cannot reach {secret_url}"))
    assert failure.kind == "unreachable"
    assert "only-secret" not in failure.detail and "hub.example/me/tiny/resolve/main/config.json" in failure.detail


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
