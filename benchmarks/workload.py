"""What each path's requests are and what each must get back (expected token ids and text).

Part of ``scripts/benchmark`` (:mod:`benchmarks.harness`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional

from benchmarks.paths import (
    FLOOR_DIR,
    FLOOR_PATH,
    GUIDED_PATH,
    GUIDED_PROMPT,
    GUIDED_SCHEMA,
    LORA_PATH,
    PACED_ENGINES,
    PROMPT,
    STANDIN_DIR,
    STANDIN_TEXT,
)
from cog_triton.streaming.prompt import PromptTokenizer

log = logging.getLogger("benchmark")


class Workload:
    """The request bodies of each path and what each request must get back."""

    def __init__(self, args: argparse.Namespace) -> None:
        from transformers import AutoTokenizer  # noqa: PLC0415 - heavy

        self.args = args
        self.tokens = args.tokens
        checkpoint = args.archive.parent / "checkpoint"
        self.tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
        self.prompt_ids = PromptTokenizer(self.tokenizer).encode(PROMPT).ids
        self.end_id = int(self.tokenizer.eos_token_id)
        self.cycle: list[int] = []
        self.seeds: list[int] = [0]
        self.reference_ids: Optional[list[int]] = None
        if args.engine in PACED_ENGINES:
            standin = _standin_module()
            self.cycle = standin.text_token_ids(self.tokenizer, STANDIN_TEXT.read_text(encoding="utf-8"))
            # start offsets on whole characters, so that the text a request decodes to is well defined
            self.seeds = [i for i, t in enumerate(self.cycle) if "\ufffd" not in self.tokenizer.decode([t])]
        self._texts: dict[int, str] = {}
        self.adapter_urls: list[str] = []  # set once the stack serves them (the cog_lora path)

    def seed(self, index: int) -> int:
        return self.seeds[(index * 97) % len(self.seeds)]

    def expected_ids(self, seed: int) -> Optional[list[int]]:
        if self.args.engine in PACED_ENGINES:
            return _standin_module().expected_tokens(self.cycle, seed, self.tokens)
        return self.reference_ids

    def expected_text(self, seed: int) -> Optional[str]:
        ids = self.expected_ids(seed)
        if ids is None:
            return None
        key = seed if self.args.engine in PACED_ENGINES else -1
        if key not in self._texts:
            # the predictor never ends on U+FFFD (an incomplete character at the cut)
            self._texts[key] = self.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
        return self._texts[key]

    def body(self, path: str, seed: int, tokens: Optional[int] = None, index: int = 0) -> dict[str, Any]:
        n = tokens or self.tokens
        if path == "tensorrt_llm":
            body = {
                "input_ids": self.prompt_ids, "input_lengths": [len(self.prompt_ids)], "request_output_len": [n],
                "min_tokens": [n], "end_id": [self.end_id], "runtime_top_k": [1], "seed": [seed], "streaming": [True],
            }
            if getattr(self.args, "model_interval_ms", None) is not None:  # the PyTorch-backend model's own input
                body["stream_interval_ms"] = [self.args.model_interval_ms]
            return body
        if path == "ensemble_ids":
            return {"input_ids": self.prompt_ids, "max_tokens": n, "min_tokens": n, "top_k": 1, "seed": seed,
                    "stream": True}
        if path == FLOOR_PATH:
            return {"input": {"n": n, "step_ms": self.args.step_ms}}
        if path == GUIDED_PATH:  # ends when the document closes: no min_tokens
            return {"input": {"prompt": GUIDED_PROMPT, "json_schema": json.dumps(GUIDED_SCHEMA), "max_tokens": n,
                              "temperature": 0, "seed": seed}}
        body = {"input": {"prompt": PROMPT, "max_tokens": n, "min_tokens": n, "temperature": 0, "seed": seed}}
        if path == LORA_PATH:  # adapters round-robin over the requests: every batch mixes them
            body["input"]["lora_weights"] = self.adapter_urls[index % len(self.adapter_urls)]
        return body

    def request(self, path: str, index: int) -> dict[str, Any]:
        seed = self.seed(index)
        item: dict[str, Any] = {"body": self.body(path, seed, index=index)}
        if path == GUIDED_PATH:
            item["expect_json_schema"] = GUIDED_SCHEMA
        elif path == FLOOR_PATH:
            item["expect_text"] = _floor_module().expected_text(self.tokens)
        elif path in ("cog", LORA_PATH):  # the stand-in's tokens do not depend on the adapter
            item["expect_text"] = self.expected_text(seed)
        else:
            item["expect_ids"] = self.expected_ids(seed)
        return item


_STANDIN = None


_FLOOR = None


def _load_module(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _floor_module():
    """benchmarks/floor/predict.py as a module (for its expected text)."""
    global _FLOOR
    if _FLOOR is None:
        _FLOOR = _load_module("benchmark_floor_predictor", FLOOR_DIR / "predict.py")
    return _FLOOR


def _standin_module():
    """benchmarks/standin/1/model.py as a module (it imports nothing from Triton at import time)."""
    global _STANDIN
    if _STANDIN is None:
        _STANDIN = _load_module("benchmark_standin_model", STANDIN_DIR / "1" / "model.py")
    return _STANDIN
