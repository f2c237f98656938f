"""Rendering the PyTorch-backend ``tensorrt_llm`` model (tensorrtllm_backend/templates.py, RenderOptions.llm_args).

A Hugging Face checkpoint with LLM arguments renders ``triton_model_repo/tensorrt_llm_pytorch`` as
``tensorrt_llm``: its model.py and modules (the reference model's parsing.py, lora.py and triton_glue.py as files,
not links), ``1/llm_args.json`` holding the arguments, the ensemble with a ``lora_path`` input mapped to it, and
the same tensors as the other ``tensorrt_llm`` models so that the ensemble's maps hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import TemplateError
from tensorrtllm_backend.templates import (
    LLM_ARGS_FILE,
    RenderOptions,
    fill_template,
    guided_decoding_of,
    parse_model_config,
    render_model_repository,
    template_values,
)
from tests.test_templates import TEMPLATE_DIR, checkpoint_info, engine_info, options, read_rendered

ARGS = {"model": "/weights/checkpoint", "max_batch_size": 16, "kv_cache_config": {"free_gpu_memory_fraction": 0.8}}


def test_a_checkpoint_with_llm_args_is_served_by_the_pytorch_model(tmp_path: Path) -> None:
    opts = options(tmp_path, llm_args=ARGS)
    returned = render_model_repository(opts, checkpoint_info(tmp_path))
    live = opts.model_repo_dir / "tensorrt_llm" / "1"
    assert json.loads((live / LLM_ARGS_FILE).read_text()) == ARGS
    assert sorted(p.name for p in live.iterdir()) == ["adapters.py", "llm_args.json", "lora.py", "model.py", "parsing.py",
                                                      "samplers.py", "translate.py", "triton_glue.py"]
    for module in ("parsing.py", "lora.py", "triton_glue.py"):  # kept once, in the reference model's folder
        assert not (live / module).is_symlink()
        assert (live / module).read_text() == (TEMPLATE_DIR / "tensorrt_llm_reference" / "1" / module).read_text()
    samplers = Path(__file__).resolve().parents[1] / "tensorrtllm_backend" / "samplers.py"
    assert not (live / "samplers.py").is_symlink() and (live / "samplers.py").read_text() == samplers.read_text()
    assert "class TritonPythonModel" in (live / "model.py").read_text()
    for module in ("model.py", "translate.py", "adapters.py"):  # the model's own
        assert (live / module).read_text() == (TEMPLATE_DIR / "tensorrt_llm_pytorch" / "1" / module).read_text()
    config = read_rendered(opts.model_repo_dir)["tensorrt_llm"]
    assert config == returned["tensorrt_llm"] and config.backend == "python"
    assert config.model_transaction_policy.decoupled
    assert {key: value.string_value for key, value in config.parameters.items()} == {
        "exclude_input_in_output": "true", "images": "false"}  # empty parameters dropped: the model's defaults
    with_images = render_model_repository(options(tmp_path / "images", llm_args=ARGS, images=True),
                                          checkpoint_info(tmp_path))["tensorrt_llm"]
    assert with_images.parameters["images"].string_value == "true"


def test_the_ensemble_gets_lora_path_only_with_the_pytorch_model(tmp_path: Path) -> None:
    pytorch = render_model_repository(options(tmp_path / "a", llm_args=ARGS), checkpoint_info(tmp_path))
    ensemble = pytorch["ensemble_ids"]
    (lora_path,) = [t for t in ensemble.input if t.name == "lora_path"]
    assert lora_path.optional and list(lora_path.dims) == [1]
    (step,) = [s for s in ensemble.ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    assert step.input_map["lora_path"] == "lora_path"
    declared = {t.name for t in pytorch["tensorrt_llm"].input}
    assert set(step.input_map) <= declared
    assert {t.name for t in pytorch["tensorrt_llm"].output} >= set(step.output_map)
    reference = render_model_repository(options(tmp_path / "b"), checkpoint_info(tmp_path))
    assert "lora_path" not in {t.name for t in reference["ensemble_ids"].input}
    assert not (tmp_path / "b" / "model_repository" / "tensorrt_llm" / "1" / LLM_ARGS_FILE).exists()


def test_the_pytorch_model_has_the_reference_models_tensors_plus_its_own() -> None:
    """One contract: every input and output of the CPU reference model (the C++ backend's subset), same types; plus
    its own optional inputs (lora_path, stream_interval_ms, and text_input with image_bytes for images: a client that
    sends none gets the C++ contract) and the two outputs of an image request."""
    values = template_values(RenderOptions(template_dir=TEMPLATE_DIR, model_repo_dir=Path("/x"), llm_args=ARGS),
                             checkpoint_info(Path("/w")))
    configs = {}
    for folder in ("tensorrt_llm_reference", "tensorrt_llm_pytorch"):
        text = (TEMPLATE_DIR / folder / "config.pbtxt").read_text()
        configs[folder] = parse_model_config(fill_template(text, values[folder], source=folder), source=folder)
    reference, pytorch = configs["tensorrt_llm_reference"], configs["tensorrt_llm_pytorch"]
    own = {"lora_path", "stream_interval_ms", "text_input", "image_bytes"}
    assert {t.name: t for t in pytorch.input if t.name not in own} == {t.name: t for t in reference.input}
    assert all(t.optional for t in pytorch.input if t.name in own) and own <= {t.name for t in pytorch.input}
    assert list(pytorch.output)[:len(reference.output)] == list(reference.output)
    assert [t.name for t in pytorch.output][len(reference.output):] == ["prompt_tokens", "image_tokens"]
    assert pytorch.max_batch_size == reference.max_batch_size


def test_guided_decoding_follows_the_llm_args(tmp_path: Path) -> None:
    on = render_model_repository(options(tmp_path / "on", llm_args={**ARGS, "guided_decoding_backend": "xgrammar"}),
                                 checkpoint_info(tmp_path))
    off = render_model_repository(options(tmp_path / "off", llm_args=ARGS), checkpoint_info(tmp_path))
    assert guided_decoding_of(on["tensorrt_llm"]) and not guided_decoding_of(off["tensorrt_llm"])


@pytest.mark.parametrize("llm_args, text", [
    ({"max_batch_size": 4}, "must be a mapping with a 'model'"),
    ({"model": "/w", "speculative_config": float("nan")}, "must be JSON values"),
    ({"model": Path("/w")}, "must be JSON values"),
])
def test_bad_llm_args_fail_and_keep_the_previous_repository(tmp_path: Path, llm_args, text) -> None:
    opts = options(tmp_path, llm_args=ARGS)
    render_model_repository(opts, checkpoint_info(tmp_path))
    with pytest.raises(TemplateError, match=text):
        render_model_repository(options(tmp_path, llm_args=llm_args), checkpoint_info(tmp_path))
    assert json.loads((opts.model_repo_dir / "tensorrt_llm" / "1" / LLM_ARGS_FILE).read_text()) == ARGS


def test_llm_args_with_an_engine_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="holds a TensorRT-LLM engine, which the C\\+\\+ backend serves"):
        render_model_repository(options(tmp_path, llm_args=ARGS), engine_info(tmp_path))


def test_the_ensemble_forwards_the_pytorch_models_own_inputs_once(tmp_path: Path) -> None:
    """lora_path and stream_interval_ms go into the ensemble (optional, mapped to tensorrt_llm) because the rendered
    PyTorch-backend model declares them, once; never for the C++ backend's or the reference model."""
    from tensorrtllm_backend.templates import forward_model_inputs, takes_stream_interval

    rendered = render_model_repository(options(tmp_path / "p", llm_args=ARGS), checkpoint_info(tmp_path))
    ensemble = rendered["ensemble_ids"]
    declared = {t.name: t for t in ensemble.input}
    assert declared["stream_interval_ms"].optional and declared["stream_interval_ms"].data_type == \
        rendered["tensorrt_llm"].input[[t.name for t in rendered["tensorrt_llm"].input].index("stream_interval_ms")].data_type
    (step,) = [s for s in ensemble.ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    assert step.input_map["stream_interval_ms"] == "stream_interval_ms" and takes_stream_interval(rendered["tensorrt_llm"])
    count = len(ensemble.input)
    forward_model_inputs(ensemble, rendered["tensorrt_llm"])
    assert len(ensemble.input) == count and [t.name for t in ensemble.input].count("lora_path") == 1
    for info in (checkpoint_info(tmp_path), engine_info(tmp_path)):
        other = render_model_repository(options(tmp_path / "r"), info)
        assert not {"lora_path", "stream_interval_ms"} & {t.name for t in other["ensemble_ids"].input}
        assert not takes_stream_interval(other["tensorrt_llm"])
    del ensemble.input[:]
    for step in ensemble.ensemble_scheduling.step:
        step.model_name = "other"
    with pytest.raises(TemplateError, match="no tensorrt_llm step to map lora_path to"):
        forward_model_inputs(ensemble, rendered["tensorrt_llm"])


def test_the_render_log_names_the_backend(tmp_path: Path, caplog) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="tensorrtllm_backend.templates"):
        render_model_repository(options(tmp_path / "p", llm_args=ARGS), checkpoint_info(tmp_path))
        render_model_repository(options(tmp_path / "r"), checkpoint_info(tmp_path))
    assert "(TensorRT-LLM PyTorch (LLM API) backend)" in caplog.text and "(CPU reference backend)" in caplog.text
