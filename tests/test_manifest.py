"""manifest.json: write, pack, unpack, verify, and every failure setup() must catch before Triton starts.

Engines here are fake files (no GPU to build real ones), and GPUs are GPU records (tests/gpu_fakes.py);
hashing, packing, extraction and the checks themselves are the real code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from common.errors import IncompatibleWeightsError, ManifestError
from common.files import VERIFIED_NAME
from cog_triton.weights import fetch_weights
from tensorrtllm_backend.engine import inspect_weights
from tensorrtllm_backend.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    base_model_of,
    check_compatibility,
    check_weights_match,
    pack_archive,
    read_manifest,
    reference_lora,
    verify_weights,
    write_manifest,
)
from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE
from tests.gpu_fakes import A100, H100, gpus

BUILD_CONFIG = {"name": "tiny", "backend": "tensorrtllm", "source": {"checkpoint": "org/tiny"}}


def engine_config(world: int = 1, version: str = TENSORRT_LLM_VERSION) -> dict[str, Any]:
    return {
        "version": version,
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "mapping": {"world_size": world, "tp_size": world, "pp_size": 1},
        },
        "build_config": {"max_batch_size": 4, "max_input_len": 32, "max_seq_len": 64, "max_beam_width": 1},
    }


def make_engine(root: Path, world: int = 1, version: str = TENSORRT_LLM_VERSION) -> Path:
    """An engine folder (fake rank files of distinct bytes) with a tokenizer/ subfolder."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(engine_config(world, version)))
    for rank in range(world):
        (root / f"rank{rank}.engine").write_bytes(bytes([rank]) * (1000 + rank) + b"engine")
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0"}')
    (root / "tokenizer" / "tokenizer_config.json").write_text("{}")
    return root


def manifest_for(root: Path, world: int = 1, gpu_kind: tuple[str, str] = H100, **kw: Any):
    return write_manifest(
        root,
        name="tiny",
        backend="tensorrtllm",
        build_config=BUILD_CONFIG,
        world_size=world,
        tp_size=world,
        pp_size=1,
        gpu=gpus(1, gpu_kind)[0],
        tensorrt_llm_version=kw.pop("version", TENSORRT_LLM_VERSION),
        **kw,
    )


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "engine", world=2)
    manifest = manifest_for(root, world=2)
    data = json.loads((root / MANIFEST_NAME).read_text())
    assert data["format_version"] == FORMAT_VERSION
    assert (data["backend"], data["kind"]) == ("tensorrtllm", "engine")
    assert data["tensorrt_llm_version"] == TENSORRT_LLM_VERSION and data["triton_image"] == TRITON_IMAGE
    assert (data["world_size"], data["tp_size"], data["pp_size"]) == (2, 2, 1)
    assert data["gpu"] == {"name": H100[0], "compute_capability": "9.0"}
    assert data["build_config"] == BUILD_CONFIG
    paths = [f["path"] for f in data["files"]]
    assert paths == ["config.json", "rank0.engine", "rank1.engine", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    for entry in data["files"]:
        content = (root / entry["path"]).read_bytes()
        assert entry["size"] == len(content)
        assert entry["sha256"] == hashlib.sha256(content).hexdigest()
    assert read_manifest(root) == manifest


def test_engine_manifest_needs_version_and_gpu(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e")
    with pytest.raises(ValueError, match="needs the TensorRT-LLM version and the GPU"):
        write_manifest(root, name="x", backend="tensorrtllm", build_config={})
    with pytest.raises(ValueError, match="backend must be one of"):
        write_manifest(root, name="x", backend="vllm", build_config={})


def test_packed_archive_unpacks_and_verifies(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "engine", world=2)
    manifest_for(root, world=2)
    archive = tmp_path / "out" / "tiny.tar"
    digest, size = pack_archive(root, archive, gzip=False)
    assert archive.stat().st_size == size
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == digest
    assert (tmp_path / "out" / "tiny.tar.sha256").read_text() == f"{digest}  tiny.tar\n"
    assert not list((tmp_path / "out").glob("*.partial"))
    target = tmp_path / "weights"
    fetch_weights(str(archive), target, sha256=digest)
    verification = verify_weights(target, gpus(2), TENSORRT_LLM_VERSION)
    assert verification is not None and verification.manifest.name == "tiny"
    info = inspect_weights(target)
    check_weights_match(info, verification.manifest, gpus(2), TENSORRT_LLM_VERSION)
    assert info.world_size == 2


def test_gzip_archive(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "engine")
    manifest_for(root)
    archive = tmp_path / "tiny.tar.gz"
    pack_archive(root, archive, gzip=True)
    assert archive.read_bytes()[:2] == b"\x1f\x8b"
    fetch_weights(str(archive), tmp_path / "w")
    assert verify_weights(tmp_path / "w", gpus(1), TENSORRT_LLM_VERSION) is not None


def test_no_manifest_means_nothing_to_verify(tmp_path: Path) -> None:
    assert verify_weights(make_engine(tmp_path / "e"), gpus(1), TENSORRT_LLM_VERSION) is None


def test_tampered_file_same_size(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e", world=2)
    manifest_for(root, world=2)
    blob = bytearray((root / "rank1.engine").read_bytes())
    blob[10] ^= 0xFF
    (root / "rank1.engine").write_bytes(bytes(blob))
    with pytest.raises(ManifestError) as info:
        verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    message = str(info.value)
    assert message.startswith("[manifest_mismatch]")
    assert "rank1.engine has sha256 " + hashlib.sha256(bytes(blob)).hexdigest() in message
    assert "rank0.engine" not in message
    assert "download it again, or rebuild it with scripts/build_engine" in message


def test_missing_and_resized_files_are_all_listed(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e", world=2)
    manifest = manifest_for(root, world=2)
    (root / "rank0.engine").unlink()
    with open(root / "tokenizer" / "tokenizer.json", "a") as fh:
        fh.write(" ")
    expected = next(f.size for f in manifest.files if f.path == "tokenizer/tokenizer.json")
    with pytest.raises(ManifestError) as info:
        verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    message = str(info.value)
    assert "rank0.engine is missing" in message
    assert f"tokenizer/tokenizer.json has {expected + 1} bytes, the manifest says {expected}" in message


def test_extra_files_are_tolerated_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_engine(tmp_path / "e")
    manifest_for(root)
    (root / "notes.txt").write_text("hi")
    with caplog.at_level("WARNING", logger="tensorrtllm_backend.manifest"):
        assert verify_weights(root, gpus(1), TENSORRT_LLM_VERSION) is not None
    assert "notes.txt" in caplog.text


def test_version_mismatch_names_both_versions_and_the_fix(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e", version="1.0.0")
    manifest_for(root, version="1.0.0", triton_image="nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3")
    with pytest.raises(IncompatibleWeightsError) as info:
        verify_weights(root, gpus(1), TENSORRT_LLM_VERSION)
    message = str(info.value)
    assert message.startswith("[incompatible_weights]")
    assert "built with TensorRT-LLM 1.0.0 (nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3)" in message
    assert f"this image serves TensorRT-LLM {TENSORRT_LLM_VERSION} ({TRITON_IMAGE})" in message
    fix = f"rebuild it with TensorRT-LLM {TENSORRT_LLM_VERSION} (scripts/build_engine inside this image, FROM "
    fix += TRITON_IMAGE
    assert fix in message


def test_too_few_gpus_names_world_size_and_visible_gpus(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e", world=4)
    manifest_for(root, world=4)
    with pytest.raises(IncompatibleWeightsError) as info:
        verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    message = str(info.value)
    assert "world size 4 (tp_size 4 x pp_size 1) and needs 4 GPUs" in message
    assert "but 2 GPUs (0: NVIDIA H100 80GB HBM3, compute capability 9.0; 1:" in message
    assert "run it on a machine with 4 GPUs" in message and "tp_size * pp_size = 2" in message
    with pytest.raises(IncompatibleWeightsError, match="needs 4 GPUs, but no GPU is visible"):
        verify_weights(root, [], TENSORRT_LLM_VERSION)


def test_other_compute_capability(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e")
    manifest_for(root, gpu_kind=H100)
    with pytest.raises(IncompatibleWeightsError) as info:
        verify_weights(root, gpus(1, A100), TENSORRT_LLM_VERSION)
    message = str(info.value)
    assert "built on NVIDIA H100 80GB HBM3 with compute capability 9.0" in message
    assert "GPU 0 (NVIDIA A100-SXM4-80GB) has compute capability 8.0" in message
    assert "rebuild it with scripts/build_engine on a GPU of compute capability 8.0" in message


def test_compatibility_is_checked_before_hashing(tmp_path: Path) -> None:
    # A wrong GPU count is reported even when a file is also missing: it is the cheaper, clearer fault.
    root = make_engine(tmp_path / "e", world=2)
    manifest_for(root, world=2)
    (root / "rank1.engine").unlink()
    with pytest.raises(IncompatibleWeightsError):
        verify_weights(root, gpus(1), TENSORRT_LLM_VERSION)


def test_reference_archives_need_no_gpu(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    manifest = write_manifest(root, name="smol", backend="reference", build_config={})
    assert manifest.kind == "hf_checkpoint" and manifest.tensorrt_llm_version is None and manifest.compute_capability is None
    check_compatibility(manifest, [], "9.9.9")
    assert verify_weights(root, [], "9.9.9") is not None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(format_version=FORMAT_VERSION + 1), "is newer than this image understands"),
        (lambda d: d.update(format_version="1"), "format_version must be a positive integer"),
        (lambda d: d.update(backend="vllm"), "backend 'vllm' is not one of tensorrtllm, reference"),
        (lambda d: d.update(world_size=3), "world_size 3 must equal tp_size 1 * pp_size 1"),
        (lambda d: d["files"].append({"path": "../escape", "size": 1, "sha256": "0" * 64}), "must be relative, without '..'"),
        (lambda d: d["files"].append({"path": "/etc/passwd", "size": 1, "sha256": "0" * 64}), "must be relative"),
        (lambda d: d["files"][0].update(sha256="abc"), "must be 64 hex characters"),
        (lambda d: d["files"][0].update(size=-1), "must be a non-negative integer"),
        (lambda d: d.pop("files"), "files is missing or of the wrong type"),
        (lambda d: d["gpu"].update(compute_capability="sm90"), "gpu.compute_capability must look like '9.0'"),
    ],
)
def test_invalid_manifests(tmp_path: Path, change: Any, expected: str) -> None:
    root = make_engine(tmp_path / "e")
    manifest_for(root)
    data = json.loads((root / MANIFEST_NAME).read_text())
    change(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*").replace(".", r"\.")):
        verify_weights(root, gpus(1), TENSORRT_LLM_VERSION)


def test_manifest_not_json(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e")
    (root / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="is not readable JSON"):
        verify_weights(root, gpus(1), TENSORRT_LLM_VERSION)


def test_manifest_must_agree_with_the_engine(tmp_path: Path) -> None:
    root = make_engine(tmp_path / "e", world=2)
    manifest = manifest_for(root, world=2)
    info = inspect_weights(root)
    lying = dataclasses.replace(manifest, world_size=1, tp_size=1)
    with pytest.raises(ManifestError, match="says world size 1, but the engine's config.json says 2"):
        check_weights_match(info, lying, gpus(2), TENSORRT_LLM_VERSION)
    with pytest.raises(ManifestError, match="says kind hf_checkpoint, but the weights are of kind engine"):
        check_weights_match(info, dataclasses.replace(manifest, kind="hf_checkpoint"), gpus(2), TENSORRT_LLM_VERSION)
    with pytest.raises(ManifestError, match="says TensorRT-LLM 1.0.0, but the engine's config.json says 1.2.1"):
        check_weights_match(info, dataclasses.replace(manifest, tensorrt_llm_version="1.0.0"), gpus(2), "1.2.1")


def test_engines_without_manifest_are_still_checked(tmp_path: Path) -> None:
    old = inspect_weights(make_engine(tmp_path / "old", version="0.12.0"))
    with pytest.raises(IncompatibleWeightsError, match="built with TensorRT-LLM 0.12.0, but this image serves TensorRT-LLM 1.2.1"):
        check_weights_match(old, None, gpus(1), "1.2.1")
    wide = inspect_weights(make_engine(tmp_path / "wide", world=2))
    with pytest.raises(IncompatibleWeightsError, match="needs 2 GPUs, but 1 GPU"):
        check_weights_match(wide, None, gpus(1), TENSORRT_LLM_VERSION)
    check_weights_match(wide, None, gpus(2), TENSORRT_LLM_VERSION)


def test_an_engine_of_tensorrt_llm_1_1_is_refused_with_the_rebuild_in_1_2_1(tmp_path: Path) -> None:
    """The image serves TensorRT-LLM 1.2.1 (tritonserver:26.07); an engine only loads in the version that built
    it, so a 1.1.0 engine (tritonserver:26.02) must be rebuilt, and the message says with which version."""
    root = make_engine(tmp_path / "old", version="1.1.0")
    manifest_for(root, version="1.1.0", triton_image="nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3")
    checks = (
        lambda: verify_weights(root, gpus(1), TENSORRT_LLM_VERSION),  # with the manifest
        lambda: check_weights_match(inspect_weights(root), None, gpus(1), TENSORRT_LLM_VERSION),  # config.json alone
    )
    for check in checks:
        with pytest.raises(IncompatibleWeightsError) as info:
            check()
        message = str(info.value)
        assert "built with TensorRT-LLM 1.1.0" in message
        assert "this image serves TensorRT-LLM 1.2.1 (nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3)" in message
        assert "rebuild it with TensorRT-LLM 1.2.1 (scripts/build_engine inside this image" in message
    # an NGC build of 1.2.1 reports a suffixed version: the message names the release to rebuild with
    with pytest.raises(IncompatibleWeightsError, match=r"rebuild it with TensorRT-LLM 1\.2\.1 \("):
        check_weights_match(inspect_weights(root), None, gpus(1), "1.2.1.2607")


def test_unpack_keeps_marker_out_of_verification(tmp_path: Path) -> None:
    # fetch_weights writes its marker file beside the weights; verification ignores it.
    root = make_engine(tmp_path / "e")
    manifest_for(root)
    pack_archive(root, tmp_path / "a.tar", gzip=False)
    shutil.rmtree(root)
    target = tmp_path / "w"
    fetch_weights(str(tmp_path / "a.tar"), target)
    assert any(p.name.startswith(".cog-triton") for p in target.iterdir())
    assert verify_weights(target, gpus(1), TENSORRT_LLM_VERSION) is not None


def test_reference_limits_come_from_the_build_config_unless_set(tmp_path: Path) -> None:
    from cog_triton.worker.facts import reference_limits
    from cog_triton.settings import Settings

    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    limits = {"max_batch_size": 2, "max_input_len": 127, "max_seq_len": 128}
    manifest = write_manifest(root, name="tiny", backend="reference", build_config={"limits": limits})
    assert reference_limits(Settings(), manifest) == {
        "reference_max_batch_size": 2,
        "reference_max_seq_len": 128,
        "reference_max_input_len": 127,
    }
    explicit = Settings(reference_max_batch_size=8, reference_max_seq_len=64)
    assert reference_limits(explicit, manifest) == {
        "reference_max_batch_size": 8,
        "reference_max_seq_len": 64,
        "reference_max_input_len": 127,
    }
    assert reference_limits(Settings(), None) == {
        "reference_max_batch_size": 8,
        "reference_max_seq_len": None,
        "reference_max_input_len": None,
    }
    engine = make_engine(tmp_path / "engine")
    assert reference_limits(Settings(), manifest_for(engine))["reference_max_seq_len"] is None


# --- the verification record: full check after a fetch, trusted size+mtime on reuse -----------


def _verified_engine(tmp_path: Path, world: int = 2) -> Path:
    root = make_engine(tmp_path / "e", world=world)
    manifest_for(root, world=world)
    return root


def _flip_byte_keep_mtime(path: Path) -> None:
    st = path.stat()
    blob = bytearray(path.read_bytes())
    blob[10] ^= 0xFF
    path.write_bytes(bytes(blob))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only hashing can tell


def test_a_full_check_writes_the_record_and_reuse_trusts_it(tmp_path: Path) -> None:
    root = _verified_engine(tmp_path)
    manifest = read_manifest(root)
    assert manifest is not None
    first = verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    assert first is not None
    assert (first.files.hashed_files, first.files.hashed_bytes) == (len(manifest.files), sum(f.size for f in manifest.files))
    record = json.loads((root / VERIFIED_NAME).read_text())
    assert record["manifest_sha256"] == hashlib.sha256((root / MANIFEST_NAME).read_bytes()).hexdigest()
    assert set(record["files"]) == {f.path for f in manifest.files}
    for entry in manifest.files:
        st = (root / entry.path).stat()
        assert record["files"][entry.path] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": entry.sha256}

    reused = verify_weights(root, gpus(2), TENSORRT_LLM_VERSION, trust_record=True)
    assert reused is not None
    assert (reused.files.hashed_files, reused.files.hashed_bytes, reused.files.trusted_files) == (0, 0, len(manifest.files))

    full = verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)  # not trusting: everything again
    assert full is not None and full.files.hashed_files == len(manifest.files)


def test_a_file_touched_since_the_record_is_hashed_again(tmp_path: Path) -> None:
    root = _verified_engine(tmp_path)
    verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    path = root / "rank1.engine"
    blob = bytearray(path.read_bytes())
    blob[10] ^= 0xFF
    path.write_bytes(bytes(blob))  # same size, new mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # distinct even on coarse clocks
    with pytest.raises(ManifestError, match="rank1.engine has sha256"):
        verify_weights(root, gpus(2), TENSORRT_LLM_VERSION, trust_record=True)
    assert not (root / VERIFIED_NAME).exists()  # a failed check leaves no record


def test_the_record_is_only_as_good_as_size_and_mtime_and_a_full_check_is_not_fooled(tmp_path: Path) -> None:
    root = _verified_engine(tmp_path)
    verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    _flip_byte_keep_mtime(root / "rank0.engine")
    assert verify_weights(root, gpus(2), TENSORRT_LLM_VERSION, trust_record=True) is not None  # by design
    with pytest.raises(ManifestError, match="rank0.engine has sha256"):
        verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)  # COG_TRITON_VERIFY_WEIGHTS=full
    assert not (root / VERIFIED_NAME).exists()
    with pytest.raises(ManifestError, match="rank0.engine has sha256"):  # nothing vouches any more
        verify_weights(root, gpus(2), TENSORRT_LLM_VERSION, trust_record=True)


def test_a_record_for_another_manifest_is_ignored(tmp_path: Path) -> None:
    root = _verified_engine(tmp_path)
    verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    rewritten = manifest_for(root, world=2, triton_image="other-image")  # manifest.json rewritten
    assert VERIFIED_NAME not in {f.path for f in rewritten.files}
    again = verify_weights(root, gpus(2), TENSORRT_LLM_VERSION, trust_record=True)
    assert again is not None and again.files.trusted_files == 0
    assert again.files.hashed_files == len(rewritten.files)


def test_a_record_never_comes_from_an_archive(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _verified_engine(tmp_path)
    verify_weights(root, gpus(2), TENSORRT_LLM_VERSION)
    forged = (root / VERIFIED_NAME).read_bytes()
    _flip_byte_keep_mtime(root / "rank1.engine")  # the record (from before) now vouches for altered bytes
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:  # pack_archive leaves the record out; a hand-made tar need not
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
    with tarfile.open(archive) as tar:
        assert VERIFIED_NAME in tar.getnames() and tar.extractfile(VERIFIED_NAME).read() == forged  # type: ignore[union-attr]
    target = tmp_path / "w"
    with caplog.at_level("WARNING"):
        fetch_weights(str(archive), target)
    assert f"skipping '{VERIFIED_NAME}'" in caplog.text
    assert not (target / VERIFIED_NAME).exists()  # dropped while unpacking
    with pytest.raises(ManifestError, match="rank1.engine has sha256"):
        verify_weights(target, gpus(2), TENSORRT_LLM_VERSION, trust_record=True)


def test_setup_sequence_full_check_after_a_fetch_then_trusted_reuse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _verified_engine(tmp_path)
    archive = tmp_path / "a.tar"
    pack_archive(root, archive, gzip=False)
    target = tmp_path / "w"
    assert not fetch_weights(str(archive), target).skipped
    first = verify_weights(target, gpus(2), TENSORRT_LLM_VERSION)  # after a fetch: full
    assert first is not None and first.files.trusted_files == 0 and (target / VERIFIED_NAME).is_file()
    with caplog.at_level("WARNING"):
        assert fetch_weights(str(archive), target).skipped  # the record does not disturb the marker's check
        reused = verify_weights(target, gpus(2), TENSORRT_LLM_VERSION, trust_record=True)
    assert reused is not None and reused.files.hashed_bytes == 0
    assert reused.files.trusted_files == len(reused.manifest.files)
    assert VERIFIED_NAME not in caplog.text  # not reported as a file the manifest does not list


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_setup_trusts_the_record_only_for_reused_weights_in_fast_mode(tmp_path: Path, mode: str) -> None:
    from cog_triton.worker.facts import verify as verify_in
    from cog_triton.settings import Settings

    root = tmp_path / "ckpt"  # a reference-backend checkpoint: no GPU needed to verify it
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"weights " * 1000)
    write_manifest(root, name="tiny", backend="reference", build_config={})
    settings = Settings(verify_weights=mode)

    def verify(root: Path, reused: bool = False):
        return verify_in(root, [], settings, reused)

    assert verify(root) is not None  # just fetched: full check, writes the record
    _flip_byte_keep_mtime(root / "model.safetensors")
    if mode == "fast":
        assert verify(root, reused=True) is not None  # unchanged size and mtime: trusted
    else:
        with pytest.raises(ManifestError, match="model.safetensors has sha256"):
            verify(root, reused=True)
    with pytest.raises(ManifestError, match="model.safetensors has sha256"):
        verify(root, reused=False)  # a fresh fetch is always hashed in full


def test_an_ngc_build_suffix_is_the_same_release(tmp_path: Path) -> None:
    """NGC images report suffixed versions (25.11 reported 1.0.3.2510): the release is compared."""
    root = make_engine(tmp_path / "e")
    manifest_for(root)
    assert verify_weights(root, gpus(1), f"{TENSORRT_LLM_VERSION}.2602") is not None
    with pytest.raises(IncompatibleWeightsError) as info:
        verify_weights(root, gpus(1), "1.0.3.2510")
    assert "this image serves TensorRT-LLM 1.0.3.2510 (release 1.0.3)" in str(info.value)


def _manifest(backend: str, build_config: dict[str, Any]) -> Manifest:
    return Manifest(name="m", backend=backend, kind="hf_checkpoint", tensorrt_llm_version=None,
                    triton_image=TRITON_IMAGE, world_size=1, tp_size=1, pp_size=1, gpu_name=None,
                    compute_capability=None, build_config=build_config, files=())


@pytest.mark.parametrize("checkpoint, expected", [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ("./models/smollm2", ""), ("/models/org/name", ""), ("~/org/name", ""), ("smollm2", ""), ("", ""),
])
def test_base_model_is_the_hub_id_an_archive_was_built_from(checkpoint: str, expected: str) -> None:
    """The LoRA refusals name the base model: a Hub id from the build config's source, never a local path."""
    assert base_model_of(_manifest("reference", {"source": {"checkpoint": checkpoint}})) == expected
    assert base_model_of(_manifest("tensorrtllm", {"source": "not a mapping"})) == ""
    assert base_model_of(None) == ""


def test_reference_lora_is_read_from_a_reference_archives_build_config_only() -> None:
    section = {"max_lora_rank": 8, "lora_target_modules": ["attn_q"]}
    built = {"lora": section, "source": {"checkpoint": "org/base"}}
    assert reference_lora(_manifest("reference", built)) == {"reference_lora": section, "base_model": "org/base"}
    assert reference_lora(_manifest("reference", {"lora": "on"})) == {"reference_lora": None, "base_model": ""}
    assert reference_lora(_manifest("tensorrtllm", built)) == {}  # an engine's LoRA is in its own config.json
    assert reference_lora(None) == {}
