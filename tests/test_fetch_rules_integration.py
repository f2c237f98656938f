"""The fetch rules end to end (issue 25 item 4): every refusal of ``lora_weights`` through the real Cog HTTP
server, predict.py, its stream process and a real Triton, while local servers record what reaches them.
Nothing is mocked.

Two stacks, one per class (each torn down before the next starts):

* **rules**: the settings a deployment that fetches adapters from a mirror would have, with 127.0.0.1
  standing for the mirror's public address: ``COG_TRITON_FETCH_ALLOW_NETWORKS=127.0.0.1/32`` (127.0.0.2, also
  loopback, stays refused), https only (the test servers speak TLS with a certificate made here, trusted
  through ``SSL_CERT_FILE``), a host allow-list and a Hub owner allow-list (``HF_ENDPOINT`` is a fake Hub over
  https on 127.0.0.1). The refusals: plain http://, a loopback, a private and a link-local (the instance
  metadata service) address, a host off the list, a Hub owner off the list, and a redirect from an allowed
  server to a loopback one. An allowed adapter (URL and hf://) is fetched and served, and a base prediction
  after the refusals succeeds: the server keeps serving.
* **off**: ``COG_TRITON_LORA_ADAPTERS=false`` with every opt-in on: the input itself is refused.

Each refusal asserts that the destination's server saw no request.

The rules stack also carries issue 34's hardening where a caller meets it: an adapter server that drips its
response headers ends each such prediction with the deadline (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S) while
predictions whose adapter is cached or comes from a healthy server are served in their own time (against a
baseline measured in the same test); URLs the HTTP client cannot parse are refused by our rule; and no line of the
Cog server's log shows a secret of the URLs it was given (userinfo, a signed query string, the Hub's signed CDN
redirect).
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import http.server
import ssl
import subprocess
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest

from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env
from tests.lora_adapters import ADAPTER_FILES, make_adapter, pack
from tests.slow_server import SlowServer
from tests.test_lora_integration import _weights_folder


class FakeHub(http.server.BaseHTTPRequestHandler):
    """A Hub as a handler class, served here over TLS by :class:`Served` (tests/hub_server.py serves plain
    http): ``/<owner>/<repo>/resolve/<revision>/<file>``: HEAD and GET of the files in ``repos``, with the
    headers huggingface_hub reads (X-Repo-Commit, ETag, Content-Length); a missing file or repo is 404 with the
    Hub's X-Error-Code (EntryNotFound, RepoNotFound)."""

    repos: dict = {}
    gets: list = []
    heads: list = []  # every HEAD, answered or not
    #: Repositories whose *.safetensors redirect, as the Hub's LFS files do, to a signed URL of a CDN on another host
    #: (``localhost``) carrying X-Amz-Signature=<cdn_secret>; the CDN path serves the file.
    cdn_repos: tuple = ()
    cdn_secret = ""
    cdn_hits: list = []  # the files served from the CDN path

    def _answer(self, body: bool) -> None:
        if not body:
            type(self).heads.append(self.path)
        parts = self.path.split("?")[0].strip("/").split("/")
        cdn = parts[0] == "cdn"
        if cdn:
            parts = parts[1:]
            if body:
                type(self).cdn_hits.append("/".join(parts[4:]))
        repo, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        files = self.repos.get(repo)
        if files is None or name not in files:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound" if files is None else "EntryNotFound")
            self.send_header("X-Error-Message", "not found")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = files[name]
        if repo in self.cdn_repos and name.endswith(".safetensors") and not cdn:
            port = self.server.server_address[1]
            self.send_response(302)
            self.send_header("Location", f"https://localhost:{port}/cdn/{repo}/resolve/{'c' * 40}/{name}?X-Amz-"
                                         f"Credential=AKIAFAKECDN&X-Amz-Signature={self.cdn_secret}")
            self.send_header("X-Repo-Commit", "c" * 40)
            self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", "c" * 40)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            type(self).gets.append((repo, revision, name))
            self.wfile.write(data)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(True)

    def log_message(self, *args) -> None:
        pass


pytestmark = pytest.mark.integration

PROMPT = "What is machine learning?"
#: The rules stack's adapter deadline (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S), seconds.
DEADLINE_S = 10


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, 127.0.0.2 and localhost (openssl), and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=cog-triton test",
         "-addext", "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,DNS:localhost"],
        check=True, capture_output=True,
    )
    return cert, key


class _Files(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; ``/redirect`` answers 302 to ``location``; counts every request per path."""

    counter: "collections.Counter[str]"
    location = ""

    def do_GET(self) -> None:  # noqa: N802
        self.counter[self.path] += 1
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


class Served:
    """An HTTP(S) server on ``host`` in a background thread; ``tls``: (certificate, key)."""

    def __init__(self, handler: Any, host: str, tls: tuple[Path, Path] = ()) -> None:  # type: ignore[assignment]
        self.httpd = http.server.ThreadingHTTPServer((host, 0), handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _files(folder: Path, host: str, tls: Any = (), location: str = "") -> tuple[Served, "collections.Counter[str]"]:
    counter: collections.Counter[str] = collections.Counter()
    handler = type("Files", (_Files,), {"counter": counter, "location": location})
    return Served(partial(handler, directory=str(folder)), host, tls), counter


def _output(doc: dict[str, Any]) -> str:
    assert doc["status"] == "succeeded", doc.get("error") or doc
    out = doc["output"]
    return "".join(out) if isinstance(out, list) else out


def _refused(doc: dict[str, Any], value: str) -> str:
    """The error of a prediction refused before any output, as the adapter's error."""
    assert doc["status"] == "failed", doc
    assert doc.get("output") in (None, []), "a refused adapter must fail before any output"
    prefix = f"[invalid_lora_adapter] lora_weights {value} "  # after coglet's "Prediction failed: ..." preamble
    assert prefix in doc["error"], doc["error"]
    return doc["error"].split(prefix, 1)[1]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> dict[str, Path]:
    """The weights (the checkpoint with a LoRA build config) and one small adapter, as a folder and archive."""
    work = tmp_path_factory.mktemp("fetch_rules")
    adapter = make_adapter(checkpoint_dir, work / "made" / "a", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=11)
    return {"work": work, "weights": _weights_folder(checkpoint_dir, work / "weights_src"), "adapter": adapter,
            "archive": pack(adapter, work / "served" / "a.tar.gz")}


class TestRules:
    @pytest.fixture(scope="class")
    @classmethod
    def stack(cls, made: dict[str, Path]) -> Iterator[dict[str, Any]]:
        work = made["work"] / "rules"
        work.mkdir()
        tls = _certificate(work)
        served = made["archive"].parent
        loopback, loopback_counter = _files(served, "127.0.0.2", tls)  # loopback, and not an allowed network
        plain, plain_counter = _files(served, "127.0.0.1")  # http://
        mirror, mirror_counter = _files(served, "127.0.0.1", tls, location=f"{loopback.url}/a.tar.gz")
        files = {name: (made["adapter"] / name).read_bytes() for name in ADAPTER_FILES}
        hub_handler = type("Hub", (FakeHub,), {"repos": {"trusted/adapter": files, "evil/adapter": files,
                                                         "trusted/cdn-adapter": files},
                                               "gets": [], "heads": [], "cdn_repos": ("trusted/cdn-adapter",),
                                               "cdn_secret": "cdn-s1gnature", "cdn_hits": []})
        hub = Served(hub_handler, "127.0.0.1", tls)
        drip = SlowServer("headers", tls=tls, interval_s=0.2, hold_s=300)  # an adapter server that drips headers
        env = serving_env(
            str(made["weights"]), work=work,
            COG_TRITON_STREAM_PROCESSES="1", COG_TRITON_ADAPTER_CACHE_DIR=str(work / "adapter_cache"),
            COG_TRITON_REFERENCE_MAX_INPUT_LEN="256", COG_TRITON_REFERENCE_MAX_SEQ_LEN="512",
            COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_DOWNLOAD_RETRIES="0",
            # one deadline per adapter fetch; per-read timeouts far above it, so only the deadline ends a drip
            COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S=str(DEADLINE_S), COG_TRITON_DOWNLOAD_TIMEOUT_S="300",
            COG_TRITON_FETCH_ALLOW_NETWORKS="127.0.0.1/32",
            COG_TRITON_FETCH_ALLOW_HOSTS="127.0.0.1,127.0.0.2,10.1.2.3,169.254.169.254",
            COG_TRITON_FETCH_ALLOW_HF_OWNERS="trusted",
            SSL_CERT_FILE=str(tls[0]), HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="0",
        )
        cog = CogServer(env, log_file=work / "cog.log", max_concurrency=8)
        cog.start()
        try:
            cog.wait_ready(timeout_s=600)
            yield {"cog": cog, "loopback": loopback, "loopback_counter": loopback_counter, "plain": plain,
                   "plain_counter": plain_counter, "mirror": mirror, "mirror_counter": mirror_counter,
                   "hub": hub_handler, "drip": drip, "log": work / "cog.log"}
        finally:
            cog.stop()
            drip.close()
            for server in (loopback, plain, mirror, hub):
                server.close()

    def _predict(self, stack: dict[str, Any], lora: str = "", **extra: Any) -> dict[str, Any]:
        inputs = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra}
        if lora:
            inputs["lora_weights"] = lora
        return stack["cog"].predict(inputs)

    def test_an_allowed_adapter_is_fetched_over_https_by_url_and_from_the_hub(self, stack: dict[str, Any]) -> None:
        base = _output(self._predict(stack))
        by_url = _output(self._predict(stack, f"{stack['mirror'].url}/a.tar.gz"))
        assert stack["mirror_counter"]["/a.tar.gz"] == 1
        assert _output(self._predict(stack, "hf://trusted/adapter")) == by_url
        assert sorted(name for repo, _, name in stack["hub"].gets if repo == "trusted/adapter") == sorted(ADAPTER_FILES)
        assert by_url != base, "the adapter must change the output (else 'served' proves nothing)"

    def test_plain_http_is_refused(self, stack: dict[str, Any]) -> None:
        url = f"{stack['plain'].url}/a.tar.gz"
        assert _refused(self._predict(stack, url), url) == (
            "is refused: plain http:// is refused; adapters are fetched only over https:// "
            "(set COG_TRITON_FETCH_ALLOW_HTTP=true to allow http://)")
        assert stack["plain_counter"] == {}

    def test_a_loopback_address_is_refused(self, stack: dict[str, Any]) -> None:
        url = f"{stack['loopback'].url}/a.tar.gz"
        assert _refused(self._predict(stack, url), url) == (
            "is refused: 127.0.0.2 is a loopback address; adapters are fetched only from public addresses "
            "(set COG_TRITON_FETCH_ALLOW_PRIVATE=true to allow private networks, or list the networks allowed in "
            "COG_TRITON_FETCH_ALLOW_NETWORKS)")
        assert stack["loopback_counter"] == {}

    @pytest.mark.parametrize("url,problem", [
        ("https://10.1.2.3/adapter.tar.gz", "10.1.2.3 is a private address;"),
        ("https://169.254.169.254/latest/meta-data/iam.tar",
         "169.254.169.254 is a link-local address (the cloud instance metadata service);"),
    ])
    def test_private_and_link_local_addresses_are_refused(self, stack: dict[str, Any], url: str,
                                                          problem: str) -> None:
        assert _refused(self._predict(stack, url), url).startswith(f"is refused: {problem} adapters are fetched")

    def test_a_host_off_the_allow_list_is_refused(self, stack: dict[str, Any]) -> None:
        url = f"{stack['mirror'].url.replace('127.0.0.1', 'localhost')}/a.tar.gz"
        before = sum(stack["mirror_counter"].values())
        assert _refused(self._predict(stack, url), url) == (
            "is refused: the host localhost is not on the list of hosts adapters are fetched from "
            "(COG_TRITON_FETCH_ALLOW_HOSTS=127.0.0.1,127.0.0.2,10.1.2.3,169.254.169.254)")
        assert sum(stack["mirror_counter"].values()) == before

    def test_a_hub_owner_off_the_allow_list_is_refused(self, stack: dict[str, Any]) -> None:
        assert _refused(self._predict(stack, "hf://evil/adapter"), "hf://evil/adapter") == (
            "is refused: the Hub owner 'evil' is not on the list of owners adapters are fetched from "
            "(COG_TRITON_FETCH_ALLOW_HF_OWNERS=trusted)")
        hub = stack["hub"]
        assert not [path for path in hub.heads if "evil" in path]
        assert not [got for got in hub.gets if got[0] == "evil/adapter"]

    def test_a_redirect_from_an_allowed_server_to_a_loopback_one_is_refused(self, stack: dict[str, Any]) -> None:
        url = f"{stack['mirror'].url}/redirect"
        before = stack["mirror_counter"]["/redirect"]
        assert _refused(self._predict(stack, url), url) == (
            "is refused: the redirect to 127.0.0.2: 127.0.0.2 is a loopback address; adapters are fetched only "
            "from public addresses (set COG_TRITON_FETCH_ALLOW_PRIVATE=true to allow private networks, or list "
            "the networks allowed in COG_TRITON_FETCH_ALLOW_NETWORKS)")
        assert stack["mirror_counter"]["/redirect"] == before + 1  # the allowed server was asked, once
        assert stack["loopback_counter"] == {}

    def test_a_dripping_adapter_server_ends_at_the_deadline_and_starves_no_other_adapter(
            self, stack: dict[str, Any]) -> None:
        """Four predictions whose lora_weights server drips its response headers (one byte every 0.2 s, under any
        per-read timeout) in one stream process: each ends with the deadline, the server still dripping, and while
        all four are held, a prediction with a cached adapter and one whose adapter comes from a healthy server
        (never fetched before) are served in their own time: each within half a deadline of its baseline, taken
        alone in this test (with a fixed pool of four adapter threads they waited for the deadline)."""
        mirror = f"{stack['mirror'].url}/a.tar.gz"
        expected = _output(self._predict(stack, mirror))  # cached from here on

        def timed(lora: str) -> tuple[dict[str, Any], float]:
            started = time.monotonic()
            doc = self._predict(stack, lora)
            return doc, time.monotonic() - started

        baseline = {"cached": timed(mirror)[1], "healthy": timed(f"{mirror}?fresh=baseline")[1]}
        drip = stack["drip"]
        held_before = drip.accepted
        stuck_urls = [f"{drip.url}/adapter-{i}.tar.gz" for i in range(4)]  # four sources: four connections held
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            stuck = [pool.submit(self._predict, stack, url) for url in stuck_urls]
            assert drip.wait(accepted=held_before + 4), "the four fetches did not reach the dripping server"
            during = {"cached": pool.submit(timed, mirror), "healthy": pool.submit(timed, f"{mirror}?fresh=during")}
            served = {name: future.result() for name, future in during.items()}
            still_held = drip.open_now()
            stuck_docs = [future.result() for future in stuck]
        for name, (doc, took) in served.items():
            assert _output(doc) == expected, name
            assert took < baseline[name] + DEADLINE_S / 2, (name, took, baseline[name])
        assert still_held == 4, "the adapters were served only after the stuck fetches had ended"
        for doc, stuck_url in zip(stuck_docs, stuck_urls):
            assert _refused(doc, stuck_url).startswith(
                f"could not be fetched: the download of {stuck_url} did not finish within the deadline of "
                f"{DEADLINE_S} s (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S)"), doc["error"]
        assert drip.wait(ended=held_before + 4) and drip.ended[-4:] == ["client"] * 4, drip.ended  # still dripping

    @pytest.mark.parametrize("url,reason", [
        ("https://deploy:pw-hunter2/pw-SECRET@127.0.0.1:{port}/a.tar.gz", "Invalid port"),
        ("https://0177.0.0.1/a.tar.gz", "Invalid IPv4 address"),
        ("https://\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com/a.tar.gz", "Invalid IDNA hostname"),
    ])
    def test_a_url_the_http_client_cannot_parse_is_refused_by_our_rule(self, stack: dict[str, Any], url: str,
                                                                       reason: str) -> None:
        """Not a raw httpx.InvalidURL counted as an internal error: the input named, the reason, the value not
        echoed (a password with an unencoded '/' is the port for every parser)."""
        url = url.format(port=stack["mirror"].url.rsplit(":", 1)[1])
        doc = self._predict(stack, url)
        assert doc["status"] == "failed" and doc.get("output") in (None, []), doc
        assert f"[invalid_lora_adapter] lora_weights is not a URL the HTTP client can parse ({reason}); the value " \
               "is not shown, as it may hold a password." in doc["error"], doc["error"]
        host = url.split("//", 1)[1].split("/", 1)[0]
        assert "hunter2" not in doc["error"] and host not in doc["error"]

    def test_no_line_of_the_cog_servers_log_shows_a_secret_of_a_url(self, stack: dict[str, Any]) -> None:
        """Predictions with credentials, a signed query string and a fragment in lora_weights, a password alone, one
        whose Hub file redirects to a signed CDN URL, and an unparsable one: the whole log of the Cog server (coglet,
        the worker, the stream process, Triton's output) holds none of their secrets."""
        mirror = stack["mirror"].url
        signed = f"{mirror.replace('https://', 'https://alice-user:alice-pass@')}/a.tar.gz?X-Amz-Signature=s1gq#fr4g"
        assert _output(self._predict(stack, signed)) != ""
        # a password alone (the URL above would be redacted whole for its query string's sake), served and failing
        alone = mirror.replace("https://", "https://bob-user:bob-pass-alone@")
        assert _output(self._predict(stack, f"{alone}/a.tar.gz")) != ""
        missing = self._predict(stack, f"{alone}/missing.tar.gz")
        assert missing["status"] == "failed" and "bob-pass-alone" not in missing["error"], missing["error"]
        assert _output(self._predict(stack, "hf://trusted/cdn-adapter")) != ""
        assert stack["hub"].cdn_hits == ["adapter_model.safetensors"], "the signed CDN redirect was followed"
        self._predict(stack, f"https://deploy:pw-hunter2/pw-SECRET@{mirror.split('//', 1)[1]}/a.tar.gz")
        text = stack["log"].read_text(errors="replace")
        assert f"adapter {mirror}/a.tar.gz ready" in text  # the log names the adapter, redacted
        for secret in ("alice-user", "alice-pass", "s1gq", "fr4g", "cdn-s1gnature", "AKIAFAKECDN", "pw-hunter2",
                       "pw-SECRET", "bob-user", "bob-pass-alone"):
            lines = [line for line in text.splitlines() if secret in line]
            assert not lines, (secret, lines[:3])

    def test_the_server_keeps_serving_after_the_refusals(self, stack: dict[str, Any]) -> None:
        doc = self._predict(stack, "https://169.254.169.254/latest/meta-data/iam.tar")
        assert doc["status"] == "failed"
        assert _output(self._predict(stack)) != ""
        assert stack["cog"].health()["status"] == "READY"


class TestAdaptersOff:
    @pytest.fixture(scope="class")
    @classmethod
    def stack(cls, made: dict[str, Path]) -> Iterator[dict[str, Any]]:
        work = made["work"] / "off"
        work.mkdir()
        with WeightsHTTPServer(made["archive"].parent) as adapters:
            env = serving_env(
                str(made["weights"]), work=work,
                COG_TRITON_STREAM_PROCESSES="1", COG_TRITON_REFERENCE_MAX_INPUT_LEN="256",
                COG_TRITON_REFERENCE_MAX_SEQ_LEN="512", COG_TRITON_STOP_TIMEOUT_S="5",
                COG_TRITON_LORA_ADAPTERS="false",
                COG_TRITON_FETCH_ALLOW_PRIVATE="true", COG_TRITON_FETCH_ALLOW_HTTP="true",  # the switch alone refuses
            )
            cog = CogServer(env, log_file=work / "cog.log", max_concurrency=2)
            cog.start()
            try:
                cog.wait_ready(timeout_s=600)
                yield {"cog": cog, "adapters": adapters}
            finally:
                cog.stop()

    def test_lora_weights_is_refused_when_adapters_are_off(self, stack: dict[str, Any]) -> None:
        for value in (f"{stack['adapters'].url}/a.tar.gz", "hf://trusted/adapter"):
            doc = stack["cog"].predict({"prompt": PROMPT, "max_tokens": 4, "lora_weights": value})
            assert _refused(doc, value) == (
                "was given, but this server does not take LoRA adapters (COG_TRITON_LORA_ADAPTERS=false); leave it "
                "empty to use the base model")
        assert stack["adapters"].counter == {}
        assert _output(stack["cog"].predict({"prompt": PROMPT, "max_tokens": 4})) != ""

