"""Settings of what a prediction's inputs may make the server do: fetch a URL (the fetch rules) and carry images."""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from cog_triton.settings.base import Group


class FetchSettings(Group):
    """Where inputs (lora_weights, cog train's checkpoint) may make the server fetch from
    (cog_triton/fetch/rules.py)."""

    allow_http: bool = Field(
        default=False, validation_alias="fetch_allow_http",
        description="Let inputs fetch over plain http://; by default only https:// (each redirect "
        "included)."
    )
    allow_private: bool = Field(
        default=False, validation_alias="fetch_allow_private",
        description="Let inputs fetch from every address: loopback, private networks, link-local "
        "(the cloud instance metadata service 169.254.169.254 included) and other non-public ones; by default only "
        "public addresses, checked on the address connected to. For tests; prefer COG_TRITON_FETCH_ALLOW_NETWORKS."
    )
    allow_networks: str = Field(
        default="", validation_alias="fetch_allow_networks",
        description="Comma-separated networks (CIDR, e.g. 10.1.2.0/24,fd00:1::/64) inputs may fetch "
        "from although they are not public (a private mirror)."
    )
    allow_hosts: str = Field(
        default="", validation_alias="fetch_allow_hosts",
        description="Comma-separated hosts URLs in inputs may fetch from, each redirect included: "
        "names or IP addresses, *.example.com for its subdomains; empty: any host."
    )
    allow_hf_owners: str = Field(
        default="", validation_alias="fetch_allow_hf_owners",
        description="Comma-separated Hugging Face Hub users or organizations whose repositories hf:// "
        "references (and cog train's Hub ids) may name; empty: any."
    )

    @field_validator("allow_networks", "allow_hosts", "allow_hf_owners")
    @classmethod
    def _check_lists(cls, value: str, info: ValidationInfo) -> str:
        from cog_triton.fetch.rules import parse_hosts, parse_networks, parse_owners  # noqa: PLC0415

        parse = {"allow_networks": parse_networks, "allow_hosts": parse_hosts,
                 "allow_hf_owners": parse_owners}[info.field_name]
        return ",".join(str(item) for item in parse(value))


class ImageSettings(Group):
    """Images in predictions (image_input, image parts of messages) on the PyTorch backend: how many, how large, and
    how long an image URL may take (cog_triton/streaming/images.py)."""

    enabled: bool = Field(
        default=True, validation_alias="images",
        description="Accept images (image_input, image parts of messages) on a checkpoint whose architecture "
        "TensorRT-LLM 1.2.1 serves with images; false refuses every prediction that gives one, saying so."
    )
    max_count: int = Field(
        default=8, ge=1, le=64, validation_alias="image_max_count",
        description="Most images one prediction may carry (image_input and image parts together)."
    )
    max_pixels: int = Field(
        default=4096 * 4096, ge=1, le=1 << 30, validation_alias="image_max_pixels",
        description="Most pixels (width x height) an image may have, checked from its header before it is "
        "decoded (a decompression bomb is refused unread)."
    )
    max_bytes: int = Field(
        default=20 << 20, ge=1, le=1 << 30, validation_alias="image_max_bytes",
        description="Most bytes one image file may have (a data URI's decoded bytes; an image URL's download)."
    )
    fetch_deadline_s: float = Field(
        default=30.0, gt=0, le=3600, validation_alias="image_fetch_deadline_s",
        description="Deadline of fetching a prediction's image URLs (image parts of messages), all of them "
        "together, enforced from outside the reads (seconds)."
    )
