"""The fetch rules (cog_triton.fetch.rules): which addresses, schemes, hosts and Hub owners an input may make
the server fetch from, and their enforcement (cog_triton.fetch.guard): the guarded httpx transport that checks
the address actually connected to.

Real sockets and HTTP servers on 127.0.0.1 / 127.0.0.2 throughout. A public address cannot be had here (no
internet), so the tests that need one let 127.0.0.1 through with COG_TRITON_FETCH_ALLOW_NETWORKS' rule
(``allow_networks``) and give the backend their own resolver (rebinding) or connector (a peer other than
the one asked for): the two injectable parts of :class:`cog_triton.fetch.guard.GuardedBackend`.
"""

from __future__ import annotations

import http.server
import ipaddress
import select
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import httpcore
import httpx
import pytest

from common.errors import ConfigError, FetchRefusedError, InputError
from cog_triton.fetch.guard import FetchGuard, guarded_requests_session, guarded_transport, hub_guard
from cog_triton.fetch.rules import FetchRules, address_problem, parse_hosts, parse_networks, parse_owners
from cog_triton.settings import Settings
from cog_triton.weights import fetch_weights

LOCAL = parse_networks("127.0.0.1/32")  # "public" for these tests: the only address they may reach


# --------------------------------------------------------------------------------------------- addresses
@pytest.mark.parametrize("address,problem", [
    ("0.0.0.0", "an unspecified address"),
    ("0.1.2.3", "an unspecified address"),
    ("::", "an unspecified address"),
    ("127.0.0.1", "a loopback address"),
    ("127.255.255.254", "a loopback address"),
    ("::1", "a loopback address"),
    ("::ffff:127.0.0.1", "a form of 127.0.0.1, a loopback address"),
    ("::ffff:7f00:1", "a form of 127.0.0.1, a loopback address"),
    ("64:ff9b::7f00:1", "a form of 127.0.0.1, a loopback address"),  # NAT64
    ("2002:7f00:1::1", "a form of 127.0.0.1, a loopback address"),  # 6to4
    ("::ffff:10.0.0.1", "a form of 10.0.0.1, a private address"),
    ("169.254.169.254", "a link-local address (the cloud instance metadata service)"),
    ("169.254.1.1", "a link-local address"),
    ("fe80::1", "a link-local address"),
    ("fe80::1%eth0", "a link-local address"),
    ("10.0.0.1", "a private address"),
    ("172.16.5.4", "a private address"),
    ("172.31.255.255", "a private address"),
    ("192.168.1.1", "a private address"),
    ("fc00::1", "a private address"),
    ("fd12:3456::1", "a private address"),
    ("fd00:ec2::254", "a private address (the cloud instance metadata service)"),
    ("100.64.0.1", "a shared (carrier-grade NAT) address"),
    ("100.127.255.254", "a shared (carrier-grade NAT) address"),
    ("100.100.100.200", "a shared (carrier-grade NAT) address (the cloud instance metadata service)"),
    ("224.0.0.1", "a multicast address"),
    ("239.255.255.250", "a multicast address"),
    ("ff02::1", "a multicast address"),
    ("240.0.0.1", "a reserved address"),
    ("255.255.255.255", "a reserved address"),
    ("::127.0.0.1", "a reserved address"),  # IPv4-compatible (deprecated), outside 2000::/3
    ("4000::1", "a reserved address"),
    ("192.0.0.9", "a special-purpose address"),
    ("192.0.2.1", "a special-purpose address"),
    ("198.18.0.1", "a special-purpose address"),
    ("203.0.113.7", "a special-purpose address"),
    ("2001:db8::1", "a special-purpose address"),
    ("2001::1", "a special-purpose address"),  # Teredo
    ("100::1", "a special-purpose address"),
])
def test_non_public_addresses_are_named(address: str, problem: str) -> None:
    named = address_problem(address)
    assert named == problem or (problem == "an unspecified address" and named == problem + " (it reaches this machine)")


@pytest.mark.parametrize("address", [
    "8.8.8.8", "1.1.1.1", "172.15.255.255", "172.32.0.1", "100.63.255.255", "100.128.0.1", "169.253.255.255",
    "223.255.255.255", "2606:4700:4700::1111", "2a00:1450:4001::200e", "::ffff:8.8.8.8", "64:ff9b::808:808",
    "2002:808:808::1",
])
def test_public_addresses_pass(address: str) -> None:
    assert address_problem(address) is None


def test_the_answer_does_not_depend_on_pythons_tables() -> None:
    """Python 3.11.2's ipaddress calls ::127.0.0.1 and 64:ff9b::7f00:1 global and multicast global; ours do not."""
    assert ipaddress.ip_address("224.0.0.1").is_global and address_problem("224.0.0.1") == "a multicast address"
    assert address_problem("64:ff9b::7f00:1") is not None and address_problem("::127.0.0.1") is not None


def test_the_default_rules_refuse_every_non_public_address_and_name_the_setting() -> None:
    rules = FetchRules()
    message = rules.address_refusal("127.0.0.1", "127.0.0.1", "adapters")
    assert message == ("127.0.0.1 is a loopback address; adapters are fetched only from public addresses (set "
                       "COG_TRITON_FETCH_ALLOW_PRIVATE=true to allow private networks, or list the networks allowed "
                       "in COG_TRITON_FETCH_ALLOW_NETWORKS)")
    for address in ("0.0.0.0", "::", "::ffff:127.0.0.1", "169.254.169.254", "10.1.2.3", "fc00::1", "100.64.0.1",
                    "224.0.0.1", "240.0.0.1"):
        assert rules.address_refusal(address, address, "adapters") is not None, address
    assert rules.address_refusal("8.8.8.8", "dns.google", "adapters") is None


def test_a_name_is_refused_without_telling_the_caller_its_address(caplog: pytest.LogCaptureFixture) -> None:
    message = FetchRules().address_refusal("10.20.30.40", "db.internal.example", "adapters")
    assert message is not None and message.startswith("db.internal.example resolves to a private address;")
    assert "10.20.30.40" not in message
    assert "10.20.30.40" in caplog.text  # the operator's log has it


def test_allowed_networks_let_only_those_through() -> None:
    rules = FetchRules(allow_networks=parse_networks("127.0.0.1/32, fd00:1::/64"))
    assert rules.address_refusal("127.0.0.1", "x", "adapters") is None
    assert rules.address_refusal("::ffff:127.0.0.1", "x", "adapters") is None  # the same IPv4 address
    assert rules.address_refusal("fd00:1::5", "x", "adapters") is None
    assert rules.address_refusal("127.0.0.2", "x", "adapters") is not None
    assert rules.address_refusal("169.254.169.254", "x", "adapters") is not None
    assert FetchRules(allow_private=True).address_refusal("169.254.169.254", "x", "adapters") is None


def test_schemes() -> None:
    assert FetchRules().scheme_refusal("https", "adapters") is None
    assert FetchRules().scheme_refusal("HTTP", "adapters") == (
        "plain http:// is refused; adapters are fetched only over https:// (set COG_TRITON_FETCH_ALLOW_HTTP=true "
        "to allow http://)")
    assert FetchRules(allow_http=True).scheme_refusal("http", "adapters") is None
    assert "ftp://" in (FetchRules(allow_http=True).scheme_refusal("ftp", "adapters") or "")


def test_host_allow_list() -> None:
    rules = FetchRules(allow_hosts=parse_hosts("Example.com., *.models.example.org, [::1], 10.0.0.1"))
    assert rules.allow_hosts == ("example.com", "*.models.example.org", "::1", "10.0.0.1")
    for host in ("example.com", "EXAMPLE.COM.", "a.models.example.org", "a.b.models.example.org", "::1",
                 "0:0::1", "10.0.0.1"):
        assert rules.host_refusal(host, "adapters") is None, host
    for host in ("www.example.com", "models.example.org", "evilmodels.example.org", "example.com.evil.net",
                 "10.0.0.2"):
        refusal = rules.host_refusal(host, "adapters")
        assert refusal is not None and "COG_TRITON_FETCH_ALLOW_HOSTS=example.com,*.models.example.org" in refusal
    assert FetchRules().host_refusal("anything.example", "adapters") is None  # no list: any host


def test_url_refusal_checks_scheme_host_and_an_ip_literal_without_connecting() -> None:
    rules = FetchRules(allow_hosts=("example.com", "169.254.169.254"))
    assert "plain http://" in rules.url_refusal("http://example.com/a.tar", "adapters")
    assert "the host other.example" in rules.url_refusal("https://other.example/a.tar", "adapters")
    assert "169.254.169.254 is a link-local address (the cloud instance metadata service)" in rules.url_refusal(
        "https://169.254.169.254/latest/meta-data/iam.tar", "adapters")
    assert "[::ffff:127.0.0.1]" not in rules.url_refusal("https://[::ffff:127.0.0.1]/a", "x")
    assert rules.url_refusal("https://example.com/a.tar?sig=1", "adapters") is None


def test_hub_owner_allow_list() -> None:
    rules = FetchRules(allow_hf_owners=parse_owners("Meta-Llama, me"))
    assert rules.hf_owner_refusal("meta-llama/Llama-3-8B", "adapters") is None
    assert rules.hf_owner_refusal("ME/adapter", "adapters") is None
    assert rules.hf_owner_refusal("evil/adapter", "adapters") == (
        "the Hub owner 'evil' is not on the list of owners adapters are fetched from "
        "(COG_TRITON_FETCH_ALLOW_HF_OWNERS=meta-llama,me)")
    assert FetchRules().hf_owner_refusal("anyone/anything", "adapters") is None


@pytest.mark.parametrize("variable,value,fragment", [
    ("COG_TRITON_FETCH_ALLOW_HOSTS", "a b", "'a b' is not a host name"),
    ("COG_TRITON_FETCH_ALLOW_HOSTS", "*.10.0.0.1", "not an IP address"),
    ("COG_TRITON_FETCH_ALLOW_NETWORKS", "10.0.0.0/33", "'10.0.0.0/33' is not a network"),
    ("COG_TRITON_FETCH_ALLOW_HF_OWNERS", "me/repo", "'me/repo' is not a Hugging Face Hub user"),
    ("COG_TRITON_FETCH_ALLOW_PRIVATE", "maybe", "COG_TRITON_FETCH_ALLOW_PRIVATE='maybe'"),
])
def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
                                        fragment: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert variable in info.value.message and fragment in info.value.message


def test_rules_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert FetchRules.from_settings(Settings.from_env()) == FetchRules()  # the default: https, public only
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_HTTP", "true")
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_NETWORKS", "10.1.2.3/24")
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_HOSTS", "Mirror.Example")
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_HF_OWNERS", "Me")
    rules = FetchRules.from_settings(Settings.from_env())
    assert rules == FetchRules(allow_http=True, allow_networks=(ipaddress.ip_network("10.1.2.0/24"),),
                               allow_hosts=("mirror.example",), allow_hf_owners=("me",))


def test_the_refusal_is_an_input_error() -> None:
    assert issubclass(FetchRefusedError, InputError) and FetchRefusedError.code == "fetch_refused"


# --------------------------------------------------------------------------------------------- connections
class Listener:
    """A bare TCP listener: tells whether anyone connected and what they sent (nothing is accepted by itself)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]

    def connected(self) -> bool:
        """A connection is waiting (a TCP handshake to a local listener completes before connect() returns)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def received(self) -> bytes:
        """Accept the waiting connection and read it to its end."""
        conn, _ = self.sock.accept()
        conn.settimeout(10)
        data = b""
        with conn:
            while chunk := conn.recv(65536):
                data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


class Server:
    """An HTTP server on ``host`` that answers ``/redirect`` with a 302 to ``location`` and anything else with
    ``ok``, closing each connection after its response (HTTP/1.0); records (host, path) of every request."""

    def __init__(self, host: str, location: str = "") -> None:
        requests: list[tuple[str, str]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                requests.append((host, self.path))
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.requests = requests
        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    item = Listener("127.0.0.2")
    yield item
    item.close()


def _get(guard: FetchGuard, url: str, inner: object = None) -> httpx.Response:
    with httpx.Client(transport=guarded_transport(guard, inner=inner), trust_env=False, follow_redirects=True) as c:
        return c.get(url)


def test_a_loopback_destination_is_refused_before_connecting(listener: Listener) -> None:
    guard = FetchGuard(FetchRules(allow_http=True), what="adapters")
    with pytest.raises(FetchRefusedError, match="127.0.0.2 is a loopback address; adapters are fetched only"):
        _get(guard, f"http://127.0.0.2:{listener.port}/a.tar.gz")
    assert not listener.connected()


def test_a_name_resolving_to_loopback_is_refused_before_connecting(listener: Listener) -> None:
    guard = FetchGuard(FetchRules(allow_http=True), what="adapters", resolver=lambda host, port: ["127.0.0.2"])
    with pytest.raises(FetchRefusedError, match="adapters.example resolves to a loopback address"):
        _get(guard, f"http://adapters.example:{listener.port}/a.tar.gz")
    assert not listener.connected()


@pytest.mark.parametrize("host", ["2130706434", "0x7f000002", "127.2"])
def test_other_spellings_of_a_loopback_address_are_caught_when_resolved(listener: Listener, host: str) -> None:
    """A decimal, hexadecimal or short IPv4 (inet_aton's forms) is no IP literal to the URL check; the system
    resolver turns it into the address, which is checked before connecting."""
    guard = FetchGuard(FetchRules(allow_http=True), what="adapters")
    with pytest.raises(FetchRefusedError, match=f"{host} resolves to a loopback address"):
        _get(guard, f"http://{host}:{listener.port}/a.tar.gz")
    assert not listener.connected()


def test_plain_http_is_refused_before_connecting(listener: Listener) -> None:
    guard = FetchGuard(FetchRules(allow_networks=LOCAL), what="adapters")
    with pytest.raises(FetchRefusedError, match="plain http:// is refused"):
        _get(guard, f"http://127.0.0.2:{listener.port}/a.tar.gz")
    assert not listener.connected()


def test_an_allowed_destination_is_fetched() -> None:
    server = Server("127.0.0.1")
    try:
        guard = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters")
        assert _get(guard, f"{server.url}/a.tar.gz").text == "ok"
        assert server.requests == [("127.0.0.1", "/a.tar.gz")]
    finally:
        server.close()


def test_dns_rebinding_is_caught_on_the_next_connection(listener: Listener) -> None:
    """The name resolves to the allowed ("public") address first, and to a loopback one when the client connects
    again: the second connection is refused, and nothing reaches the loopback listener."""
    server = Server("127.0.0.1")
    answers = iter([["127.0.0.1"], ["127.0.0.2"]])
    guard = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters",
                       resolver=lambda host, port: next(answers))
    port = server.httpd.server_address[1]
    try:
        with httpx.Client(transport=guarded_transport(guard), trust_env=False) as client:
            assert client.get(f"http://rebind.example:{port}/first").text == "ok"
            with pytest.raises(FetchRefusedError, match="rebind.example resolves to a loopback address"):
                client.get(f"http://rebind.example:{port}/second")  # HTTP/1.0 server: a new connection
        assert server.requests == [("127.0.0.1", "/first")]
        assert not listener.connected()
    finally:
        server.close()


def test_refused_addresses_are_skipped_for_an_allowed_one(listener: Listener) -> None:
    server = Server("127.0.0.1")
    port = server.httpd.server_address[1]
    guard = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters",
                       resolver=lambda host, port: ["127.0.0.2", "127.0.0.1"])
    try:
        assert _get(guard, f"http://both.example:{port}/a").text == "ok"
        assert not listener.connected()
    finally:
        server.close()


class Misrouting:
    """A connector that connects to ``to`` whatever address it is asked for (a stand-in for a route that ends
    elsewhere than the address dialled): the check must be on the connected socket's peer."""

    def __init__(self, to: tuple[str, int]) -> None:
        self.to = to
        self.backend = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, **kwargs: object) -> object:
        return self.backend.connect_tcp(*self.to, **kwargs)  # type: ignore[arg-type]

    def sleep(self, seconds: float) -> None:
        self.backend.sleep(seconds)


def test_the_connected_peer_is_checked_before_anything_is_sent(listener: Listener) -> None:
    guard = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters")
    with pytest.raises(FetchRefusedError, match="the connection to 127.0.0.1 reached a loopback address"):
        _get(guard, "http://127.0.0.1:9/a.tar.gz", inner=Misrouting(("127.0.0.2", listener.port)))
    assert listener.connected() and listener.received() == b""  # connected, then closed without a byte


def test_a_redirect_to_loopback_is_refused_and_the_loopback_server_sees_nothing(listener: Listener) -> None:
    server = Server("127.0.0.1", location=f"http://127.0.0.2:{listener.port}/a.tar.gz")
    try:
        guard = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters")
        with pytest.raises(FetchRefusedError) as info:
            _get(guard, f"{server.url}/redirect")
        assert info.value.message.startswith("the redirect to 127.0.0.2: 127.0.0.2 is a loopback address")
        assert server.requests == [("127.0.0.1", "/redirect")]
        assert not listener.connected()
    finally:
        server.close()


def test_a_redirect_to_a_host_off_the_list_or_to_http_is_refused(listener: Listener) -> None:
    server = Server("127.0.0.1", location=f"http://127.0.0.2:{listener.port}/a.tar.gz?sig=secret")
    try:
        rules = FetchRules(allow_http=True, allow_networks=parse_networks("127.0.0.0/8"), allow_hosts=("127.0.0.1",))
        with pytest.raises(FetchRefusedError) as info:
            _get(FetchGuard(rules, what="adapters"), f"{server.url}/redirect")
        assert info.value.message == (f"the redirect to http://127.0.0.2:{listener.port}/a.tar.gz: the host 127.0.0.2 "
                                      "is not on the list of hosts adapters are fetched from "
                                      "(COG_TRITON_FETCH_ALLOW_HOSTS=127.0.0.1)")
        assert not listener.connected()
    finally:
        server.close()


def test_an_unresolvable_name_is_a_connection_error_not_a_refusal() -> None:
    def fail(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    guard = FetchGuard(FetchRules(), what="adapters", resolver=fail)
    with pytest.raises(httpx.ConnectError, match="cannot resolve nowhere.example"):
        _get(guard, "https://nowhere.example/a.tar.gz")


# --------------------------------------------------------------------------------------------- fetch_weights
def test_fetch_weights_with_rules_ignores_proxies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through a proxy the connected peer would be the proxy: downloads under the rules go direct. (Without
    rules, the operator's own weights, httpx honours HTTP_PROXY: the same request reaches the proxy.)"""
    import tarfile

    root = tmp_path / "served"
    root.mkdir()
    (tmp_path / "f.txt").write_text("x")
    with tarfile.open(root / "w.tar", "w") as tar:
        tar.add(tmp_path / "f.txt", "f.txt")
    proxy = Server("127.0.0.2")
    handler = http.server.SimpleHTTPRequestHandler
    direct = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    threading.Thread(target=direct.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{direct.server_address[1]}/w.tar"
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    try:
        rules = FetchRules(allow_http=True, allow_networks=LOCAL)
        fetch_weights(url, tmp_path / "a", retries=0, rules=rules, what="adapters")
        assert (tmp_path / "a" / "f.txt").read_text() == "x" and proxy.requests == []
        with pytest.raises(Exception):  # noqa: B017 - the proxy answers "ok", not the archive
            fetch_weights(url, tmp_path / "b", retries=0)
        assert proxy.requests and proxy.requests[0][1] == url
    finally:
        proxy.close()
        direct.shutdown()
        direct.server_close()


def test_a_cached_fetch_is_refused_once_the_rules_refuse_its_url(tmp_path: Path) -> None:
    """The URL is checked before the marker of an earlier fetch is: tightened rules are not bypassed by a copy
    fetched under looser ones."""
    import tarfile

    root = tmp_path / "served"
    root.mkdir()
    (tmp_path / "f.txt").write_text("x")
    with tarfile.open(root / "w.tar", "w") as tar:
        tar.add(tmp_path / "f.txt", "f.txt")
    handler = http.server.SimpleHTTPRequestHandler
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/w.tar"
    try:
        assert not fetch_weights(url, tmp_path / "t", retries=0, rules=FetchRules.open()).skipped
        assert fetch_weights(url, tmp_path / "t", retries=0, rules=FetchRules.open()).skipped
        with pytest.raises(FetchRefusedError, match="127.0.0.1 is a loopback address"):
            fetch_weights(url, tmp_path / "t", retries=0, rules=FetchRules(allow_http=True), what="adapters")
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_weights_refuses_a_literal_address_before_anything(tmp_path: Path) -> None:
    with pytest.raises(FetchRefusedError, match="169.254.169.254 is a link-local address"):
        fetch_weights("https://169.254.169.254/latest/meta-data/iam.tar", tmp_path / "t", rules=FetchRules(),
                      what="adapters")
    assert not (tmp_path / "t").exists()


# --------------------------------------------------------------------------------------------- huggingface_hub
@pytest.fixture
def hub_online(monkeypatch: pytest.MonkeyPatch) -> Any:
    """huggingface_hub allowed online (the suite sets HF_HUB_OFFLINE=1; its constants are read at import);
    returns its constants module."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return constants


def test_the_hub_client_holds_every_request_to_the_rules(listener: Listener, hub_online: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's shared client (httpx2) gets the guarded transport: inside hub_guard the call's rules,
    outside it the default rules (fail closed). Xet storage is off (its Rust client cannot be checked).
    HF_HUB_OFFLINE still stops every request first, as huggingface_hub's own client does."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    url = f"http://127.0.0.2:{listener.port}/api/models/me/adapter"
    with hub_guard(FetchRules(allow_http=True), "adapters"):
        session = huggingface_hub.get_session()
        with pytest.raises(FetchRefusedError, match="127.0.0.2 is a loopback address"):
            session.get(url)
    with pytest.raises(FetchRefusedError, match="plain http:// is refused; Hub downloads"):
        huggingface_hub.get_session().get(url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with hub_guard(FetchRules(allow_http=True), "adapters"), pytest.raises(OfflineModeIsEnabled, match="offline"):
        huggingface_hub.get_session().get(url)
    assert not listener.connected()
    assert constants.HF_HUB_DISABLE_XET is True


# ------------------------------------------------------------------------------ requests (huggingface_hub 0.x)
def test_a_guarded_requests_session_refuses_loopback_redirects_and_rebinding(listener: Listener,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub 0.x (the GPU image's: TensorRT-LLM pins a transformers 4.x, which needs < 1.0) downloads
    through requests; its session factory gets urllib3 connections that connect through the same guard."""
    import requests

    server = Server("127.0.0.1", location=f"http://127.0.0.2:{listener.port}/a.tar.gz")
    port = server.httpd.server_address[1]
    proxy = Server("127.0.0.2")  # answers everything with "ok"
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)  # not used: trust_env is off
    try:
        strict = guarded_requests_session(FetchGuard(FetchRules(allow_http=True), what="adapters"))
        with pytest.raises(FetchRefusedError, match="127.0.0.1 is a loopback address"):
            strict.get(f"{server.url}/a")
        with pytest.raises(FetchRefusedError, match="plain http:// is refused"):
            guarded_requests_session(FetchGuard(FetchRules(), what="adapters")).get(f"{server.url}/a")
        allowed = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters")
        assert guarded_requests_session(allowed).get(f"{server.url}/a").text == "ok"
        with pytest.raises(FetchRefusedError, match="the redirect to 127.0.0.2: 127.0.0.2 is a loopback address"):
            guarded_requests_session(allowed).get(f"{server.url}/redirect")
        answers = iter([["127.0.0.1"], ["127.0.0.2"]])
        rebinding = FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters",
                               resolver=lambda host, p: next(answers))
        session = guarded_requests_session(rebinding)
        assert session.get(f"http://rebind.example:{port}/first").text == "ok"
        with pytest.raises(FetchRefusedError, match="rebind.example resolves to a loopback address"):
            session.get(f"http://rebind.example:{port}/second")
        assert server.requests == [("127.0.0.1", "/a"), ("127.0.0.1", "/redirect"), ("127.0.0.1", "/first")]
        assert not listener.connected() and proxy.requests == []
        with pytest.raises(requests.ConnectionError, match="cannot resolve"):
            guarded_requests_session(FetchGuard(FetchRules(), what="adapters", resolver=_unresolvable)).get(
                "https://nowhere.example/")
    finally:
        server.close()
        proxy.close()


def test_a_guarded_requests_session_keeps_no_connection_for_a_later_guard() -> None:
    """One session (huggingface_hub 0.x keeps one per thread) to a keep-alive (HTTP/1.1) server: a request under
    open rules, then one under rules that refuse the address. The second gets a connection of its own, and is
    refused at that connection; with the first connection kept, it would have been sent unchecked."""
    from tests.hub_server import FakeHub

    guards = [FetchGuard(FetchRules(allow_http=True, allow_networks=LOCAL), what="adapters")]
    session = guarded_requests_session(lambda: guards[-1])
    with FakeHub() as hub:
        assert session.get(f"{hub.url}/api/models/me/none").status_code == 401  # answered, on a kept-alive socket
        guards.append(FetchGuard(FetchRules(allow_http=True), what="adapters"))
        with pytest.raises(FetchRefusedError, match="127.0.0.1 is a loopback address"):
            session.get(f"{hub.url}/api/models/me/other")
        assert [path for _, path, _ in hub.requests] == ["/api/models/me/none"]


def test_a_guarded_requests_session_trusts_ssl_cert_file_as_the_httpx_fetches_do(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A TLS server whose certificate only SSL_CERT_FILE holds, with REQUESTS_CA_BUNDLE naming another bundle (as on
    machines that set both): requests alone would verify with REQUESTS_CA_BUNDLE and fail; the guarded session, like
    httpx, trusts SSL_CERT_FILE."""
    import ssl
    import subprocess

    def certificate(folder: Path) -> tuple[Path, Path]:  # self-signed for 127.0.0.1 (openssl)
        folder.mkdir()
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(folder / "key.pem"),
                        "-out", str(folder / "cert.pem"), "-days", "2", "-subj", "/CN=cog-triton test",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        return folder / "cert.pem", folder / "key.pem"

    cert, key = certificate(tmp_path / "server")
    other, _ = certificate(tmp_path / "other")
    server = Server("127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    for name in ("SSL_CERT_DIR", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    url = f"https://127.0.0.1:{server.httpd.server_address[1]}/a"
    guard = FetchGuard(FetchRules(allow_networks=LOCAL), what="adapters")
    try:
        assert guarded_requests_session(guard).get(url).text == "ok"
        monkeypatch.delenv("SSL_CERT_FILE")  # then requests' own variable: the other bundle, which fails
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            guarded_requests_session(guard).get(url)
    finally:
        server.close()


def _unresolvable(host: str, port: int) -> list[str]:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_each_huggingface_hub_generation_gets_its_guarded_client(listener: Listener, hub_online: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatch of fetch_guard._install: 2.x (installed here) takes an httpx2 client factory; 0.x's
    ``configure_http_backend`` (huggingface_hub 0.x's API, stood in for by a namespace: that version is not
    installed here) takes a requests session factory whose sessions follow the calling thread's guard; a
    huggingface_hub with neither is refused."""
    import types

    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    from cog_triton.fetch.guard import _install

    factories: list = []
    old = types.SimpleNamespace(__version__="0.36.0", constants=types.SimpleNamespace(),
                                configure_http_backend=lambda backend_factory: factories.append(backend_factory))
    assert _install(old) == "requests" and old.constants.HF_HUB_DISABLE_XET is True
    url = f"http://127.0.0.2:{listener.port}/x"
    with hub_guard(FetchRules(allow_http=True), "adapters"):
        with pytest.raises(FetchRefusedError, match="127.0.0.2 is a loopback address"):
            factories[0]().get(url)
    with pytest.raises(FetchRefusedError, match="plain http:// is refused; Hub downloads"):  # outside: the default
        factories[0]().get(url)
    monkeypatch.setattr(hub_online, "HF_HUB_OFFLINE", True)  # 0.x's default factory mounts its OfflineAdapter
    with hub_guard(FetchRules(allow_http=True), "adapters"), pytest.raises(OfflineModeIsEnabled, match="offline"):
        factories[0]().get(url)
    monkeypatch.setattr(hub_online, "HF_HUB_OFFLINE", False)
    assert not listener.connected()
    assert _install(huggingface_hub) == "httpx2"
    with pytest.raises(FetchRefusedError, match="huggingface_hub 0.1.0 cannot be given a guarded HTTP client"):
        _install(types.SimpleNamespace(__version__="0.1.0", constants=types.SimpleNamespace()))


# --- the HTTP clients' internals the guard relies on --------------------------------------------------------------


def test_the_http_client_internals_the_guard_relies_on_are_there() -> None:
    """cog_triton.fetch.guard reaches three places no public API offers (an upgrade that moves one fails here first,
    naming it, rather than as a fetch that is no longer checked):

    * httpx's (and httpx2's) ``HTTPTransport`` sends every request through its ``_pool`` (httpx 0.28.1
      ``httpx/_transports/default.py``), which the guarded transport replaces by a pool on the guarded backend;
    * urllib3's connections make their socket in ``_new_conn`` from ``_dns_host`` and ``port``, and ``connect``
      calls it before wrapping TLS around it (urllib3 2.x ``urllib3/connection.py``); ``getresponse`` returns the
      response the deadline may replace;
    * urllib3's pools pick their connection class from ``ConnectionCls``, and a ``PoolManager`` its pool classes
      from ``pool_classes_by_scheme`` (``urllib3/poolmanager.py``)."""
    import inspect

    import httpx2
    from urllib3 import connection, connectionpool, poolmanager

    for module in (httpx, httpx2):
        assert "_pool" in vars(module.HTTPTransport()), module.__name__
        assert "self._pool.handle_request(" in inspect.getsource(module.HTTPTransport.handle_request), module.__name__
    plain = connection.HTTPConnection("example.com", 80)
    assert (plain._dns_host, plain.port) == ("example.com", 80)
    for cls in (connection.HTTPConnection, connection.HTTPSConnection):
        assert callable(cls._new_conn) and callable(cls.getresponse)
        assert "self._new_conn()" in inspect.getsource(cls.connect), cls.__name__
    assert connectionpool.HTTPSConnectionPool.ConnectionCls is connection.HTTPSConnection
    assert set(poolmanager.PoolManager().pool_classes_by_scheme) == {"http", "https"}
