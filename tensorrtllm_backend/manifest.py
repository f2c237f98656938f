"""``manifest.json``: what a weights archive holds, what built it, and where it can run.

Written by ``scripts/build_engine`` at the archive's top level beside the engine (or checkpoint)::

    {
      "format_version": 1,
      "name": "llama-3-8b-instruct-bf16",
      "backend": "tensorrtllm",              # or "reference" (CPU reference backend)
      "kind": "engine",                      # or "hf_checkpoint"
      "tensorrt_llm_version": "1.2.1",       # null for the reference backend
      "triton_image": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
      "world_size": 1, "tp_size": 1, "pp_size": 1,
      "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},   # null: no GPU needed
      "build_config": {...},                 # the validated YAML build config
      "created_at": "2026-11-21T08:00:00Z",
      "files": [{"path": "rank0.engine", "size": 16060000000, "sha256": "..."}, ...]
    }

``files`` lists every file of the archive except ``manifest.json`` itself, with POSIX paths
relative to the archive root, sizes in bytes and lowercase hex sha256.

:func:`verify_weights` runs in ``setup()`` before Triton starts and fails, naming both values and
the fix, on: a missing, resized or altered file (:class:`ManifestError`); an engine from another
TensorRT-LLM version, fewer visible GPUs than the world size, or a GPU of another compute
capability (:class:`IncompatibleWeightsError`).

Every successful hash of the listed files is recorded beside manifest.json in
:data:`~common.files.VERIFIED_NAME` (each file's size, mtime in ns and sha256, keyed to the
manifest's own sha256). With ``trust_record`` (a setup that reuses weights it fetched and checked
before), files whose size and mtime still equal the record's are not read again; any other file
is hashed. A full check removes the record first and writes it again only when every file
matched, so the record never vouches for bytes that were not hashed.

Why one module: one file format and what it guarantees: the manifest's schema,
writing it with the archive, reading it, and verifying an unpacked archive against it (files, the
verification record that saves re-hashing, the TensorRT-LLM version, GPUs); each part reads the others'
types.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Optional

from common.errors import IncompatibleWeightsError, ManifestError
from common.files import KEEP_NAMES, MARKER_NAME, VERIFIED_NAME, sha256_file
from tensorrtllm_backend.engine import WeightsInfo
from tensorrtllm_backend.gpus import GPU, describe
from tensorrtllm_backend.pins import (
    TENSORRT_LLM_VERSION,
    TRITON_IMAGE,
    describe_version,
    installed_tensorrt_llm_version,
    release_name,
    same_release,
)

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
BACKENDS = ("tensorrtllm", "reference", "pytorch")
KINDS = {"tensorrtllm": "engine", "reference": "hf_checkpoint", "pytorch": "hf_checkpoint"}
HASH_CHUNK_BYTES = 8 * 1024 * 1024
# Files that may sit beside the archive's contents without being listed (fetch_weights' marker,
# the verification record).
IGNORED_NAMES = frozenset({MARKER_NAME, VERIFIED_NAME}) | KEEP_NAMES
RECORD_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    """One packed file: POSIX ``path`` relative to the archive root, ``size`` in bytes, hex ``sha256``."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The parsed ``manifest.json`` (see the module docstring for the format)."""

    name: str
    backend: str
    kind: str
    tensorrt_llm_version: Optional[str]
    triton_image: str
    world_size: int
    tp_size: int
    pp_size: int
    gpu_name: Optional[str]
    compute_capability: Optional[str]
    build_config: dict[str, Any]
    files: tuple[FileEntry, ...]
    created_at: str = ""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        """The JSON document written as ``manifest.json``."""
        return {
            "format_version": self.format_version,
            "name": self.name,
            "backend": self.backend,
            "kind": self.kind,
            "tensorrt_llm_version": self.tensorrt_llm_version,
            "triton_image": self.triton_image,
            "world_size": self.world_size,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            "gpu": None
            if self.compute_capability is None
            else {"name": self.gpu_name, "compute_capability": self.compute_capability},
            "build_config": self.build_config,
            "created_at": self.created_at,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> "Manifest":
        """Parse and check a manifest document.

        Raises:
            ManifestError: not an object, a newer format version, or a missing/mistyped field.
        """
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: must hold a JSON object")
        version = data.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ManifestError(f"{where}: format_version must be a positive integer, got {version!r}")
        if version > FORMAT_VERSION:
            raise ManifestError(
                f"{where}: format_version {version} is newer than this image understands ({FORMAT_VERSION}); "
                "update cog-triton or repackage with this version's scripts/build_engine"
            )

        def get(key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
            value = data.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
                raise ManifestError(f"{where}: {key} is missing or of the wrong type (got {value!r})")
            return value

        backend = get("backend", str)
        if backend not in BACKENDS:
            raise ManifestError(f"{where}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
        gpu = get("gpu", dict, optional=True) or {}
        cap = gpu.get("compute_capability")
        if cap is not None and not _valid_capability(cap):
            raise ManifestError(f"{where}: gpu.compute_capability must look like '9.0', got {cap!r}")
        entries = []
        for item in get("files", list):
            if not isinstance(item, dict):
                raise ManifestError(f"{where}: files entries must be objects, got {item!r}")
            path, size, digest = item.get("path"), item.get("size"), item.get("sha256")
            if not isinstance(path, str) or not _safe_relative(path):
                raise ManifestError(f"{where}: file path {path!r} must be relative, without '..'")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ManifestError(f"{where}: size of {path} must be a non-negative integer, got {size!r}")
            if not isinstance(digest, str) or len(digest) != 64:
                raise ManifestError(f"{where}: sha256 of {path} must be 64 hex characters, got {digest!r}")
            entries.append(FileEntry(path, size, digest.lower()))
        world, tp, pp = get("world_size", int), get("tp_size", int), get("pp_size", int)
        if min(world, tp, pp) < 1 or world != tp * pp:
            raise ManifestError(f"{where}: world_size {world} must equal tp_size {tp} * pp_size {pp}, all positive")
        return cls(
            name=get("name", str),
            backend=backend,
            kind=get("kind", str),
            tensorrt_llm_version=get("tensorrt_llm_version", str, optional=True),
            triton_image=get("triton_image", str),
            world_size=world,
            tp_size=tp,
            pp_size=pp,
            gpu_name=gpu.get("name"),
            compute_capability=cap,
            build_config=get("build_config", dict),
            files=tuple(entries),
            created_at=str(data.get("created_at", "")),
            format_version=version,
        )


def _valid_capability(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    major, dot, minor = value.partition(".")
    return major.isdigit() and dot == "." and minor.isdigit()


def _safe_relative(path: str) -> bool:
    pure = PurePosixPath(path)
    return bool(path) and not pure.is_absolute() and ".." not in pure.parts and "\\" not in path


def _walk(root: Path) -> list[str]:
    """Every regular file under ``root`` as a sorted POSIX relative path (manifest and marker excluded)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            rel = Path(dirpath, name).relative_to(root).as_posix()
            if rel == MANIFEST_NAME or name in IGNORED_NAMES or name.startswith(VERIFIED_NAME + "."):
                continue
            found.append(rel)
    return sorted(found)


def _hash_all(root: Path, paths: Iterable[str]) -> dict[str, tuple[str, int]]:
    """sha256 and size of each path, hashed on a few threads (hashlib releases the GIL)."""
    paths = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(paths)))) as pool:
        results = pool.map(lambda p: sha256_file(root / p, HASH_CHUNK_BYTES), paths)
        return dict(zip(paths, results))


def write_manifest(
    root: Path,
    *,
    name: str,
    backend: str,
    build_config: dict[str, Any],
    world_size: int = 1,
    tp_size: int = 1,
    pp_size: int = 1,
    gpu: Optional[GPU] = None,
    tensorrt_llm_version: Optional[str] = None,
    triton_image: str = TRITON_IMAGE,
) -> Manifest:
    """Hash every file under ``root`` and write ``root/manifest.json``; return the manifest.

    Args:
        root: the folder that becomes the archive (engine or checkpoint plus tokenizer).
        backend: "tensorrtllm" (needs ``tensorrt_llm_version`` and ``gpu``), "reference" or "pytorch" (a
            checkpoint packed as it is).
        gpu: the GPU the engine was built on (its compute capability is recorded).

    Raises:
        ValueError: unknown backend, or an engine without TensorRT-LLM version or GPU.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "tensorrtllm" and (tensorrt_llm_version is None or gpu is None):
        raise ValueError("an engine manifest needs the TensorRT-LLM version and the GPU it was built on")
    started = time.monotonic()
    hashed = _hash_all(root, _walk(root))
    manifest = Manifest(
        name=name,
        backend=backend,
        kind=KINDS[backend],
        tensorrt_llm_version=tensorrt_llm_version,
        triton_image=triton_image,
        world_size=world_size,
        tp_size=tp_size,
        pp_size=pp_size,
        gpu_name=gpu.name if gpu else None,
        compute_capability=gpu.compute_capability if gpu else None,
        build_config=build_config,
        files=tuple(FileEntry(p, size, digest) for p, (digest, size) in hashed.items()),
        created_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    (root / MANIFEST_NAME).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    total = sum(f.size for f in manifest.files)
    log.info("manifest: %d files, %.1f MB hashed in %.1f s", len(manifest.files), total / 1e6, time.monotonic() - started)
    return manifest


def pack_archive(root: Path, archive: Path, *, gzip: bool = True) -> tuple[str, int]:
    """Pack the contents of ``root`` (no top-level folder) into ``archive``; write ``<archive>.sha256``.

    ``gzip`` uses compression level 1 (weights barely compress; higher levels only cost time).
    Written to a temporary name and renamed, so a failed pack leaves no partial archive.

    Returns:
        (hex sha256, size in bytes) of the archive.
    """
    tmp = archive.with_name(archive.name + ".partial")
    mode = "w:gz" if gzip else "w"
    kwargs: dict[str, Any] = {"compresslevel": 1} if gzip else {}
    started = time.monotonic()
    archive.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tmp, mode, format=tarfile.PAX_FORMAT, **kwargs) as tar:
            for item in sorted(root.iterdir()):
                if item.name in IGNORED_NAMES:
                    continue
                tar.add(item, arcname=item.name, filter=_normalize_member)
        digest, size = sha256_file(tmp, HASH_CHUNK_BYTES)
        tmp.replace(archive)
    finally:
        tmp.unlink(missing_ok=True)
    archive.with_name(archive.name + ".sha256").write_text(f"{digest}  {archive.name}\n")
    log.info("packed %s: %.1f MB in %.1f s, sha256 %s", archive, size / 1e6, time.monotonic() - started, digest)
    return digest, size


def _normalize_member(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Archive members owned by root:root with plain permissions, whoever built them."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() else 0o644
    return info


def read_manifest(root: Path) -> Optional[Manifest]:
    """The manifest in ``root``, or None when there is none.

    Raises:
        ManifestError: the file exists but is not valid JSON or not a valid manifest.
    """
    path = root / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path} is not readable JSON: {exc}; the archive is damaged, download or package it again") from None
    return Manifest.from_json(data, str(path))


def base_model_of(manifest: Optional[Manifest]) -> str:
    """The Hugging Face Hub id the archive was built from (its build config's ``source.checkpoint``, e.g.
    ``HuggingFaceTB/SmolLM2-135M-Instruct``), or "" when there is no manifest or it was built from a local folder
    (a path: ``./``, ``/``, ``~`` or no ``/``)."""
    source = (manifest.build_config.get("source") or {}) if manifest is not None else {}
    checkpoint = str(source.get("checkpoint", "")) if isinstance(source, dict) else ""
    return checkpoint if "/" in checkpoint and not checkpoint.startswith((".", "/", "~")) else ""


def reference_lora(manifest: Optional[Manifest]) -> dict[str, Any]:
    """For a checkpoint archive: the ``lora`` section of its build config (manifest.json) and what it was made
    from, as :func:`tensorrtllm_backend.engine.inspect_weights` takes them (``reference_lora``, ``base_model``)."""
    if manifest is None or manifest.backend != "reference":
        return {}
    lora = manifest.build_config.get("lora")
    return {"reference_lora": lora if isinstance(lora, dict) else None, "base_model": base_model_of(manifest)}


def runtime_tensorrt_llm_version() -> str:
    """The TensorRT-LLM version this image serves: the installed ``tensorrt_llm`` package, else the pin."""
    return installed_tensorrt_llm_version() or TENSORRT_LLM_VERSION


@dataclass(frozen=True)
class FileCheck:
    """What :func:`check_files` read: files and bytes hashed, and files trusted from the record."""

    hashed_files: int = 0
    hashed_bytes: int = 0
    trusted_files: int = 0


def _manifest_sha256(root: Path) -> Optional[str]:
    try:
        return hashlib.sha256((root / MANIFEST_NAME).read_bytes()).hexdigest()
    except OSError:
        return None


def _read_record(root: Path, manifest_sha256: str) -> dict[str, Any]:
    """The record's files (path -> size, mtime_ns, sha256), or {} when it is missing, unreadable or
    was written for another manifest."""
    try:
        data = json.loads((root / VERIFIED_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        return {}
    files = data.get("files")
    if data.get("manifest_sha256") != manifest_sha256 or not isinstance(files, dict):
        return {}
    return files


def _remove_record(root: Path) -> None:
    try:
        (root / VERIFIED_NAME).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", root / VERIFIED_NAME, exc)


def _write_record(root: Path, manifest_sha256: str, files: dict[str, Any]) -> None:
    """Write the record atomically (temporary file, then rename); a read-only folder only costs a warning."""
    path = root / VERIFIED_NAME
    tmp = root / f"{VERIFIED_NAME}.{os.getpid()}.tmp"
    document = {"version": RECORD_VERSION, "manifest_sha256": manifest_sha256, "files": files}
    try:
        tmp.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.warning("could not write %s (%s): the next setup hashes the weights again", path, exc)


def _same_record(known: Any, st: os.stat_result, sha256: str) -> bool:
    return (
        isinstance(known, dict)
        and known.get("size") == st.st_size
        and known.get("mtime_ns") == st.st_mtime_ns
        and known.get("sha256") == sha256
    )


def check_files(root: Path, manifest: Manifest, *, trust_record: bool = False) -> FileCheck:
    """Check that every listed file exists with its size and sha256.

    Args:
        trust_record: skip hashing the files whose size and modification time (ns) equal those in
            the verification record of an earlier successful check (:data:`VERIFIED_NAME`, for
            this same manifest.json). False: hash every file, whatever the record says.

    Returns:
        How many files (and bytes) were hashed, and how many were trusted from the record. After
        a successful check the record lists every file hashed now or trusted; after a failed one
        there is no record.

    Raises:
        ManifestError: listing every missing, resized or altered file (expected vs found).
    """
    manifest_sha256 = _manifest_sha256(root)
    record = _read_record(root, manifest_sha256) if trust_record and manifest_sha256 else {}
    if not trust_record:
        _remove_record(root)  # a full check vouches anew, or not at all
    problems = []
    to_hash: list[FileEntry] = []
    seen: dict[str, os.stat_result] = {}
    kept: dict[str, Any] = {}
    for entry in manifest.files:
        path = root / entry.path
        try:
            st = path.stat()
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            problems.append(f"{entry.path} is missing")
            continue
        if st.st_size != entry.size:
            problems.append(f"{entry.path} has {st.st_size} bytes, the manifest says {entry.size}")
            continue
        seen[entry.path] = st
        if _same_record(record.get(entry.path), st, entry.sha256):
            kept[entry.path] = record[entry.path]
        else:
            to_hash.append(entry)
    hashed = _hash_all(root, [e.path for e in to_hash])
    for entry in to_hash:
        digest, _ = hashed[entry.path]
        if digest != entry.sha256:
            problems.append(f"{entry.path} has sha256 {digest}, the manifest says {entry.sha256}")
    if problems:
        if trust_record:  # (a full check removed it already)
            _remove_record(root)
        raise ManifestError(
            f"weights in {root} do not match {MANIFEST_NAME}: " + "; ".join(problems)
            + ". The archive was damaged or altered: download it again, or rebuild it with scripts/build_engine"
        )
    listed = {e.path for e in manifest.files}
    extra = [p for p in _walk(root) if p not in listed]
    if extra:
        log.warning("files not listed in %s (ignored by verification): %s", MANIFEST_NAME, ", ".join(extra[:20]))
    if manifest_sha256 is not None and (to_hash or set(kept) != set(record)):
        files = dict(kept)
        for entry in to_hash:
            before = seen[entry.path]
            try:
                after = (root / entry.path).stat()
            except OSError:
                continue
            if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):  # unchanged while hashed
                files[entry.path] = {"size": after.st_size, "mtime_ns": after.st_mtime_ns, "sha256": entry.sha256}
        _write_record(root, manifest_sha256, files)
    result = FileCheck(hashed_files=len(to_hash), hashed_bytes=sum(e.size for e in to_hash), trusted_files=len(kept))
    log.info("checked %d files against %s: %d hashed (%d bytes), %d unchanged since the last full check",
             len(manifest.files), MANIFEST_NAME, result.hashed_files, result.hashed_bytes, result.trusted_files)
    return result


def check_engine_runs_here(
    name: str,
    *,
    built_with: Optional[str],
    built_image: Optional[str],
    world_size: int,
    tp_size: int,
    pp_size: int,
    compute_capability: Optional[str],
    built_on: Optional[str],
    gpus: list[GPU],
    runtime_version: str,
) -> None:
    """Check that an engine can run on this machine with this image.

    Args:
        built_with: TensorRT-LLM version that built the engine (None: unknown, not checked).
        compute_capability: "major.minor" of the build GPU (None: unknown, not checked).
        gpus: the visible GPUs (see :func:`tensorrtllm_backend.gpus.visible_gpus`).
        runtime_version: the TensorRT-LLM version this image serves.

    Raises:
        IncompatibleWeightsError: another TensorRT-LLM version; fewer GPUs than the world size; a
            GPU of another compute capability. The message names both values and the fix.
    """
    if built_with is not None and not same_release(built_with, runtime_version):
        raise IncompatibleWeightsError(
            f"engine {name!r} was built with TensorRT-LLM {describe_version(built_with)}"
            f"{f' ({built_image})' if built_image else ''}, but this image serves TensorRT-LLM "
            f"{describe_version(runtime_version)} "
            f"({TRITON_IMAGE}); engines only load in the version that built them: rebuild it with TensorRT-LLM "
            f"{release_name(runtime_version)} (scripts/build_engine inside this image, FROM {TRITON_IMAGE}, or "
            f"cog train), or serve it with an image that ships TensorRT-LLM {built_with}"
        )
    if len(gpus) < world_size:
        raise IncompatibleWeightsError(
            f"engine {name!r} has world size {world_size} (tp_size {tp_size} x pp_size {pp_size}) and needs "
            f"{world_size} GPU{'s' if world_size != 1 else ''}, but {describe(gpus)} "
            f"{'is' if len(gpus) <= 1 else 'are'} visible: run it on a machine with {world_size} GPUs "
            f"(check CUDA_VISIBLE_DEVICES), or rebuild it with tp_size * pp_size = {max(len(gpus), 1)}"
        )
    if compute_capability is None:
        return
    for gpu in gpus[:world_size]:
        if gpu.compute_capability != compute_capability:
            raise IncompatibleWeightsError(
                f"engine {name!r} was built on {built_on or 'a GPU'} with compute capability {compute_capability}, "
                f"but GPU {gpu.index} ({gpu.name}) has compute capability {gpu.compute_capability}; TensorRT "
                f"engines only run on the GPU architecture they were built for: rebuild it with scripts/build_engine "
                f"on a GPU of compute capability {gpu.compute_capability}, or serve it on a GPU of compute "
                f"capability {compute_capability}"
            )


def check_compatibility(manifest: Manifest, gpus: list[GPU], runtime_version: str) -> None:
    """Check that this machine can run the archive described by ``manifest``.

    Checkpoint archives (reference and pytorch backends) are not tied to a TensorRT-LLM build or GPU (what the
    PyTorch backend needs is checked at setup: tensorrtllm_backend.checkpoint); engines go through
    :func:`check_engine_runs_here`.

    Raises:
        IncompatibleWeightsError: see :func:`check_engine_runs_here`.
    """
    if manifest.kind == "hf_checkpoint":
        return
    check_engine_runs_here(
        manifest.name,
        built_with=manifest.tensorrt_llm_version,
        built_image=manifest.triton_image,
        world_size=manifest.world_size,
        tp_size=manifest.tp_size,
        pp_size=manifest.pp_size,
        compute_capability=manifest.compute_capability,
        built_on=manifest.gpu_name,
        gpus=gpus,
        runtime_version=runtime_version,
    )


def check_weights_match(
    info: WeightsInfo, manifest: Optional[Manifest], gpus: list[GPU], runtime_version: Optional[str] = None
) -> None:
    """Cross-check the inspected weights against their manifest, and an engine against this machine.

    With a manifest: its kind and world size must equal what ``config.json`` says, and an
    engine's ``version`` must equal the manifest's TensorRT-LLM version. Without one, an engine's
    own ``version`` and world size are still checked against this image and the visible GPUs.

    Raises:
        ManifestError: the manifest disagrees with the weights it ships with.
        IncompatibleWeightsError: see :func:`check_engine_runs_here`.
    """
    runtime_version = runtime_version or runtime_tensorrt_llm_version()
    if manifest is not None:
        where = f"{info.weights_dir / MANIFEST_NAME}"
        if manifest.kind != info.kind:
            raise ManifestError(f"{where} says kind {manifest.kind}, but the weights are of kind {info.kind}")
        if manifest.world_size != info.world_size:
            raise ManifestError(
                f"{where} says world size {manifest.world_size}, but the engine's config.json says {info.world_size}"
            )
        if info.kind == "engine" and info.trtllm_version != manifest.tensorrt_llm_version:
            raise ManifestError(
                f"{where} says TensorRT-LLM {manifest.tensorrt_llm_version}, but the engine's config.json says "
                f"{info.trtllm_version}"
            )
        return
    if info.kind == "engine":
        check_engine_runs_here(
            info.weights_dir.name,
            built_with=info.trtllm_version,
            built_image=None,
            world_size=info.world_size,
            tp_size=info.tp_size,
            pp_size=info.pp_size,
            compute_capability=None,
            built_on=None,
            gpus=gpus,
            runtime_version=runtime_version,
        )


@dataclass
class Verification:
    """Result of :func:`verify_weights`: the manifest, the seconds spent checking, and what was read
    (see :class:`FileCheck`)."""

    manifest: Manifest
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    files: FileCheck = field(default_factory=FileCheck)


def verify_weights(
    root: Path, gpus: list[GPU], runtime_version: Optional[str] = None, *, trust_record: bool = False
) -> Optional[Verification]:
    """Verify the unpacked weights in ``root`` against their ``manifest.json``.

    Compatibility (cheap) is checked before the files (hashing reads every byte).

    Args:
        trust_record: for weights reused as they were (not fetched just now): files unchanged in
            size and modification time since the last successful check are not hashed again
            (see :func:`check_files`). False (a fetch just happened, or a full check was asked
            for): every file is hashed.

    Returns:
        None when ``root`` has no manifest (nothing to verify), else the :class:`Verification`.

    Raises:
        ManifestError: unreadable manifest; missing, resized or altered files.
        IncompatibleWeightsError: see :func:`check_compatibility`.
    """
    manifest = read_manifest(root)
    if manifest is None:
        return None
    started = time.monotonic()
    check_compatibility(manifest, gpus, runtime_version or runtime_tensorrt_llm_version())
    files = check_files(root, manifest, trust_record=trust_record)
    return Verification(manifest=manifest, seconds=time.monotonic() - started, files=files)
