"""Settings of the predictor itself: its concurrency and its self-test."""

from __future__ import annotations

from pydantic import Field

from cog_triton.settings.base import Group


#: predict.py's ``@cog.concurrent(max=...)`` and the Dockerfile's COG_MAX_CONCURRENCY (tests keep them equal).
DEFAULT_CONCURRENCY = 64


class PredictorSettings(Group):
    """The predictor itself: its concurrency and its self-test."""

    self_test: bool = Field(default=True, description="Generate a few tokens at the end of setup().")
    max_concurrency: int = Field(
        default=DEFAULT_CONCURRENCY,
        ge=1,
        le=1024,
        description="Predictions served at once; default: Cog's COG_MAX_CONCURRENCY (predict.py's @cog.concurrent).",
    )
