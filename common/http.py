"""One SSL context for the process's one-shot httpx requests.

httpx builds a new :class:`ssl.SSLContext` for every client it makes, and so for every top-level call
(``httpx.get``, ``httpx.post``, ``httpx.stream``): it loads certifi's CA bundle even when the URL is plain
``http://`` on the loopback. On the 2-core development machine (httpx 0.28.1) that is about 70 CPU-ms of
a 75 CPU-ms ``httpx.get`` of a small loopback document, against about 4 CPU-ms with this context passed as
``verify=``. A readiness poll every 0.1 s paid it ten times a second, and a Prometheus scrape once each.

:func:`default_ssl_context` is the context httpx makes by default (``httpx.create_ssl_context()``: certifi's
bundle, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), made once per process; an :class:`ssl.SSLContext` may be
shared by threads. Clients that are kept (``httpx.Client``) make theirs once and need none of this.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.lru_cache(maxsize=None)
def default_ssl_context() -> ssl.SSLContext:
    """httpx's default SSL context, made on the first call and the same object after (see the module docstring)."""
    return httpx.create_ssl_context()
