"""`cog train`: train.py builds the weights archive, called directly and through the real Cog server
in training mode (coglet ``--x-mode train``, ``PUT /trainings/{id}``).

The CPU path (reference backend) runs for real on a tiny random Llama checkpoint with the SmolLM2
tokenizer, served over local HTTP as a .tar.gz (small enough for coglet's data-URL output). The
GPU path is exercised up to its preflight refusal, the only part a machine without GPU can run.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import tarfile
from pathlib import Path

import httpx
import pytest

from common.errors import BuildConfigError, BuildError, FetchRefusedError
from cog_triton.dev.local import CogServer, WeightsHTTPServer
from tests.hub_server import FakeHub
from tests.hub_server import tiny_checkpoint as tiny_hub_checkpoint
from cog_triton.weights import fetch_weights
from tensorrtllm_backend.manifest import read_manifest, verify_weights
from train import CONFIG_DIR, OUTPUT_DIR, resolve_config, train
from cog import Secret

TINY_CONFIG = """\
name: tiny-llama
backend: reference
source:
  checkpoint: org/placeholder   # replaced by the checkpoint input
limits:
  max_batch_size: 2
  max_input_len: 127
  max_seq_len: 128
"""


@pytest.fixture(scope="module")
def tiny_checkpoint_url(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path):
    """A 1-layer random Llama with the SmolLM2 tokenizer, packed as .tar.gz and served over HTTP."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("tiny")
    folder = root / "tiny-llama"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(checkpoint_dir / name, folder / name)
    serve = root / "serve"
    serve.mkdir()
    with tarfile.open(serve / "tiny-llama.tar.gz", "w:gz") as tar:
        tar.add(folder, arcname="tiny-llama")  # one top-level folder, as people pack them
    with WeightsHTTPServer(serve) as server:
        yield f"{server.url}/tiny-llama.tar.gz"


def test_resolve_config_by_name_or_yaml(tmp_path: Path) -> None:
    assert resolve_config("gpt2-medium-fp16", tmp_path) == CONFIG_DIR / "gpt2-medium-fp16.yaml"
    written = resolve_config(TINY_CONFIG, tmp_path)
    assert written.parent == tmp_path and "tiny-llama" in written.read_text()
    with pytest.raises(BuildConfigError) as info:
        resolve_config("llama-4", tmp_path)
    assert "config 'llama-4' is not one of gemma-2b-it, gpt2-medium-fp16, llama-2-7b-fp16-tp4" in str(info.value)


#: The checkpoint is served from 127.0.0.1 over http://, which the fetch rules refuse by default.
OPT_IN = {"COG_TRITON_FETCH_ALLOW_PRIVATE": "true", "COG_TRITON_FETCH_ALLOW_HTTP": "true"}


def test_train_builds_a_reference_archive(tiny_checkpoint_url: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OPT_IN.items():
        monkeypatch.setenv(name, value)
    output = asyncio.run(train(config=TINY_CONFIG, checkpoint=tiny_checkpoint_url, hf_token=None))
    archive = Path(output.weights)
    assert archive == OUTPUT_DIR / "tiny-llama.tar.gz" and archive.is_file()
    assert not [p for p in OUTPUT_DIR.iterdir() if p.name.startswith("cog-triton-train-")]  # scratch removed
    fetch_weights(str(archive), tmp_path / "w")
    manifest = read_manifest(tmp_path / "w")
    assert manifest is not None and (manifest.name, manifest.backend) == ("tiny-llama", "reference")
    assert manifest.build_config["source"]["checkpoint"].endswith("/checkpoint/tiny-llama")
    assert {f.path for f in manifest.files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert verify_weights(tmp_path / "w", []) is not None


def test_hf_token_reaches_its_own_build_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    monkeypatch.setenv("HF_TOKEN", "unset-below")  # so monkeypatch restores "no HF_TOKEN" afterwards
    monkeypatch.delenv("HF_TOKEN")
    real_run = subprocess.run
    seen: list[tuple[str, object]] = []

    def run(argv: list[str], *args: object, **kwargs: object) -> object:
        if "tensorrtllm_backend.convert" not in argv:
            return real_run(argv, *args, **kwargs)  # type: ignore[call-overload]
        # stands in for `python -m tensorrtllm_backend.convert download` (no Hub to reach here): records
        # the HF_TOKEN the step's process would see, and leaves a minimal checkpoint where it would
        env = kwargs.get("env")
        environment = dict(os.environ if env is None else env)  # type: ignore[call-overload]
        seen.append((argv[argv.index("--repo-id") + 1], environment.get("HF_TOKEN")))
        out = Path(argv[argv.index("--output-dir") + 1])
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", run)
    first = asyncio.run(train(config=TINY_CONFIG, checkpoint="org/gated", hf_token=Secret("hf_s3cret")))
    assert os.environ.get("HF_TOKEN") is None  # (not `in os.environ`: a failure would print the environment)
    second = asyncio.run(train(config=TINY_CONFIG, checkpoint="org/public", hf_token=None))
    assert os.environ.get("HF_TOKEN") is None
    assert seen == [("org/gated", "hf_s3cret"), ("org/public", None)]  # the second training got no token
    assert Path(first.weights).name == Path(second.weights).name == "tiny-llama.tar.gz"


PYTORCH_CONFIG = """\
name: tiny-pytorch
backend: pytorch
source:
  checkpoint: org/placeholder   # replaced by the checkpoint input
"""


def test_train_packages_and_verifies_a_checkpoint_for_the_pytorch_backend(tmp_path, monkeypatch, checkpoint_dir):
    """Nothing is built for the PyTorch backend: the checkpoint (here hf://, fetched with the token of this training
    only) is checked to be one 1.2.1 serves, and packed as it is into a .tar with its manifest, without a GPU."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: none is needed
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # The training's checkpoint follows the fetch rules: the stand-in Hub is on 127.0.0.1, over http.
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_PRIVATE", "true")
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_HTTP", "true")
    with FakeHub(token="hf_trainToken") as hub:
        hub.use(monkeypatch)
        files = tiny_hub_checkpoint()
        files["tokenizer.json"] = (checkpoint_dir / "tokenizer.json").read_bytes()
        files["pytorch_model.bin"] = b"a duplicate in another format"
        hub.add_repo("org/tiny", files, private=True)
        output = asyncio.run(train(config=PYTORCH_CONFIG, checkpoint="hf://org/tiny", hf_token=Secret("hf_trainToken")))
        assert os.environ.get("HF_TOKEN") is None
        archive = Path(output.weights)
        assert archive == OUTPUT_DIR / "tiny-pytorch.tar" and archive.is_file()
        fetch_weights(str(archive), tmp_path / "w")
        manifest = read_manifest(tmp_path / "w")
        assert manifest is not None and (manifest.backend, manifest.kind) == ("pytorch", "hf_checkpoint")
        assert {f.path for f in manifest.files} == {"config.json", "model.safetensors", "tokenizer.json",
                                                     "tokenizer_config.json"}
        assert verify_weights(tmp_path / "w", []) is not None

        hub.add_repo("org/gpt2", tiny_hub_checkpoint("GPT2LMHeadModel"), private=True)
        with pytest.raises(BuildError) as refused:
            asyncio.run(train(config=PYTORCH_CONFIG, checkpoint="hf://org/gpt2", hf_token=Secret("hf_trainToken")))
        assert "cannot be served by the PyTorch backend: " in refused.value.message
        assert "architecture GPT2LMHeadModel is not in TensorRT-LLM 1.2.1's PyTorch backend" in refused.value.message
        assert not [p for p in OUTPUT_DIR.iterdir() if p.name.startswith("cog-triton-train-")]

def test_the_checkpoint_follows_the_fetch_rules(tiny_checkpoint_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The training's checkpoint is an API caller's input, as lora_weights is: by default the local server is
    refused (plain http://, then its loopback address), and a Hub id's owner must be on the owner list."""
    before = len(list(OUTPUT_DIR.glob("*"))) if OUTPUT_DIR.is_dir() else 0
    with pytest.raises(FetchRefusedError, match="plain http:// is refused; checkpoints are fetched only over https"):
        asyncio.run(train(config=TINY_CONFIG, checkpoint=tiny_checkpoint_url, hf_token=None))
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_HTTP", "true")
    with pytest.raises(FetchRefusedError, match="127.0.0.1 is a loopback address; checkpoints are fetched only from "
                                                "public addresses"):
        asyncio.run(train(config=TINY_CONFIG, checkpoint=tiny_checkpoint_url, hf_token=None))
    monkeypatch.setenv("COG_TRITON_FETCH_ALLOW_HF_OWNERS", "trusted")
    with pytest.raises(FetchRefusedError, match=r"checkpoint org/gated: the Hub owner 'org' is not on the list of "
                                                r"owners checkpoints are fetched from \(COG_TRITON_FETCH_ALLOW_HF_"
                                                r"OWNERS=trusted\)"):
        asyncio.run(train(config=TINY_CONFIG, checkpoint="org/gated", hf_token=None))
    with pytest.raises(FetchRefusedError, match=r"checkpoint org/gated: the Hub owner 'org' is not on the list"):
        asyncio.run(train(config=TINY_CONFIG, checkpoint="hf://org/gated@v1", hf_token=None))
    with pytest.raises(FetchRefusedError, match="the Hub owner 'org' is not on the list"):  # the config's own source
        asyncio.run(train(config=TINY_CONFIG.replace("org/placeholder", "org/model"), checkpoint="", hf_token=None))
    assert (len(list(OUTPUT_DIR.glob("*"))) if OUTPUT_DIR.is_dir() else 0) == before


def test_train_refuses_an_engine_without_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi
    with pytest.raises(BuildError, match="needs an NVIDIA GPU, and none is visible"):
        asyncio.run(train(config="llama-3-8b-instruct-bf16", checkpoint="", hf_token=None))


@pytest.mark.integration
def test_cog_train_through_the_real_cog_server(tiny_checkpoint_url: str, tmp_path: Path) -> None:
    with CogServer(OPT_IN, log_file=tmp_path / "cog-train.log", mode="train") as cog:
        cog.wait_ready(timeout_s=120)
        response = httpx.put(
            f"{cog.url}/trainings/train-1",
            json={"input": {"config": TINY_CONFIG, "checkpoint": tiny_checkpoint_url}},
            timeout=300,
        )
        doc = response.json()
        assert doc["status"] == "succeeded", doc.get("error") or doc.get("logs")
        data_url = doc["output"]["weights"]
        assert data_url.startswith("data:")
        archive = tmp_path / "tiny-llama.tar.gz"
        archive.write_bytes(base64.b64decode(data_url.split(",", 1)[1]))
        fetch_weights(str(archive), tmp_path / "w")
        assert verify_weights(tmp_path / "w", []) is not None
        assert "built " in doc["logs"] and "manifest: " in doc["logs"]

        failed = httpx.put(
            f"{cog.url}/trainings/train-2", json={"input": {"config": "llama-3-8b-instruct-bf16"}}, timeout=120
        ).json()
        assert failed["status"] == "failed"
        assert "[build_failed]" in failed["error"] and "needs an NVIDIA GPU" in failed["error"]


def test_a_trainings_error_leaves_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a training raises reaches the caller and coglet's log as its text: a library's error quoting a URL with
    a password (stood in for by a build that raises it: the test is about the boundary) leaves without it."""
    import train as train_module

    def build_archive(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("snapshot_download failed for https://u:pw-train@mirror.example/org/model")

    monkeypatch.setattr(train_module, "build_archive", build_archive)
    with pytest.raises(RuntimeError) as info:
        asyncio.run(train(config=TINY_CONFIG, checkpoint="", hf_token=None))
    assert str(info.value) == "snapshot_download failed for https://mirror.example/org/model"
