"""A local stand-in of the Hugging Face Hub for tests (the Hub cannot be reached from the test machines).

It answers the requests huggingface_hub 2.4.0 makes for ``hf_hub_download`` and ``snapshot_download``, as the
Hub answers them (read in ``.venv/lib/python3.11/site-packages/huggingface_hub``):

* ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{revision}`` (``HfApi.model_info``,
  ``hf_api.py``): JSON with ``id``, ``sha`` (the commit), ``private``, ``gated``, ``siblings``. A gated
  repository's metadata is public, as on the Hub.
* ``GET /api/models/{repo}/tree/{revision}?recursive=True`` (``HfApi.list_repo_tree``): a JSON list of
  ``{"type": "file", "path", "size", "oid", "lfs"?}`` and ``{"type": "directory", ...}`` entries (``RepoFile`` /
  ``RepoFolder``), on one page (the ``Link: rel="next"`` pagination of ``utils/_pagination.py`` is not needed
  below 1000 entries).
* ``HEAD`` / ``GET /{repo}/resolve/{revision}/{path}`` (``file_download.py`` ``get_hf_file_metadata`` and
  ``http_get``): ``X-Repo-Commit`` (required: ``FileMetadataError`` without it), ``ETag`` (the file's sha256 for
  ``*.safetensors``, as for LFS files; a sha1 otherwise), ``Content-Length``; ``Range`` requests get 206.
* Errors as ``utils/_http.py`` ``hf_raise_for_status`` maps them, with ``X-Error-Code`` / ``X-Error-Message``:
  an unknown repository or a private one without a valid token: 401 (no token) or 404 (a token),
  ``RepoNotFound``; an unknown revision: 404 ``RevisionNotFound``; a missing file: 404 ``EntryNotFound`` (with
  ``X-Repo-Commit``); a gated repository's files: 401 ``GatedRepo`` without a token, 403 ``GatedRepo`` with a
  token that has no access.

Use it in process (``with FakeHub() as hub: hub.use(monkeypatch)`` points huggingface_hub at it) or for a
subprocess such as the real Cog server (``env={**hub.env(), ...}``: ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE=0``).
Files are served from disk as they are (no copy), so a real checkpoint folder can be served
(:meth:`FakeHub.add_folder`, e.g. ``build/default_model/checkpoint``).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union
from urllib.parse import parse_qs, unquote, urlsplit

Content = Union[bytes, Path]
CHUNK = 1 << 20


@dataclass
class HubRepo:
    """One repository: its files (bytes, or a file on disk), its revisions (name -> commit) and its access."""

    repo_id: str
    files: dict[str, Content]
    revisions: dict[str, str]
    gated: Union[bool, str] = False
    private: bool = False
    #: Every commit the repository has had: a commit stays fetchable when a branch or tag moves off it.
    commits: set[str] = field(default_factory=set)
    _digests: dict[str, tuple[str, str]] = field(default_factory=dict)

    def size(self, path: str) -> int:
        content = self.files[path]
        return len(content) if isinstance(content, bytes) else content.stat().st_size

    def digests(self, path: str) -> tuple[str, str]:
        """(sha1 "oid", sha256) of a file, computed once."""
        if path not in self._digests:
            sha1, sha256 = hashlib.sha1(), hashlib.sha256()
            content = self.files[path]
            if isinstance(content, bytes):
                sha1.update(content)
                sha256.update(content)
            else:
                with open(content, "rb") as fh:
                    while chunk := fh.read(CHUNK):
                        sha1.update(chunk)
                        sha256.update(chunk)
            self._digests[path] = (sha1.hexdigest(), sha256.hexdigest())
        return self._digests[path]


def commit_of(repo_id: str, revision: str) -> str:
    """A stable 40-hex commit id for ``repo_id`` at ``revision``."""
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


class FakeHub:
    """The stand-in Hub on ``http://127.0.0.1:<port>`` (see the module docstring).

    Args:
        token: the one token the stand-in accepts (``Authorization: Bearer <token>``); it grants every private
            repository and the gated repositories listed in ``granted``.

    Attributes:
        requests: ``(method, path, authorization header or None)`` of every request, in order.
        gets: ``(repo_id, revision, path)`` of every file body served (GET on resolve).
    """

    def __init__(self, token: Optional[str] = None) -> None:
        self.token = token
        self.granted: set[str] = set()
        #: (repo_id, path) whose GET (not its HEAD) answers 404 EntryNotFound: a fetch that fails midway.
        self.fail_get: set[tuple[str, str]] = set()
        #: Called with (method, path) of each request; an answer it returns, (status, headers), is sent instead of
        #: the Hub's (a server error, an answer that is not a Hub's); None: the Hub answers.
        self.intercept: Optional[Callable[[str, str], Optional[tuple[int, dict[str, str]]]]] = None
        #: Called with the repo id after each model_info answer (e.g. to move a branch while a fetch runs).
        self.after_model_info: Optional[Callable[[str], None]] = None
        #: When set, the Hub's files in LFS (``*.safetensors``) answer HEAD and GET on resolve as the Hub does: a 302
        #: to a signed URL of its file CDN, ``http://localhost:<port>/cdn/...?X-Amz-Credential=...&X-Amz-Signature=
        #: <cdn_secret>`` (another host than the Hub's 127.0.0.1, so huggingface_hub does not follow it for the
        #: metadata: ``utils/_http.py`` ``_httpx2_follow_hub_redirects_with_backoff``), with ``X-Linked-Size`` and
        #: ``X-Linked-Etag``; the CDN URL serves the file.
        self.cdn_secret: Optional[str] = None
        #: Where the signed CDN URLs point (scheme://host[:port], e.g. a name whose addresses drop connections);
        #: None: this server, as ``http://localhost:<port>``. ``cdn_for``: the same for one repository.
        self.cdn_base: Optional[str] = None
        self.cdn_for: dict[str, str] = {}
        #: When set, (status, content type, body) the CDN path answers instead of the file, as a CDN refusing a
        #: signed URL does: S3's ``SignatureDoesNotMatch`` 403 (XML) echoes the signature it was given and the
        #: canonical request with the query string (docs.aws.amazon.com, "REST Authentication ... Troubleshooting").
        self.cdn_error: Optional[tuple[int, str, bytes]] = None
        #: The requests that reached the CDN path: (method, path with its query string).
        self.cdn_requests: list[tuple[str, str]] = []
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[tuple[str, str, Optional[str]]] = []
        self.gets: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            owner = hub

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() returns once serve_forever's loop looks again: every 0.05 s, not the default 0.5 s
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-hub", daemon=True)

    # --- setup ---------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, Content], *, revisions: tuple[str, ...] = ("main",),
                 gated: Union[bool, str] = False, private: bool = False) -> str:
        """Serve ``files`` (path in the repository -> bytes or a file on disk) as ``repo_id``; return the commit of
        its first revision (each revision gets its own commit id, all with the same files)."""
        refs = {r: commit_of(repo_id, r) for r in revisions}
        self.repos[repo_id] = HubRepo(repo_id, dict(files), refs, gated=gated, private=private, commits=set(refs.values()))
        return commit_of(repo_id, revisions[0])

    def add_folder(self, repo_id: str, folder: Path, **kwargs: object) -> str:
        """Serve every file under ``folder`` (recursively) as ``repo_id``; see :meth:`add_repo`."""
        files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        return self.add_repo(repo_id, files, **kwargs)  # type: ignore[arg-type]

    # --- use -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def env(self) -> dict[str, str]:
        """The environment a subprocess needs to use this Hub through huggingface_hub."""
        return {"HF_ENDPOINT": self.url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0",
                "HF_HUB_DISABLE_XET": "1"}

    def use(self, monkeypatch) -> None:  # noqa: ANN001 - pytest's MonkeyPatch
        """Point this process's huggingface_hub at the stand-in (its constants are read at import, so they are
        patched too) and allow it online (the test suite sets HF_HUB_OFFLINE=1)."""
        import huggingface_hub.constants as constants  # noqa: PLC0415

        for key, value in self.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(constants, "ENDPOINT", self.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", self.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        # huggingface_hub 0.x's file_download binds the URL template at import (``from .constants import
        # HUGGINGFACE_CO_URL_TEMPLATE``, 0.36.0 ``file_download.py``; ``hf_hub_url`` formats it); 1.x+ read it from
        # ``constants`` per call.
        import huggingface_hub.file_download as file_download  # noqa: PLC0415

        if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):
            monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", constants.HUGGINGFACE_CO_URL_TEMPLATE)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- access --------------------------------------------------------------------------------
    def access(self, repo: HubRepo, authorization: Optional[str], files: bool) -> Optional[tuple[int, str, str]]:
        """None when allowed, else (status, X-Error-Code, X-Error-Message) as the Hub answers."""
        valid = self.token is not None and authorization == f"Bearer {self.token}"
        if repo.private and not valid:
            return (404 if authorization else 401), "RepoNotFound", "Repository not found"
        if repo.gated and files and not (valid and repo.repo_id in self.granted):
            if authorization is None:
                return 401, "GatedRepo", (f"Access to model {repo.repo_id} is restricted. You must have access to it "
                                          "and be authenticated to access it. Please log in.")
            return 403, "GatedRepo", (f"Access to model {repo.repo_id} is restricted and you are not in the "
                                      "authorized list. Visit the repository to ask for access.")
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._route(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(body=False)

    # --- helpers -------------------------------------------------------------------------------
    def _send(self, status: int, headers: dict[str, str], body: bytes = b"", send_body: bool = True) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, send_body: bool, commit: Optional[str] = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, headers, json.dumps({"error": message}).encode(), send_body)

    def _json(self, data: object, send_body: bool) -> None:
        self._send(200, {"Content-Type": "application/json"}, json.dumps(data).encode(), send_body)

    def _repo(self, parts: list[str], send_body: bool) -> Optional[HubRepo]:
        repo_id = "/".join(parts[:2])
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            auth = self.headers.get("Authorization")
            self._error(404 if auth else 401, "RepoNotFound", "Repository not found", send_body)
        return repo

    def _commit(self, repo: HubRepo, revision: str, send_body: bool) -> Optional[str]:
        if revision in repo.revisions:
            return repo.revisions[revision]
        if revision in repo.commits:
            return revision
        self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", send_body)
        return None

    def _route(self, body: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        auth = self.headers.get("Authorization")
        with self.owner._lock:
            self.owner.requests.append((self.command, url.path, auth))
        answer = self.owner.intercept(self.command, url.path) if self.owner.intercept is not None else None
        if answer is not None:
            status, headers = answer
            self._send(status, headers, b"{}", body)
            return
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            self._api(parts[2:], parse_qs(url.query), body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(parts, body)
        elif len(parts) >= 5 and parts[0] == "cdn":
            with self.owner._lock:
                self.owner.cdn_requests.append((self.command, self.path))
            if self.owner.cdn_error is not None:
                status, content_type, text = self.owner.cdn_error
                self._send(status, {"Content-Type": content_type}, text, body)
                return
            self._resolve([parts[1], parts[2], "resolve", *parts[3:]], body, cdn=True)
        else:
            self._error(404, "EntryNotFound", f"no route {url.path}", body)

    def _api(self, parts: list[str], query: dict[str, list[str]], body: bool) -> None:
        repo = self._repo(parts, body)
        if repo is None:
            return
        denied = self.owner.access(repo, self.headers.get("Authorization"), files=False)
        if denied:
            self._error(*denied, body)
            return
        rest = parts[2:]
        if not rest or rest[0] == "revision":
            revision = "/".join(rest[1:]) if rest else "main"
            commit = self._commit(repo, revision, body)
            if commit is None:
                return
            self._json({
                "id": repo.repo_id, "modelId": repo.repo_id, "sha": commit, "private": repo.private,
                "gated": repo.gated, "disabled": False, "siblings": [{"rfilename": p} for p in sorted(repo.files)],
            }, body)
            if self.owner.after_model_info is not None:
                self.owner.after_model_info(repo.repo_id)
        elif rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit(repo, rest[1], body)
            if commit is None:
                return
            entries: list[dict[str, object]] = []
            folders = sorted({"/".join(p.split("/")[:i]) for p in repo.files for i in range(1, p.count("/") + 1)})
            for folder in folders:
                entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                                "path": folder})
            for path in sorted(repo.files):
                sha1, sha256 = repo.digests(path)
                entry: dict[str, object] = {"type": "file", "oid": sha1, "size": repo.size(path), "path": path}
                if path.endswith(".safetensors"):
                    entry["lfs"] = {"oid": sha256, "size": repo.size(path), "pointerSize": 134}
                entries.append(entry)
            self._json(entries, body)
        else:
            self._error(404, "EntryNotFound", f"no route {'/'.join(parts)}", body)

    def _resolve(self, parts: list[str], body: bool, cdn: bool = False) -> None:
        repo = self._repo(parts, body)
        if repo is None:
            return
        revision, path = parts[3], "/".join(parts[4:])
        commit = self._commit(repo, revision, body)
        if commit is None:
            return
        denied = self.owner.access(repo, self.headers.get("Authorization"), files=True)
        if denied:
            self._error(*denied, body)
            return
        if path not in repo.files or (body and (repo.repo_id, path) in self.owner.fail_get):
            self._error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", body, commit=commit)
            return
        sha1, sha256 = repo.digests(path)
        size = repo.size(path)
        if self.owner.cdn_secret and path.endswith(".safetensors") and not cdn:
            base = (self.owner.cdn_for.get(repo.repo_id) or self.owner.cdn_base
                    or f"http://localhost:{self.server.server_address[1]}")
            location = (f"{base}/cdn/{repo.repo_id}/{commit}/{path}?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                        f"&X-Amz-Credential=AKIAFAKEHUB%2F20260101&X-Amz-Signature={self.owner.cdn_secret}")
            self._send(302, {"Location": location, "X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha256}"',
                             "X-Linked-Size": str(size)}, b"", body)
            return
        start, end, status = 0, size - 1, 200
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start = int(first or 0)
            end = min(int(last), size - 1) if last else size - 1
            status = 206
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{sha256 if path.endswith(".safetensors") else sha1}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if not body:
            return
        with self.owner._lock:
            self.owner.gets.append((repo.repo_id, revision, path))

        content = repo.files[path]
        if isinstance(content, bytes):
            self.wfile.write(content[start:end + 1])
            return
        with open(content, "rb") as fh:
            fh.seek(start)
            left = end - start + 1
            while left > 0 and (chunk := fh.read(min(CHUNK, left))):
                self.wfile.write(chunk)
                left -= len(chunk)


def s3_signature_refusal(signature: str, credential: str = "AKIAFAKEHUB") -> tuple[int, str, bytes]:
    """What S3 answers a presigned URL whose signature does not match (``FakeHub.cdn_error``): 403 and an XML body
    that echoes the request's credential, the signature provided and the canonical request with its query string
    ("The error response includes the canonical request and the string to sign that the service calculated",
    docs.aws.amazon.com/IAM/latest/UserGuide/signature-v4-troubleshooting.html), not HTML, so huggingface_hub
    appends it to its error message (``utils/_http.py`` ``_format``, 0.36.0 and 2.4.0)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>The request '
        "signature we calculated does not match the signature you provided. Check your key and signing method."
        f"</Message><AWSAccessKeyId>{credential}</AWSAccessKeyId><StringToSign>AWS4-HMAC-SHA256\n20260101T000000Z"
        f"</StringToSign><SignatureProvided>{signature}</SignatureProvided><CanonicalRequest>GET\n/cdn/file\n"
        f"X-Amz-Algorithm=AWS4-HMAC-SHA256&amp;X-Amz-Credential={credential}%2F20260101&amp;X-Amz-SignedHeaders=host"
        "\nhost:cdn</CanonicalRequest></Error>"
    )
    return 403, "application/xml", body.encode()


def tiny_checkpoint(architecture: str = "LlamaForCausalLM", **config: object) -> dict[str, bytes]:
    """The files of a small Hugging Face checkpoint (a config.json with ``config`` merged in, one safetensors
    file holding one tensor, a tokenizer_config.json): enough for the fetch and inspection, not for inference."""
    base = {
        "architectures": [architecture], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16",
    }
    base.update(config)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    safetensors = len(header).to_bytes(8, "little") + header + b"\0" * 8
    return {
        "config.json": json.dumps(base).encode(),
        "model.safetensors": safetensors,
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}).encode(),
        "tokenizer_config.json": b"{}",
    }


__all__ = ("FakeHub", "HubRepo", "commit_of", "s3_signature_refusal", "tiny_checkpoint")
