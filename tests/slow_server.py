"""Servers that hold a fetch: a real TCP server on 127.0.0.1 (plain or TLS) whose every connection is held the way
an attacker's would be, and which records who hung up first. For the deadline tests (tests/test_fetch_deadline.py,
tests/test_fetch_rules_integration.py).

Modes:

* ``headers``: reads the request head, answers ``HTTP/1.1 200 OK`` and then one byte of a response header every
  ``interval_s``, for ever (within h11's 16 KiB header limit);
* ``body``: a complete head announcing 1 GB, then one byte of body every ``interval_s``;
* ``silent``: accepts and says nothing (a TLS handshake or a response that never comes).

Each connection is held for ``hold_s`` at most; :attr:`SlowServer.ended` records, per connection, ``"client"`` when
the client hung up first (the server read end-of-file or a send failed while it still held it) and ``"server"``
when the server gave up first. A fetch ended by its own deadline leaves ``"client"``; one held until the server let
go leaves ``"server"``.
"""

from __future__ import annotations

import select
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, 127.0.0.2 and localhost (openssl), and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=cog-triton test",
         "-addext", "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,DNS:localhost"],
        check=True, capture_output=True,
    )
    return cert, key


class SlowServer:
    """See the module docstring. ``tls``: (certificate, key) to answer over TLS (the handshake completes, then the
    mode's behaviour); ``hold_s``: how long the server holds each connection at most (seconds)."""

    def __init__(self, mode: str = "headers", *, interval_s: float = 0.1, hold_s: float = 60.0,
                 tls: Optional[tuple[Path, Path]] = None, host: str = "127.0.0.1") -> None:
        if mode not in ("headers", "body", "silent"):
            raise ValueError(mode)
        self.mode, self.interval_s, self.hold_s = mode, interval_s, hold_s
        self._context: Optional[ssl.SSLContext] = None
        if tls:
            self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._context.load_cert_chain(*tls)
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        self.accepted = 0
        self.ended: list[str] = []
        self.sent: list[int] = []  # bytes sent on each connection that ended
        self._changed = threading.Condition()
        self._closing = threading.Event()
        threading.Thread(target=self._accept, name="slow-server", daemon=True).start()

    def __enter__(self) -> "SlowServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        self._listener.close()

    def wait(self, accepted: int = 0, ended: int = 0, timeout_s: float = 120.0) -> bool:
        """Wait until at least ``accepted`` connections were accepted and ``ended`` have ended (the bound only means
        "not hung"); True when they have."""
        with self._changed:
            return self._changed.wait_for(lambda: self.accepted >= accepted and len(self.ended) >= ended, timeout_s)

    def open_now(self) -> int:
        """Connections accepted and still held."""
        with self._changed:
            return self.accepted - len(self.ended)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._changed:
                self.accepted += 1
                self._changed.notify_all()
            threading.Thread(target=self._hold, args=(sock,), daemon=True).start()

    def _hold(self, sock: socket.socket) -> None:
        until = time.monotonic() + self.hold_s
        who, sent = "server", 0
        try:
            if self._context is not None and self.mode != "silent":
                sock.settimeout(10)
                sock = self._context.wrap_socket(sock, server_side=True)
            sock.settimeout(None)
            if self.mode != "silent":
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = sock.recv(4096)
                    if not chunk:
                        who = "client"
                        return
                    head += chunk
                first = (b"HTTP/1.1 200 OK\r\nX-Drip: " if self.mode == "headers" else
                         b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                sock.sendall(first)
                sent += len(first)
            while time.monotonic() < until and not self._closing.is_set():
                pending = sock.pending() if isinstance(sock, ssl.SSLSocket) else 0
                readable, _, _ = select.select([sock], [], [], self.interval_s) if not pending else ([sock], [], [])
                if readable:
                    data = sock.recv(4096)
                    if not data:
                        who = "client"
                        return
                    continue  # a silent server ignores what it is sent (a TLS ClientHello)
                if self.mode != "silent":
                    sock.sendall(b"a")
                    sent += 1
        except (OSError, ssl.SSLError):
            who = "client"
        finally:
            try:
                sock.close()
            except OSError:
                pass
            with self._changed:
                self.ended.append(who)
                self.sent.append(sent)
                self._changed.notify_all()
