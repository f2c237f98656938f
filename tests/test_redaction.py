"""URLs as the HTTP client parses them (cog_triton.fetch.redaction): what a URL shows, which URLs are refused by our own
rule, and a scan of every log record of a run whose URLs carry secrets (userinfo, signed query strings,
fragments), through the real clients: httpx (our downloads), httpx2 (huggingface_hub 2.x against the local Hub
stand-in, whose files redirect to a signed CDN URL as the Hub's do), requests/urllib3 (huggingface_hub 0.x's
stack, through the guarded session), every logger at DEBUG. Real HTTP servers on free ports; nothing mocked."""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
from pathlib import Path

import httpx
import pytest

from common.errors import LoraAdapterError, WeightsError
from cog_triton.fetch.guard import FetchGuard, guarded_requests_session
from cog_triton.fetch.rules import FetchRules
from cog_triton.fetch.adapter_refs import check_adapter_allowed, parse_adapter_ref
from cog_triton.streaming.lora.store import AdapterStore
from cog_triton.stream_config import StoreLimits
from cog_triton.fetch.redaction import (
    HTTP_LOGGERS, UNPARSABLE, UnparsableURL, errors_redacted, install_log_redaction, parse_url, redact_error,
    redact_text, redact_url,
)
from cog_triton.weights import fetch_weights
from tests.hub_server import FakeHub, s3_signature_refusal
from tests.lora_adapters import pack_files

#: httpx's parser and urllib.parse both read "deploy:hunter2" as host:port: the password's "/" ends the authority.
SLASHED_PASSWORD = "https://deploy:pw-hunter2/pw-SECRET-part@example.com/adapter.tar.gz"


@pytest.mark.parametrize("url,reason,hint", [
    (SLASHED_PASSWORD, "Invalid port", "percent-encode '/'"),
    ("https://0177.0.0.1/a.tar.gz", "Invalid IPv4 address", "four decimal numbers"),
    ("https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/a.tar.gz", "Invalid IDNA hostname", "ASCII"),
    ("https://example.com/a b.tar.gz", "white space or a control character", "%20"),
    ("https://example.com/a\x00.tar.gz", "white space or a control character", "%20"),
])
def test_a_url_the_client_cannot_parse_is_refused_without_its_text(url: str, reason: str, hint: str) -> None:
    with pytest.raises(UnparsableURL) as info:
        parse_url(url)
    assert info.value.reason == reason and hint in info.value.hint
    if "white space" not in reason:  # (httpx percent-encodes white space in a path; we refuse it first)
        with pytest.raises(httpx.InvalidURL):
            httpx.URL(url)  # the client refuses it too: that is what decides
    assert redact_url(url) == UNPARSABLE
    host = url.split("//", 1)[1].split("/", 1)[0]
    for make in (lambda: parse_adapter_ref(url), lambda: fetch_weights(url, Path("/nonexistent/weights"))):
        with pytest.raises((LoraAdapterError, WeightsError)) as refused:
            make()
        message = refused.value.message
        assert "is not a URL the HTTP client can parse" in message and reason in message, message
        assert host not in message and "hunter2" not in message and "SECRET" not in message, message
    assert FetchRules().url_refusal(url, "adapters").startswith("the value is not a URL the HTTP client can parse")


@pytest.mark.parametrize("url,shown", [
    ("https://u:p@host:8443/a/b.tgz?sig=1#frag", "https://host:8443/a/b.tgz"),
    ("https://user:pa%2Fss@example.com/a.tar.gz?X-Amz-Signature=abc", "https://example.com/a.tar.gz"),
    ("http://a@b@c/x", "http://c/x"),  # the last "@" ends the userinfo, for httpx as for the server
    ("https://user:pw-alone@example.com/a.tar.gz", "https://example.com/a.tar.gz"),  # a password alone
    ("https://example.com/a.tar.gz?X-Amz-Signature=q-alone", "https://example.com/a.tar.gz"),  # a query alone
    ("https://example.com/a.tar.gz#f-alone", "https://example.com/a.tar.gz"),  # a fragment alone
    ("https://example.com\\@evil.com/x", "https://evil.com/x"),  # the host httpx connects to
    ("https://b\u00fccher.ch/x", "https://xn--bcher-kva.ch/x"),  # as it is resolved
    ("https://[::1]:8080/x", "https://[::1]:8080/x"),
])
def test_a_url_shows_what_the_client_requests_without_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    parsed = httpx.URL(url)
    assert parsed.raw_host.decode() in shown  # the host shown is the host the client connects to


def test_the_host_the_rules_judge_is_the_host_the_client_connects_to() -> None:
    rules = FetchRules(allow_hosts=("example.com",))
    assert rules.url_refusal("https://example.com\\@evil.com/x", "adapters") == (
        "the host evil.com is not on the list of hosts adapters are fetched from (COG_TRITON_FETCH_ALLOW_HOSTS="
        "example.com)")
    ref = parse_adapter_ref("https://example.com\\@evil.com/x.tar.gz")
    with pytest.raises(LoraAdapterError, match="the host evil.com is not on the list"):
        check_adapter_allowed(ref, rules)


@pytest.mark.parametrize("url", ["https://deploy:pw-alone@h.example/x.tar.gz",
                                 "https://h.example/x.tar.gz?X-Amz-Signature=q-alone",
                                 "https://h.example/x.tar.gz#f-alone"],
                         ids=["password", "query", "fragment"])
def test_each_secret_alone_is_redacted_from_free_text_and_errors(url: str) -> None:
    """One secret at a time (a URL with a password and a query string is redacted whole for the query's sake: it
    would hide a password left in place), in a log line, in our error and in a library's."""
    secret = "alone"
    assert secret not in redact_text(f"GET {url} failed") and "https://h.example/x.tar.gz failed" in redact_text(
        f"GET {url} failed")
    ours = redact_error(WeightsError(f"could not download {url}: HTTP 404"))
    assert isinstance(ours, WeightsError) and secret not in str(ours) and secret not in ours.message
    assert ours.message == "could not download https://h.example/x.tar.gz: HTTP 404"
    theirs = redact_error(ValueError(f"bad answer from {url}"))
    assert isinstance(theirs, ValueError) and secret not in str(theirs)


def test_errors_leave_our_code_redacted() -> None:
    """A library's error quoting a relative request line keeps its type, less the query string; one whose text
    does not come from its arguments (an OSError's file name) becomes a RuntimeError of its redacted text; a
    cancellation is left alone; errors_redacted() re-raises each so."""
    relative = redact_error(ConnectionError("Max retries exceeded with url: /cdn/f?X-Amz-Signature=q-rel (refused)"))
    assert isinstance(relative, ConnectionError) and "q-rel" not in str(relative) and "/cdn/f" in str(relative)
    named = OSError(2, "No such file", "https://h.example/f?token=q-name")
    swapped = redact_error(named)
    assert type(swapped) is RuntimeError and "q-name" not in str(swapped) and "No such file" in str(swapped)
    cancelled = asyncio.CancelledError("https://h.example/f?token=q-cancel")
    assert redact_error(cancelled) is cancelled
    with pytest.raises(LoraAdapterError) as info, errors_redacted():
        raise LoraAdapterError("lora_weights https://u:pw-raised@h.example/a.tar.gz could not be fetched")
    assert "pw-raised" not in str(info.value)
    with pytest.raises(RuntimeError) as swapped_info, errors_redacted():
        raise named
    assert "q-name" not in str(swapped_info.value)


def test_free_text_loses_every_urls_secrets() -> None:
    line = (f'HTTP Request: GET https://u:pw@h.example/x?X-Amz-Signature=sig1 "HTTP/1.1 200 OK"; see ({SLASHED_PASSWORD}).'
            " (b'Location', b'/blob?X-Amz-Credential=cred1#frag1') plain https://example.com/a.tar.gz.")
    out = redact_text(line)
    for secret in ("pw", "sig1", "hunter2", "SECRET", "cred1", "frag1"):
        assert secret not in out.replace("pw-", "").replace("https://<", ""), out
    assert "https://h.example/x " in out and "(https://<unparsable URL>)." in out
    assert "plain https://example.com/a.tar.gz." in out  # a URL without secrets stays as written
    prose = "is HF_ENDPOINT a Hugging Face Hub? x#1"
    assert redact_text(prose, relative=False) == prose  # other loggers' prose: only absolute URLs are touched


# --- every log record of a run --------------------------------------------------------------------------------


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` (path -> bytes) with HTTP/1.1; ``/signed`` redirects to ``location``."""

    protocol_version = "HTTP/1.1"
    files: dict = {}
    location = ""

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path == "/signed":
            self.send_response(302)
            self.send_header("Location", self.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.files.get(path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: object) -> None:
        pass


SECRETS = ("pw-hunter2", "pw-SECRET-part", "alice-user", "alice-pass", "s1gnature-q", "AKIAFAKEHUB", "cdn-s1gnature",
           "fr4gment", "t0ken-q", "only-user", "only-pass")


def test_no_log_record_of_a_run_shows_a_urls_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Every record of every logger, at DEBUG, over a run that fetches through httpx (operator weights with
    credentials, a redirect to a signed URL), httpx2 (an hf:// adapter whose file redirects to a signed CDN URL),
    requests/urllib3 (a signed URL), refuses an unparsable URL, and logs an exception whose message holds a URL:
    formatted as a handler formats it (traceback included), no record holds any secret."""
    install_log_redaction()
    adapter = {"adapter_config.json": b'{"peft_type": "LORA", "r": 2}', "adapter_model.safetensors": b"\0" * 16}
    archive = pack_files(tmp_path / "a.tar.gz", adapter).read_bytes()
    handler = type("Files", (_Files,), {"files": {"/a.tar.gz": archive}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    handler.location = f"{base}/a.tar.gz?X-Amz-Signature=s1gnature-q#fr4gment"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    caplog.set_level(logging.DEBUG)
    try:
        with FakeHub() as hub:
            hub.use(monkeypatch)
            hub.cdn_secret = "cdn-s1gnature"
            hub.add_repo("owner/adapter", adapter)
            authed = base.replace("http://", "http://alice-user:alice-pass@")
            fetch_weights(f"{authed}/signed?token=t0ken-q", tmp_path / "weights", allow_zip=True)
            # a password alone (no query string to make the whole URL redacted for its sake)
            only = base.replace("http://", "http://only-user:only-pass@")
            fetch_weights(f"{only}/a.tar.gz", tmp_path / "weights-pw", allow_zip=True)
            with pytest.raises(WeightsError) as missing:
                fetch_weights(f"{only}/missing.tar.gz", tmp_path / "weights-none", retries=0)
            assert "only-pass" not in str(missing.value) and "only-user" not in str(missing.value)
            store = AdapterStore(StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules.open()))
            assert store.get(parse_adapter_ref("hf://owner/adapter")).config["r"] == 2
            assert [path for _, _, path in hub.gets] == ["adapter_config.json", "adapter_model.safetensors"]
            assert any("/cdn/" in path for _, path, _ in hub.requests), "the CDN redirect was followed"
            session = guarded_requests_session(FetchGuard(FetchRules.open(), what="adapters"))
            assert session.get(f"{base}/a.tar.gz?X-Amz-Signature=s1gnature-q#fr4gment").content == archive
            with pytest.raises(LoraAdapterError):
                parse_adapter_ref(SLASHED_PASSWORD)
            try:
                raise RuntimeError(f"a library quoting {SLASHED_PASSWORD} and {handler.location}")
            except RuntimeError:
                logging.getLogger("some.library").exception("the download failed")
    finally:
        server.shutdown()
        server.server_close()
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    loggers = {record.name.split(".", 1)[0] for record in caplog.records}
    assert {"httpx", "httpcore", "httpx2", "httpcore2", "urllib3"} <= loggers, loggers  # the scan saw each client
    assert set(HTTP_LOGGERS) >= {"httpx", "httpcore", "httpx2", "httpcore2", "urllib3", "huggingface_hub"}
    leaks = [(record.name, formatter.format(record)) for record in caplog.records
             if any(secret in formatter.format(record) for secret in SECRETS)]
    assert not leaks, leaks
    assert any("/cdn/" in record.getMessage() for record in caplog.records if record.name.startswith("httpx2"))


def test_an_adapter_whose_cdn_answers_an_error_shows_no_signed_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """hf:// adapter whose safetensors file the Hub redirects to a signed CDN URL, answered with S3's 403 (its body
    echoes the credential and the signature): the adapter's error names the CDN's answer and holds neither, nor does
    any log record. huggingface_hub's own message held both, and the adapter's error passed it on."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    caplog.set_level(logging.DEBUG)
    adapter = {"adapter_config.json": b'{"peft_type": "LORA", "r": 2}', "adapter_model.safetensors": b"\0" * 16}
    with FakeHub() as hub:
        hub.use(monkeypatch)
        hub.add_repo("owner/adapter", adapter)
        hub.cdn_secret = "cdn-s1g-adapter"
        hub.cdn_error = s3_signature_refusal("cdn-s1g-adapter", "AKIACDNADAPTER")
        store = AdapterStore(StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules.open()))
        with pytest.raises(LoraAdapterError) as info:
            store.get(parse_adapter_ref("hf://owner/adapter"))
    assert hub.cdn_requests and all("cdn-s1g-adapter" in path for _, path in hub.cdn_requests)
    message = info.value.message  # as the store raised it (redact_error, the service's boundary, is not needed)
    assert "403" in message and "/cdn/owner/adapter/" in message, message
    for secret in ("cdn-s1g-adapter", "AKIACDNADAPTER", "X-Amz"):
        assert secret not in message and secret not in caplog.text, (secret, message)
