"""The ``lora_weights`` input: which references name an adapter (cheap checks, run in the Cog worker).

Accepted:

* ``https://...`` / ``http://...``: a ``.tar``, ``.tar.gz`` (``.tgz``) or ``.zip`` archive holding a Hugging Face
  PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors``, at the top or in one folder);
* ``hf://owner/repo`` or ``hf://owner/repo@revision``: a Hugging Face Hub repository holding those two files,
  resolved with ``huggingface_hub`` (``HF_TOKEN`` is used for private repositories).

Local paths and ``file://`` URLs are refused: the input comes from API users, who must not read files of the
server. The URL is split by the HTTP client's own parser: one it cannot parse is refused here, by name and without
its text (a password with an unencoded ``/`` makes the rest of it a port); the URL's credentials, query string
and fragment never appear in messages (:func:`cog_triton.fetch.redaction.redact_url`).
Where an accepted reference may be fetched from is up to the fetch rules (:mod:`cog_triton.fetch.rules`):
:func:`check_adapter_allowed` applies what can be judged without a connection (adapters off, the scheme, the
host and Hub owner allow-lists, an IP-literal host); the addresses connected to are checked when fetching.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Optional

from common.errors import LoraAdapterError
from cog_triton.fetch.rules import FetchRules
from cog_triton.fetch.redaction import UnparsableURL, parse_url, redact_url

#: A Hub repository id (``owner/name``; huggingface_hub's validate_repo_id rules, without the length check).
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
ALLOWED = ("an https:// URL (http:// where the server allows it) of a .tar, .tar.gz or .zip archive of a PEFT "
           "LoRA adapter, or "
           "hf://owner/repo[@revision]")


@dataclass(frozen=True)
class AdapterRef:
    """A checked ``lora_weights`` value.

    Attributes:
        kind: "url" or "hf".
        source: the value as given (the URL with its query string, or the hf:// reference), for fetching.
        display: safe to log and to put in errors (no credentials, no query string).
        repo_id / revision: for hf:// (revision None: the default branch).
    """

    kind: str
    source: str
    display: str
    repo_id: str = ""
    revision: Optional[str] = None

    @property
    def key(self) -> str:
        """A file-name-safe key of the source (sha256 hex of the whole value, 40 characters)."""
        return hashlib.sha256(self.source.encode("utf-8", "surrogateescape")).hexdigest()[:40]


def parse_adapter_ref(value: str, name: str = "lora_weights") -> Optional[AdapterRef]:
    """The adapter ``value`` names, or None when it is empty (the base model).

    Raises:
        LoraAdapterError: not one of the accepted forms; the message shows the value (redacted) and what is allowed.
    """
    text = value.strip()
    if not text:
        return None
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in ("http", "https"):
        try:  # split as the HTTP client will split it (cog_triton.fetch.redaction)
            host = parse_url(text).host
        except UnparsableURL as exc:
            raise LoraAdapterError(exc.refusal(name)) from None
        if not host:
            raise LoraAdapterError(f"{name}={redact_url(text)!r} has no host; give {ALLOWED}")
        return AdapterRef("url", text, redact_url(text))
    if scheme == "hf":
        body = text[5:].strip("/")
        repo, _, revision = body.partition("@")
        if not _REPO_RE.match(repo) or (revision and not _REVISION_RE.match(revision)) or body.endswith("@"):
            raise LoraAdapterError(
                f"{name}={text!r} is not a Hugging Face reference of the form hf://owner/repo or "
                "hf://owner/repo@revision (a branch, tag or commit)"
            )
        return AdapterRef("hf", text, text, repo_id=repo, revision=revision or None)
    shown = redact_url(text) if scheme else text[:100]
    raise LoraAdapterError(f"{name}={shown!r} is not allowed; give {ALLOWED}")


#: The setting that turns the lora_weights input off.
ADAPTERS_SETTING = "COG_TRITON_LORA_ADAPTERS"
#: What the fetch rules' messages call what is fetched.
WHAT = "adapters"


def check_adapter_allowed(ref: AdapterRef, rules: FetchRules, enabled: bool = True, name: str = "lora_weights") -> None:
    """Refuse ``ref`` when adapters are off or the fetch rules refuse it without connecting (cheap: no DNS).

    Raises:
        LoraAdapterError: naming the value, the rule and the setting that allows it.
    """
    if not enabled:
        raise LoraAdapterError(
            f"{name} {ref.display} was given, but this server does not take LoRA adapters ({ADAPTERS_SETTING}=false); "
            "leave it empty to use the base model"
        )
    if ref.kind == "hf":
        refusal = rules.hf_owner_refusal(ref.repo_id, WHAT)
    else:
        refusal = rules.url_refusal(ref.source, WHAT)
    if refusal is not None:
        raise LoraAdapterError(f"{name} {ref.display} is refused: {refusal}")


__all__ = ("ADAPTERS_SETTING", "ALLOWED", "AdapterRef", "check_adapter_allowed", "parse_adapter_ref")
