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
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from cog_triton.settings import REPO_ROOT  # imports no torch
from tests.stacks import STACK_SETTINGS, cog_stack, stack_processes

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")



def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="also run the long versions of the soak and load tests (marked soak); by default only "
                          "their short versions run")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --soak, the tests marked ``soak`` (the long version of a test whose short version runs anyway)
    are deselected: the README's test command stays short, and ``--soak`` runs both versions."""
    if not config.getoption("--soak"):
        long_ones = [item for item in items if item.get_closest_marker("soak") is not None]
        if long_ones:
            config.hook.pytest_deselected(items=long_ones)
            items[:] = [item for item in items if item.get_closest_marker("soak") is None]
    _integration_modules_first(items)


def _integration_modules_first(items: list[pytest.Item]) -> None:
    """Put the modules holding integration tests (each starts processes: the long ones) before the others, each
    module whole and in its own order. The xdist workers take whole modules in this order, so the long ones start
    first and the many short ones fill the end, instead of one worker finishing a long module while the other
    waits."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    long_modules = {module(item) for item in items if item.get_closest_marker("integration") is not None}
    items.sort(key=lambda item: module(item) not in long_modules)  # a stable sort: the order within each group stays


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_go_when_the_run_passes(request: pytest.FixtureRequest,
                                           tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A run (each xdist worker's part) with no failure removes its temporary directory at the end, after every
    other fixture's teardown; a failing one keeps it to look into. Each Cog stack unpacks the 0.5 GB weights, so a
    full run writes about 10 GB there, and pytest keeps the last three runs' by default: repeated runs filled a
    development machine's disk."""
    yield
    if request.session.testsfailed == 0:
        shutil.rmtree(tmp_path_factory.getbasetemp(), ignore_errors=True)


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
def pytorch_model_module(tmp_path_factory, checkpoint_dir: Path):
    """The PyTorch-backend model.py of a repository rendered for the default checkpoint (llm_args.json beside it),
    with the recording pb_utils (tests/fake_pb_utils.py; Triton's stub cannot run in-process). One per session, shared
    by every test module that loads it (each instance reads its LLM's arguments through ``load_llm_args``, which a
    test may replace): rendering and importing it once is enough."""
    from tests import fake_pb_utils
    from tests.llmapi_overlay import render_pytorch_repository
    from tests.modules import load_file

    repo = tmp_path_factory.mktemp("pytorch_model") / "repo"
    render_pytorch_repository(repo, checkpoint_dir, max_batch_size=4)
    module = load_file("pytorch_model_under_test", repo / "tensorrt_llm" / "1" / "model.py")
    module.pb_utils = module.glue.pb_utils = fake_pb_utils
    return module


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


# ------------------------------------------------------------------------------------------------
# Cog server + Triton stacks shared across modules (tests/stacks.py)
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def _shared_stack(tmp_path_factory: pytest.TempPathFactory, default_archive: Path) -> Iterator[dict[str, Any]]:
    with cog_stack(tmp_path_factory, default_archive, "shared_stack", **STACK_SETTINGS) as stack:
        yield stack


@pytest.fixture
def shared_stack(_shared_stack: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One Cog server + Triton (:func:`cog_stack`, :data:`STACK_SETTINGS`) for every test that only sends it
    predictions and reads its logs (a fresh prediction each; logs are read relative to what was there before, or
    tied to the test's own request ids). Started once per session, at its first use.

    A test must leave it as it found it: the same Cog server, Triton, stubs and stream processes, none killed,
    stopped or restarted. This is checked around each test (the test errors in its teardown, naming what changed),
    so a test that breaks the stack fails itself, instead of passing and leaving the tests after it to fail for
    no fault of theirs; such tests use :func:`fault_stack` or a stack of their own.
    """
    before = stack_processes(_shared_stack)
    yield _shared_stack
    now = stack_processes(_shared_stack)
    assert now == before, f"this test changed the shared stack's processes: {before} -> {now}; use fault_stack"


@pytest.fixture(scope="session")
def fault_stack(tmp_path_factory: pytest.TempPathFactory, default_archive: Path) -> Iterator[dict[str, Any]]:
    """A stack like :func:`shared_stack`'s, for the tests that kill, stop or restart its parts (tests/test_faults.py
    and the fault tests of tests/test_integration.py). Each such test leaves it serving: killed parts restarted by
    the predictor, or a stopped Cog server replaced by a new one in ``stack["cog"]`` (stopped at the end)."""
    with cog_stack(tmp_path_factory, default_archive, "fault_stack", **STACK_SETTINGS) as stack:
        yield stack
