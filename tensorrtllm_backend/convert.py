"""Checkpoint steps of ``scripts/build_engine``, run as subprocesses inside the GPU image.

``python3 -m tensorrtllm_backend.convert <command> ...`` with commands:

* ``download``: ``huggingface_hub.snapshot_download`` of a Hub id (weights as safetensors, configs,
  tokenizer files) into ``--output-dir``; ``HF_TOKEN`` is read from the environment when set.
* ``checkpoint``: Hugging Face folder -> TensorRT-LLM checkpoint with the in-wheel API, one call
  per rank: ``MODEL_MAP[architecture].from_hugging_face(model_dir, dtype=..., mapping=Mapping(
  world_size=..., rank=..., tp_size=..., pp_size=...), quant_config=QuantConfig(quant_algo=...))``
  then ``save_checkpoint(output_dir, save_config=rank == 0)``. Weight-only int8/int4 quantization
  (W8A16/W4A16) happens here, without calibration.
* ``quantize``: ModelOpt calibration and export with
  ``tensorrt_llm.quantization.quantize_and_export(**kwargs)`` (fp8, int4_awq, w4a8_awq, int8_sq,
  nvfp4, and KV-cache fp8/int8).
* ``xgrammar-info``: the tokenizer info file the C++ backend's guided decoding reads
  (``xgrammar_tokenizer_info_path``), made as TensorRT-LLM's ``examples/generate_xgrammar_tokenizer_info.py``
  makes it: ``AutoTokenizer.from_pretrained`` then ``tensorrt_llm.llmapi.tokenizer._xgrammar_tokenizer_info``,
  dumped as JSON (keys ``encoded_vocab``, ``tokenizer_str``, ``stop_token_ids``). A tokenizer that
  function does not support, or one it describes without ``tokenizer_str`` (tiktoken; the backend
  reads that key unconditionally), gets no file and a warning: the engine then serves without
  structured output.

Interface source: TensorRT-LLM 1.1.0; for 1.2.1 the nearest stored ``quantize_and_export`` and
``_xgrammar_tokenizer_info`` are unchanged (docs/engines.md), and the signature check below runs in the image
(``tensorrt_llm/models/__init__.py`` MODEL_MAP,
``tensorrt_llm/mapping.py`` — tp_size/pp_size are keyword-only —,
``tensorrt_llm/models/modeling_utils.py`` QuantConfig/save_checkpoint,
``tensorrt_llm/quantization/quantize_by_modelopt.py``). TensorRT-LLM needs an NVIDIA GPU, so on a
machine without one these functions are exercised against a recording stand-in of the
``tensorrt_llm`` package (tests/fake_tensorrt_llm), never the real one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from common.errors import BuildError, CogTritonError

log = logging.getLogger("build_engine.convert")

HUB_ALLOW_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken")
QFORMATS = ("fp8", "int4_awq", "w4a8_awq", "int8_sq", "nvfp4", "full_prec")
TOKENIZER_MAX_SEQ_LENGTH = 2048


def architecture_of(model_dir: Path) -> str:
    """``architectures[0]`` of ``model_dir/config.json``.

    Raises:
        BuildError: no config.json, not JSON, or no ``architectures`` list.
    """
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"cannot read {path}: {exc}; is {model_dir} a Hugging Face checkpoint folder?") from None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not architectures or not isinstance(architectures, list):
        raise BuildError(f"{path} has no 'architectures' list: cannot tell which TensorRT-LLM model class to use")
    return str(architectures[0])


def download(repo_id: str, output_dir: Path, revision: Optional[str] = None) -> Path:
    """Download ``repo_id`` at ``revision`` into ``output_dir``; return the folder.

    Raises:
        BuildError: the download failed (gated model without HF_TOKEN, unknown id, network).
    """
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - only needed for Hub sources

    started = time.monotonic()
    try:
        path = snapshot_download(
            repo_id=repo_id,
            revision=revision,
            local_dir=str(output_dir),
            allow_patterns=list(HUB_ALLOW_PATTERNS),
            token=os.environ.get("HF_TOKEN") or None,
        )
    except Exception as exc:  # noqa: BLE001 - huggingface_hub raises many kinds; all mean "no checkpoint"
        raise BuildError(
            f"could not download {repo_id}{'@' + revision if revision else ''} from the Hugging Face Hub: {exc}. "
            "Gated models (Llama, Gemma) need their license accepted on the Hub and HF_TOKEN set"
        ) from None
    log.info("downloaded %s to %s in %.1f s", repo_id, path, time.monotonic() - started)
    return Path(path)


def convert_checkpoint(
    model_dir: Path,
    output_dir: Path,
    *,
    dtype: str,
    tp_size: int,
    pp_size: int,
    quant_algo: Optional[str] = None,
) -> int:
    """Convert a Hugging Face folder to a TensorRT-LLM checkpoint (one ``rank<N>.safetensors`` per rank).

    Args:
        dtype: "float16", "bfloat16" or "float32".
        quant_algo: a ``QuantAlgo`` member name for weight-only quantization ("W8A16", "W4A16"), or None.

    Returns:
        The world size (number of rank files written).

    Raises:
        BuildError: the architecture has no TensorRT-LLM model class, or TensorRT-LLM is missing.
    """
    try:
        from tensorrt_llm import Mapping  # noqa: PLC0415 - GPU image only
        from tensorrt_llm.models import MODEL_MAP  # noqa: PLC0415
        from tensorrt_llm.models.modeling_utils import QuantConfig  # noqa: PLC0415
        from tensorrt_llm.quantization import QuantAlgo  # noqa: PLC0415
    except ImportError as exc:
        raise BuildError(f"TensorRT-LLM is not importable ({exc}): run inside the image built from our Dockerfile") from None
    architecture = architecture_of(model_dir)
    model_class = MODEL_MAP.get(architecture)
    if model_class is None:
        raise BuildError(
            f"architecture {architecture} (from {model_dir / 'config.json'}) has no TensorRT-LLM model class; "
            f"supported: {', '.join(sorted(MODEL_MAP))}"
        )
    quant_config = QuantConfig(quant_algo=QuantAlgo[quant_algo]) if quant_algo else QuantConfig()
    world_size = tp_size * pp_size
    output_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world_size):
        started = time.monotonic()
        mapping = Mapping(world_size=world_size, rank=rank, tp_size=tp_size, pp_size=pp_size)
        model = model_class.from_hugging_face(str(model_dir), dtype=dtype, mapping=mapping, quant_config=quant_config)
        model.save_checkpoint(str(output_dir), save_config=rank == 0)
        del model
        log.info("rank %d/%d converted (%s) in %.1f s", rank + 1, world_size, architecture, time.monotonic() - started)
    return world_size


def quantize(
    model_dir: Path,
    output_dir: Path,
    *,
    dtype: str,
    tp_size: int,
    pp_size: int,
    qformat: str,
    kv_cache_dtype: Optional[str],
    calib_dataset: str,
    calib_size: int,
    batch_size: int,
    calib_max_seq_length: int,
    awq_block_size: int,
    seed: int,
) -> None:
    """Calibrate with ModelOpt and export a quantized TensorRT-LLM checkpoint.

    Raises:
        BuildError: TensorRT-LLM is missing, or its ``quantize_and_export`` lacks a parameter we
            pass / needs one we do not (another TensorRT-LLM version than the pinned one).
    """
    try:
        from tensorrt_llm.quantization import quantize_and_export  # noqa: PLC0415 - GPU image only
    except ImportError as exc:
        raise BuildError(f"TensorRT-LLM is not importable ({exc}): run inside the image built from our Dockerfile") from None
    kwargs: dict[str, Any] = {
        "model_dir": str(model_dir),
        "device": "cuda",
        "calib_dataset": calib_dataset,
        "dtype": dtype,
        "qformat": qformat,
        "kv_cache_dtype": kv_cache_dtype,
        "calib_size": calib_size,
        "batch_size": batch_size,
        "calib_max_seq_length": calib_max_seq_length,
        "awq_block_size": awq_block_size,
        "output_dir": str(output_dir),
        "tp_size": tp_size,
        "pp_size": pp_size,
        "cp_size": 1,
        "seed": seed,
        "tokenizer_max_seq_length": TOKENIZER_MAX_SEQ_LENGTH,
    }
    parameters = inspect.signature(quantize_and_export).parameters
    unknown = [k for k in kwargs if k not in parameters]
    missing = [
        name
        for name, p in parameters.items()
        if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD and name not in kwargs
    ]
    if unknown or missing:
        raise BuildError(
            "tensorrt_llm.quantization.quantize_and_export has another signature than TensorRT-LLM 1.1.0's and 1.2.1's "
            f"(unknown: {', '.join(unknown) or 'none'}; missing: {', '.join(missing) or 'none'}): "
            "build inside the image built from our Dockerfile"
        )
    started = time.monotonic()
    quantize_and_export(**kwargs)
    log.info("quantized to %s (kv cache %s) in %.1f s", qformat, kv_cache_dtype or "unquantized", time.monotonic() - started)


def xgrammar_tokenizer_info(tokenizer_dir: Path, output: Path) -> bool:
    """Write TensorRT-LLM's xgrammar tokenizer info for the tokenizer in ``tokenizer_dir`` to ``output``.

    Returns:
        True when written; False (with a warning) when the tokenizer is not one guided decoding supports.

    Raises:
        BuildError: TensorRT-LLM is missing.
    """
    try:
        from tensorrt_llm.llmapi.tokenizer import _xgrammar_tokenizer_info  # noqa: PLC0415 - GPU image only
    except ImportError as exc:
        raise BuildError(
            f"TensorRT-LLM is not importable ({exc}): run inside the image built from our Dockerfile"
        ) from None
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    try:
        info = _xgrammar_tokenizer_info(tokenizer)
    except ValueError as exc:  # "Unsupported tokenizer type: ..."
        log.warning("no xgrammar tokenizer info (%s): the engine will serve without structured output", exc)
        return False
    missing = [key for key in ("encoded_vocab", "tokenizer_str", "stop_token_ids") if key not in info]
    if missing:
        log.warning(
            "the xgrammar tokenizer info lacks %s, which TensorRT-LLM's C++ backend reads unconditionally: "
            "the engine will serve without structured output",
            ", ".join(missing),
        )
        return False
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(info))
    log.info("wrote %s (%d tokens, stop tokens %s)", output, len(info["encoded_vocab"]), info["stop_token_ids"])
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python3 -m tensorrtllm_backend.convert")
    sub = parser.add_subparsers(dest="command", required=True)
    dl = sub.add_parser("download", help="download a Hugging Face Hub checkpoint")
    dl.add_argument("--repo-id", required=True)
    dl.add_argument("--revision", default=None)
    dl.add_argument("--output-dir", type=Path, required=True)
    xg = sub.add_parser("xgrammar-info", help="write the xgrammar tokenizer info file (guided decoding)")
    xg.add_argument("--tokenizer-dir", type=Path, required=True)
    xg.add_argument("--output", type=Path, required=True)
    for name in ("checkpoint", "quantize"):
        p = sub.add_parser(name)
        p.add_argument("--model-dir", type=Path, required=True)
        p.add_argument("--output-dir", type=Path, required=True)
        p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), required=True)
        p.add_argument("--tp-size", type=int, default=1)
        p.add_argument("--pp-size", type=int, default=1)
        if name == "checkpoint":
            p.add_argument("--quant-algo", choices=("W8A16", "W4A16"), default=None)
        else:
            p.add_argument("--qformat", choices=QFORMATS, required=True)
            p.add_argument("--kv-cache-dtype", choices=("fp8", "int8"), default=None)
            p.add_argument("--calib-dataset", default="cnn_dailymail")
            p.add_argument("--calib-size", type=int, default=512)
            p.add_argument("--batch-size", type=int, default=1)
            p.add_argument("--calib-max-seq-length", type=int, default=512)
            p.add_argument("--awq-block-size", type=int, default=128)
            p.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.command == "download":
            download(args.repo_id, args.output_dir, args.revision)
        elif args.command == "xgrammar-info":
            xgrammar_tokenizer_info(args.tokenizer_dir, args.output)
        elif args.command == "checkpoint":
            convert_checkpoint(
                args.model_dir,
                args.output_dir,
                dtype=args.dtype,
                tp_size=args.tp_size,
                pp_size=args.pp_size,
                quant_algo=args.quant_algo,
            )
        else:
            quantize(
                args.model_dir,
                args.output_dir,
                dtype=args.dtype,
                tp_size=args.tp_size,
                pp_size=args.pp_size,
                qformat=args.qformat,
                kv_cache_dtype=args.kv_cache_dtype,
                calib_dataset=args.calib_dataset,
                calib_size=args.calib_size,
                batch_size=args.batch_size,
                calib_max_seq_length=args.calib_max_seq_length,
                awq_block_size=args.awq_block_size,
                seed=args.seed,
            )
    except CogTritonError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
