"""Shared fixtures: the default model's checkpoint and archive (made by scripts/setup).

One torch thread per process (``OMP_NUM_THREADS=1``, unless set): the tests run several processes that each
run the model with torch at once (this one's transformers references, the reference model in Triton's Python
backend stub, the LLM API stand-in), on a machine of 2 cores, often shared. With torch's default of one
thread per core, their OpenMP threads spin waiting for each other whenever a core is taken: on the 2-core
development machine, loaded by other work (load average 4), 64 greedy tokens of the default model took
11-23 s with 2 threads and 2.7 s with 1, and ``test_hostile_inputs_do_not_stall_a_running_stream`` 122 s and
26 s. Set here, before torch is imported, it reaches every process the tests start (they inherit the
environment).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cog_triton.settings import REPO_ROOT  # imports no torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_MODEL_DIR = REPO_ROOT / "build" / "default_model"
CHECKPOINT_DIR = DEFAULT_MODEL_DIR / "checkpoint"
ARCHIVE = DEFAULT_MODEL_DIR / "smollm2-135m-instruct.tar.gz"


@pytest.fixture(scope="session")
def checkpoint_dir() -> Path:
    """The SmolLM2-135M-Instruct safetensors checkpoint with tokenizer (scripts/setup makes it)."""
    if not (CHECKPOINT_DIR / "model.safetensors").is_file():
        pytest.fail(f"{CHECKPOINT_DIR} is missing: run scripts/setup first", pytrace=False)
    return CHECKPOINT_DIR


@pytest.fixture(scope="session")
def default_archive(checkpoint_dir: Path) -> Path:
    """The .tar.gz weights archive of the default model, with a .sha256 file beside it."""
    if not ARCHIVE.is_file():
        pytest.fail(f"{ARCHIVE} is missing: run scripts/setup first", pytrace=False)
    return ARCHIVE


@pytest.fixture(scope="session")
def hf_tokenizer(checkpoint_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint_dir), local_files_only=True)


@pytest.fixture(scope="session")
def hf_model(checkpoint_dir: Path):
    """The same checkpoint loaded with transformers (float32, eval) for reference outputs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint_dir), dtype=torch.float32, local_files_only=True)
    return model.eval()
