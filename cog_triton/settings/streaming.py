"""Settings of the stream processes: how prompts are tokenized, how many processes, and the stream interval."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from pydantic import Field, field_validator

from cog_triton.settings.base import Group


#: The stream interval's default, ms (README "Performance" has the GPU-host figures behind it).
DEFAULT_STREAM_INTERVAL_MS = 50.0


class TokenizerSettings(Group):
    """The tokenizer, and how prompts are tokenized."""

    dir: Optional[Path] = Field(
        default=None, validation_alias="tokenizer_dir",
        description="Tokenizer folder; default: weights_dir/tokenizer if present, else weights_dir."
    )
    add_special_tokens: Optional[bool] = Field(
        default=None,
        description="Add the tokenizer's special tokens (BOS) to every prompt (true) or to none (false); "
        "default: decided per request (cog_triton.streaming.prompt): not with the chat template, which writes its own, "
        "and with a prompt_template or plain prompt unless it already starts with the BOS token.",
    )
    special_tokens_in_user_text: bool = Field(
        default=False,
        description="Tokenize special-token strings in the prompt and system prompt as the control tokens they "
        "name; by default they stay text, so a user cannot open a system turn.",
    )


class StreamSettings(Group):
    """Streaming: the stream processes that do the per-token work, and the stream interval."""

    processes: Optional[int] = Field(
        default=None,
        ge=1,
        le=64,
        validation_alias="stream_processes",
        description="Processes that do the per-token work (gRPC receive, detokenizing, stop sequences) beside the "
        "Cog worker, 1 to 64; default: one per 5 CPUs of this container, 1 to 8.",
    )
    interval_ms: float = Field(
        default=DEFAULT_STREAM_INTERVAL_MS,
        ge=0,
        le=1000,
        validation_alias="stream_interval_ms",
        description="Stream interval: a prediction's text leaves at most every this many milliseconds (the first "
        "text at once); 0 = every token's text as it comes.",
    )
    interval_streams: int = Field(
        default=64,
        ge=0,
        le=100000,
        validation_alias="stream_interval_streams",
        description="Running predictions the stream interval serves; beyond, the interval grows in proportion to them "
        "(up to COG_TRITON_STREAM_INTERVAL_MAX_MS), so that the Cog worker relays about as many chunks per second "
        "and new predictions' first text is not held up behind them; 0 = never grows.",
    )
    interval_max_ms: float = Field(
        default=200.0,
        ge=0,
        le=1000,
        validation_alias="stream_interval_max_ms",
        description="The longest stream interval under load, milliseconds (at or below COG_TRITON_STREAM_INTERVAL_MS: "
        "it never grows).",
    )
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for the next streamed token before failing."
    )

    @field_validator("processes", mode="before")
    @classmethod
    def _no_in_process_mode(cls, value: object) -> object:
        """0 once ran the per-token work in the Cog worker itself; that second pipeline was removed (one GIL, and
        on 2 cores it cost as much CPU per token as one stream process: docs/architecture.md)."""
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).strip() in ("0", "-0", "+0"):
            raise ValueError(
                "0 (the per-token work in the Cog worker) is no longer offered: every prediction is streamed by a "
                "stream process; set 1 to 64, or leave it unset for one per 5 CPUs"
            )
        return value

    def process_count(self, cpus: Optional[int] = None) -> int:
        """``processes``, or by default one per 5 CPUs this process may run on (``cpus``, else its affinity), 1 to 8.

        Fewer, busier processes cost less CPU per token than many idle ones: each gRPC response wakes a
        process's poller thread and event loop, and a busy process handles several per wake-up (16-core
        GPU host, 128 streams: 2 processes 176 µs of CPU per token, 4 processes 226; README, Performance).
        """
        if self.processes is not None:
            return self.processes
        if cpus is not None:
            return max(1, min(8, cpus // 5))
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        return max(1, min(8, cpus // 5))
