"""The Hub tests again under huggingface_hub 0.x, the major the GPU image has (tensorrtllm_backend/pins.py
HUB0_PACKAGES: TensorRT-LLM pins transformers 4.57.1, which requires huggingface_hub < 1.0), where this venv has
2.x. 0.x talks HTTP through requests, not httpx2, and its error classes differ (cog_triton/fetch/hub_errors.py), so
the same code meets other exceptions and another HTTP client under the fetch guard.

scripts/setup installs the 0.x packages beside the venv, into build/hub0; here a pytest subprocess runs the Hub
tests with that folder first on PYTHONPATH: tests/test_hub_errors.py (the classification), tests/test_weights_hub.py
(hf:// weights against the local Hub stand-in: every refusal and failure message, HF_HUB_OFFLINE, the fetch guard's
connections), tests/test_lora_store.py (hf:// adapters, under the fetch rules) and test_fetch_deadline.py's Hub tests
(the deadline over urllib3's connections and connects). It starts a process, so it is in
the integration tier."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.pins import HUB0_DIR, HUB0_PACKAGES

pytestmark = pytest.mark.integration

HUB0 = REPO_ROOT / HUB0_DIR
DEADLINE = "tests/test_fetch_deadline.py::test_a_"
MODULES = ("tests/test_hub_errors.py", "tests/test_weights_hub.py", "tests/test_lora_store.py",
           # the deadline through 0.x's requests/urllib3: a dripping Hub, dropping addresses (tests/dropnet.py)
           f"{DEADLINE}hub_that_drips_ends_an_hf_fetch_at_its_deadline",
           f"{DEADLINE}hub_with_many_dropping_addresses_ends_hf_fetches_at_their_deadline",
           f"{DEADLINE}name_with_many_dropping_addresses_ends_a_urllib3_fetch_at_its_deadline",
           # no signed CDN URL in an hf:// adapter's error (the weights' is in test_weights_hub.py)
           "tests/test_redaction.py::test_an_adapter_whose_cdn_answers_an_error_shows_no_signed_url")
#: Run in the subprocess: the versions imported there (before pytest runs), then the modules, in one process.
SCRIPT = """
import sys, huggingface_hub, transformers, pytest
print("versions:", huggingface_hub.__version__, transformers.__version__, huggingface_hub.__file__, flush=True)
sys.exit(pytest.main(["-n", "0", "-p", "no:cacheprovider", "-q", "-rfE", "--tb=short", *sys.argv[1:]]))
"""


def test_the_hub_tests_pass_under_huggingface_hub_0x() -> None:
    if not (HUB0 / "huggingface_hub").is_dir():
        pytest.fail(f"{HUB0} is missing: run scripts/setup (it installs {', '.join(HUB0_PACKAGES)} there)",
                    pytrace=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(HUB0), str(REPO_ROOT))))
    run = subprocess.run([sys.executable, "-c", SCRIPT, *MODULES], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=600)  # only "not hung": the run takes about 30 s on 2 cores
    out = run.stdout + run.stderr
    versions = next((line.split()[1:] for line in run.stdout.splitlines() if line.startswith("versions:")), [])
    wanted = dict(p.split("==") for p in HUB0_PACKAGES)
    assert versions[:2] == [wanted["huggingface_hub"], wanted["transformers"]], out[-3000:]
    assert versions[2].startswith(str(HUB0)), f"huggingface_hub came from {versions[2]}, not {HUB0}"
    summary = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert run.returncode == 0, (f"under huggingface_hub {versions[0]}, {len(summary)} failed:\n"
                                 + "\n".join(summary) + "\n\n" + out[-6000:])
    assert " passed" in run.stdout.splitlines()[-1] and "skipped" not in run.stdout.splitlines()[-1], out[-2000:]
